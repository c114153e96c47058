//! The fault matrix: every fault × mutex, read/write lock and semaphore, with contenders that
//! record what they believe and write through a fenced resource (`distlock-faults`).
//!
//! Each cell runs three contenders (each its own session, each behind its own fault proxy) that
//! acquire, write with their fencing token while the guard is not lost, and release, while a
//! fault is injected into whoever holds. Afterwards the cell checks the fenced resource (no
//! overlapping believed holds, no stale write accepted) and the server (no node left behind).
//! A paused holder (SIGSTOP, in a child process) is the one fault no lock can cover: there the
//! table shows the fence rejecting its stale writes, and an unfenced run of the same cell shows
//! the checker catching the violation.
//!
//! Size: `DISTLOCK_MATRIX_FAULTS` faults per cell (default 2). `matrix_single_server` uses the
//! server of `DISTLOCK_TEST_ZK`; `DISTLOCK_TEST_ZK_DIR` (the `scripts/zk.sh` directory) adds the
//! server crash-and-restart cells. `matrix_ensemble` runs when `DISTLOCK_TEST_ENSEMBLE_DIR` names
//! a running `scripts/zk-ensemble.sh` ensemble. Results go to stdout and to
//! `DISTLOCK_MATRIX_OUT` (default `.tmp/fault-matrix`), one Markdown table per server.

mod common;

use common::*;
use distlock::zookeeper::{Client, LockState};
use distlock::Error;
use distlock_faults::{mono_now, Fault, FaultProxy, FencedResource, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::io::AsyncBufReadExt;

const SESSION: &str = "2s";
const CONTENDERS: usize = 3;
/// How long a contender holds; it writes every `WRITE_EVERY` meanwhile.
const HOLD: Duration = Duration::from_millis(150);
const WRITE_EVERY: Duration = Duration::from_millis(20);
/// Gap between faults, so the lock moves on between them.
const GAP: Duration = Duration::from_millis(700);
const BOUND: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recipe {
    Mutex,
    RwLock,
    Semaphore,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::RwLock => "rwlock",
            Recipe::Semaphore => "semaphore(2)",
        }
    }

    fn permits(self) -> usize {
        if self == Recipe::Semaphore {
            2
        } else {
            1
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    None,
    /// A silent partition of the holder shorter than its session (1 s).
    BlackholeShort,
    /// A silent partition of the holder longer than its session (3 s).
    BlackholeLong,
    /// The holder's connections reset and reconnection refused for 0.5 s.
    Reset,
    /// One reply to the holder lost (applied on the server, never delivered), with a reset.
    LostReply,
    /// 300 ms added to every reply to the holder for 2 s.
    Delay,
    /// The holder (a child process) stopped for 3 s (longer than its session), then resumed.
    Pause {
        fenced: bool,
    },
    /// The holder (a child process) killed.
    Kill,
    /// The server killed and restarted (Apache ZooKeeper keeps sessions across restarts).
    ServerRestart,
    /// Ensemble: the leader killed, restarted 3 s later.
    KillLeader,
    /// Ensemble: a follower stopped for 4 s (isolated from everyone, silently), then resumed.
    IsolateFollower,
}

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::None => "no fault".into(),
            Scenario::BlackholeShort => "holder partitioned 1 s (silent)".into(),
            Scenario::BlackholeLong => "holder partitioned 3 s > session (silent)".into(),
            Scenario::Reset => "holder reset, reconnect refused 0.5 s".into(),
            Scenario::LostReply => "holder loses one reply".into(),
            Scenario::Delay => "holder's replies delayed 300 ms".into(),
            Scenario::Pause { fenced: true } => "holder paused 3 s (SIGSTOP), fenced".into(),
            Scenario::Pause { fenced: false } => "holder paused 3 s (SIGSTOP), unfenced".into(),
            Scenario::Kill => "holder killed (SIGKILL)".into(),
            Scenario::ServerRestart => "server killed and restarted".into(),
            Scenario::KillLeader => "leader killed, restarted".into(),
            Scenario::IsolateFollower => "follower isolated 4 s (SIGSTOP)".into(),
        }
    }

    /// Whether a contender runs in a child process (the fault acts on the process).
    fn needs_child(self) -> bool {
        matches!(self, Scenario::Pause { .. } | Scenario::Kill)
    }
}

/// One row of the results table.
#[derive(Debug)]
struct Row {
    scenario: String,
    recipe: &'static str,
    acquisitions: usize,
    faults: usize,
    overlaps: usize,
    stale_accepted: usize,
    stale_rejected: usize,
    leaked: usize,
    recovery_ms: u64,
    losses: usize,
}

fn faults_per_cell() -> usize {
    std::env::var("DISTLOCK_MATRIX_FAULTS").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

/// What the contenders share with the fault injector.
struct Shared {
    resource: Arc<FencedResource>,
    /// Per contender: holding now?
    holding: Vec<AtomicBool>,
    /// mono_now() of every grant.
    grants: StdMutex<Vec<u64>>,
    stop: AtomicBool,
    losses: AtomicUsize,
    seq: AtomicU64,
}

impl Shared {
    fn holder(&self) -> Option<usize> {
        (0..self.holding.len()).find(|&i| self.holding[i].load(Ordering::SeqCst))
    }
}

/// Runs one in-process contender until `stop`: acquire, write while not lost, release.
async fn contender(
    id: usize,
    recipe: Recipe,
    path: String,
    proxy: Option<Arc<FaultProxy>>,
    direct: String,
    shared: Arc<Shared>,
) {
    let url = match &proxy {
        Some(p) => format!("zk://{}?session_timeout={SESSION}", p.addr()),
        None => direct,
    };
    let mut client: Option<Client> = None;
    let mut round = 0usize;
    while !shared.stop.load(Ordering::SeqCst) {
        round += 1;
        let c = match &client {
            Some(c) => c.clone(),
            None => match Client::connect(&url).await {
                Ok(c) => {
                    client = Some(c.clone());
                    c
                }
                Err(_) => {
                    // The server or the path to it is down: try again shortly.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        // Readers and writers alternate on the read/write lock (contender 0 always writes).
        let shared_mode = recipe == Recipe::RwLock && id != 0 && round % 2 == 0;
        let acquired = acquire(&c, recipe, &path, shared_mode).await;
        let guard = match acquired {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(Error::SessionExpired) | Err(Error::Closed) => {
                client = None;
                continue;
            }
            Err(e) => {
                tracing::info!(id, error = %e, "acquire failed; retrying");
                client = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.token();
        let mode = if shared_mode { Mode::Shared } else { Mode::Exclusive };
        let hold = shared.resource.begin(id, mode, token);
        shared.grants.lock().unwrap().push(mono_now());
        shared.holding[id].store(true, Ordering::SeqCst);
        let lost = guard.lost();
        let work = async {
            let until = tokio::time::Instant::now() + HOLD;
            while tokio::time::Instant::now() < until {
                // A careful holder checks before each write; the fence covers what a check cannot.
                if guard.state().is_lost() {
                    return;
                }
                if mode == Mode::Exclusive && recipe != Recipe::Semaphore {
                    shared.resource.write(id, token, shared.seq.fetch_add(1, Ordering::SeqCst));
                }
                tokio::time::sleep(WRITE_EVERY).await;
            }
        };
        let was_lost = tokio::select! {
            _ = work => guard.state().is_lost(),
            _ = lost => true,
        };
        shared.holding[id].store(false, Ordering::SeqCst);
        shared.resource.end(hold);
        if was_lost {
            shared.losses.fetch_add(1, Ordering::SeqCst);
            drop(guard);
            continue;
        }
        // Release errors (a loss found at release) are counted, not fatal.
        if guard.release().await.is_err() {
            shared.losses.fetch_add(1, Ordering::SeqCst);
        }
    }
    if let Some(c) = client {
        c.close(Duration::from_secs(2)).await;
    }
}

/// A held lock of any of the three recipes.
enum Held {
    Mutex(distlock::zookeeper::MutexGuard),
    Read(distlock::zookeeper::ReadGuard),
    Write(distlock::zookeeper::WriteGuard),
    Permit(distlock::zookeeper::SemaphorePermit),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Mutex(g) => g.fencing_token(),
            Held::Read(g) => g.fencing_token(),
            Held::Write(g) => g.fencing_token(),
            Held::Permit(g) => g.fencing_token(),
        }
    }

    fn state(&self) -> LockState {
        match self {
            Held::Mutex(g) => g.state(),
            Held::Read(g) => g.state(),
            Held::Write(g) => g.state(),
            Held::Permit(g) => g.state(),
        }
    }

    fn lost(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = distlock::LostReason> + Send>> {
        match self {
            Held::Mutex(g) => Box::pin(g.lost()),
            Held::Read(g) => Box::pin(g.lost()),
            Held::Write(g) => Box::pin(g.lost()),
            Held::Permit(g) => Box::pin(g.lost()),
        }
    }

    async fn release(self) -> distlock::Result<()> {
        match self {
            Held::Mutex(g) => g.release().await,
            Held::Read(g) => g.release().await,
            Held::Write(g) => g.release().await,
            Held::Permit(g) => g.release().await,
        }
    }
}

async fn acquire(c: &Client, recipe: Recipe, path: &str, shared_mode: bool) -> distlock::Result<Option<Held>> {
    let wait = Duration::from_secs(5);
    Ok(match recipe {
        Recipe::Mutex => c.mutex(path)?.lock_timeout(wait).await?.map(Held::Mutex),
        Recipe::RwLock if shared_mode => c.rwlock(path)?.read_timeout(wait).await?.map(Held::Read),
        Recipe::RwLock => c.rwlock(path)?.write_timeout(wait).await?.map(Held::Write),
        Recipe::Semaphore => c.semaphore(path, 2)?.acquire_timeout(1, wait).await?.map(Held::Permit),
    })
}

/// The child process side of the pause and kill cells: holds a mutex in cycles and reports on
/// stdout (`HELD token start_ns`, `WRITE token seq`, `END start_ns end_ns`). Run by the parent
/// through this test binary; does nothing when started by hand.
#[test]
#[ignore = "run by the fault matrix as a child process"]
fn child_holder() {
    let (Ok(url), Ok(path)) = (std::env::var("DISTLOCK_CHILD_URL"), std::env::var("DISTLOCK_CHILD_PATH")) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let mut out = std::io::stdout();
        let mut seq = 0u64;
        let mut client: Option<Client> = None;
        loop {
            let c = match &client {
                Some(c) => c.clone(),
                None => match Client::connect(&url).await {
                    Ok(c) => client.insert(c).clone(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            let guard = match c.mutex(&path).unwrap().lock_timeout(Duration::from_secs(5)).await {
                Ok(Some(g)) => g,
                Ok(None) => continue,
                Err(_) => {
                    // After a pause longer than the session: a new session.
                    client = None;
                    continue;
                }
            };
            let token = guard.fencing_token();
            let start = mono_now();
            say(&mut out, &format!("HELD {token} {start}"));
            // Hold long enough to be paused while holding.
            let until = tokio::time::Instant::now() + Duration::from_millis(1500);
            while tokio::time::Instant::now() < until && !guard.state().is_lost() {
                // The work between the check and the write: a pause here makes a stale write.
                tokio::time::sleep(WRITE_EVERY).await;
                seq += 1;
                say(&mut out, &format!("WRITE {token} {seq}"));
            }
            say(&mut out, &format!("END {start} {}", mono_now()));
            drop(guard);
        }
    });
}

fn say(out: &mut std::io::Stdout, line: &str) {
    use std::io::Write;
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Starts the child holder and feeds its reports into the shared state as contender `id`.
async fn spawn_child(id: usize, url: String, path: String, shared: Arc<Shared>) -> (u32, tokio::process::Child) {
    let exe = std::env::current_exe().unwrap();
    let mut child = tokio::process::Command::new(exe)
        .args(["--exact", "child_holder", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("DISTLOCK_CHILD_URL", url)
        .env("DISTLOCK_CHILD_PATH", path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn child holder");
    let pid = child.id().unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut open: Option<(u64, u64)> = None;
        while let Ok(Some(line)) = lines.next_line().await {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["HELD", token, start] => {
                    let (token, start) = (token.parse().unwrap(), start.parse().unwrap());
                    open = Some((token, start));
                    shared.grants.lock().unwrap().push(start);
                    shared.holding[id].store(true, Ordering::SeqCst);
                }
                ["WRITE", token, seq] => {
                    shared.resource.write(id, token.parse().unwrap(), seq.parse().unwrap());
                }
                ["END", _, end] => {
                    if let Some((token, start)) = open.take() {
                        shared.resource.record_hold(id, Mode::Exclusive, token, start, end.parse().unwrap());
                    }
                    shared.holding[id].store(false, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        // The child died holding (killed): its belief ended with it.
        if let Some((token, start)) = open {
            shared.resource.record_hold(id, Mode::Exclusive, token, start, mono_now());
            shared.holding[id].store(false, Ordering::SeqCst);
        }
    });
    (pid, child)
}

/// How the cell reaches the server(s).
#[derive(Clone)]
enum Target {
    /// One server at `addr`; `dir` is its scripts/zk.sh directory when it can be restarted.
    Single { addr: String, dir: Option<String> },
    /// The ensemble of scripts/zk-ensemble.sh in `dir`, reached by `connect`.
    Ensemble { connect: String, dir: String },
}

impl Target {
    fn direct_url(&self) -> String {
        match self {
            Target::Single { addr, .. } => format!("zk://{addr}?session_timeout={SESSION}"),
            Target::Ensemble { connect, .. } => format!("zk://{connect}?session_timeout={SESSION}"),
        }
    }
}

fn script(args: &[&str]) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = std::process::Command::new("bash")
        .args(args.iter().map(|a| if a.starts_with("scripts/") { format!("{root}/{a}") } else { a.to_string() }))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run script");
    assert!(out.status.success(), "{args:?} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Runs one cell and returns its row.
async fn cell(target: &Target, scenario: Scenario, recipe: Recipe) -> Row {
    let path = unique_path(&format!("matrix-{}", recipe.name().trim_end_matches("(2)")));
    let fenced = !matches!(scenario, Scenario::Pause { fenced: false });
    let shared = Arc::new(Shared {
        resource: FencedResource::new(fenced, recipe.permits()),
        holding: (0..CONTENDERS).map(|_| AtomicBool::new(false)).collect(),
        grants: StdMutex::new(Vec::new()),
        stop: AtomicBool::new(false),
        losses: AtomicUsize::new(0),
        seq: AtomicU64::new(0),
    });
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    let mut child = None;
    for id in 0..CONTENDERS {
        let proxy = match target {
            Target::Single { addr, .. } if scenario != Scenario::ServerRestart => {
                Some(Arc::new(FaultProxy::start(addr.parse().unwrap()).await.unwrap()))
            }
            _ => None,
        };
        proxies.push(proxy.clone());
        if id == 0 && scenario.needs_child() {
            let url = match &proxy {
                Some(p) => format!("zk://{}?session_timeout={SESSION}", p.addr()),
                None => target.direct_url(),
            };
            child = Some(spawn_child(id, url, path.clone(), shared.clone()).await);
            continue;
        }
        tasks.push(tokio::spawn(contender(id, recipe, path.clone(), proxy, target.direct_url(), shared.clone())));
    }
    // Inject the faults.
    let faults = faults_per_cell();
    let mut fault_starts = Vec::new();
    let mut injected = 0;
    for _ in 0..faults {
        tokio::time::sleep(GAP).await;
        let victim = if scenario.needs_child() {
            // Wait (bounded) until the child holds.
            let deadline = tokio::time::Instant::now() + BOUND;
            while !shared.holding[0].load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            0
        } else {
            shared.holder().unwrap_or(0)
        };
        fault_starts.push(mono_now());
        injected += 1;
        let proxy = proxies[victim].clone();
        match scenario {
            Scenario::None => {}
            Scenario::BlackholeShort | Scenario::BlackholeLong => {
                let p = proxy.unwrap();
                p.set(Fault::Blackhole);
                let d = if scenario == Scenario::BlackholeShort { 1000 } else { 3000 };
                tokio::time::sleep(Duration::from_millis(d)).await;
                p.heal();
            }
            Scenario::Reset => {
                let p = proxy.unwrap();
                p.set(Fault::RefuseNew);
                p.reset_all();
                tokio::time::sleep(Duration::from_millis(500)).await;
                p.heal();
            }
            Scenario::LostReply => proxy.unwrap().lose_next_reply(distlock_faults::zk_reply),
            Scenario::Delay => {
                let p = proxy.unwrap();
                p.set(Fault::Delay { to_client: Duration::from_millis(300), to_upstream: Duration::ZERO });
                tokio::time::sleep(Duration::from_secs(2)).await;
                p.heal();
            }
            Scenario::Pause { .. } => {
                let pid = child.as_ref().unwrap().0;
                distlock_faults::pause(pid).unwrap();
                tokio::time::sleep(Duration::from_secs(3)).await;
                distlock_faults::resume(pid).unwrap();
            }
            Scenario::Kill => {
                let (pid, c) = child.take().unwrap();
                distlock_faults::kill(pid).unwrap();
                drop(c);
                // A new child takes its place for the next fault.
                let url = match &proxies[0] {
                    Some(p) => format!("zk://{}?session_timeout={SESSION}", p.addr()),
                    None => target.direct_url(),
                };
                child = Some(spawn_child(0, url, path.clone(), shared.clone()).await);
            }
            Scenario::ServerRestart => {
                let Target::Single { dir: Some(dir), .. } = target else { unreachable!() };
                script(&["scripts/zk.sh", "kill", dir]);
                tokio::time::sleep(Duration::from_millis(500)).await;
                script(&["scripts/zk.sh", "restart", dir]);
            }
            Scenario::KillLeader => {
                let Target::Ensemble { dir, .. } = target else { unreachable!() };
                let leader = script(&["scripts/zk-ensemble.sh", "leader", dir]);
                script(&["scripts/zk-ensemble.sh", "kill", dir, &leader]);
                tokio::time::sleep(Duration::from_secs(3)).await;
                script(&["scripts/zk-ensemble.sh", "restart", dir, &leader]);
            }
            Scenario::IsolateFollower => {
                let Target::Ensemble { dir, .. } = target else { unreachable!() };
                let leader = script(&["scripts/zk-ensemble.sh", "leader", dir]);
                let follower = if leader == "1" { "2" } else { "1" };
                script(&["scripts/zk-ensemble.sh", "pause", dir, follower]);
                tokio::time::sleep(Duration::from_secs(4)).await;
                script(&["scripts/zk-ensemble.sh", "resume", dir, follower]);
            }
        }
    }
    // Let the lock move on after the last fault, then stop everyone.
    tokio::time::sleep(GAP * 2).await;
    shared.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.expect("contender stops").unwrap();
    }
    if let Some((pid, c)) = child.take() {
        distlock_faults::resume(pid).ok();
        distlock_faults::kill(pid).ok();
        drop(c);
    }
    // Nothing may be left on the server once every session has released or ended.
    let observer = Client::connect(&target.direct_url()).await.expect("observer connects");
    let leaked = leaked_after(&observer, &path, Duration::from_secs(8)).await;
    let grants = shared.grants.lock().unwrap().clone();
    let recovery_ms = fault_starts
        .iter()
        .filter_map(|&f| grants.iter().filter(|&&g| g > f).min().map(|g| (g - f) / 1_000_000))
        .max()
        .unwrap_or(0);
    let report = shared.resource.report();
    Row {
        scenario: scenario.name(),
        recipe: recipe.name(),
        acquisitions: report.holds,
        faults: injected,
        overlaps: report.overlaps.len(),
        stale_accepted: report.stale_accepted,
        stale_rejected: report.stale_rejected,
        leaked,
        recovery_ms,
        losses: shared.losses.load(Ordering::SeqCst),
    }
}

/// Nodes still under `path` (and its semaphore subdirectories) after waiting up to `bound` for
/// sessions that ended to be cleaned up.
async fn leaked_after(observer: &Client, path: &str, bound: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let mut left = 0;
        for dir in [path.to_string(), format!("{path}/leases"), format!("{path}/locks")] {
            left += children(observer, &dir).await.iter().filter(|n| *n != "leases" && *n != "locks").count();
        }
        if left == 0 || tokio::time::Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn table(server: &str, rows: &[Row]) -> String {
    let mut t = format!(
        "### {server}\n\n| scenario | recipe | acquisitions | faults | overlaps | stale writes accepted | stale writes rejected | leaked nodes | losses reported | recovery (ms) |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.scenario,
            r.recipe,
            r.acquisitions,
            r.faults,
            r.overlaps,
            r.stale_accepted,
            r.stale_rejected,
            r.leaked,
            r.losses,
            r.recovery_ms
        );
    }
    t
}

fn write_table(file: &str, text: &str) {
    let dir = std::env::var("DISTLOCK_MATRIX_OUT")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../.tmp/fault-matrix").to_string());
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/{file}"), text).unwrap();
}

/// Checks the rows against the contract; returns the failures.
fn verdicts(rows: &[Row]) -> Vec<String> {
    let mut bad = Vec::new();
    for r in rows {
        let what = format!("{} / {}", r.scenario, r.recipe);
        if r.leaked > 0 {
            bad.push(format!("{what}: {} nodes left behind", r.leaked));
        }
        if r.acquisitions == 0 {
            bad.push(format!("{what}: no acquisition at all"));
        }
        if r.scenario.contains("unfenced") {
            // The checker must catch the paused holder when nothing fences it.
            if r.stale_accepted == 0 && r.overlaps == 0 {
                bad.push(format!("{what}: the unfenced pause went unnoticed (the checker cannot fail?)"));
            }
        } else if r.scenario.contains("paused") {
            if r.stale_accepted > 0 {
                bad.push(format!("{what}: {} stale writes accepted despite fencing", r.stale_accepted));
            }
        } else if r.overlaps > 0 || r.stale_accepted > 0 {
            bad.push(format!("{what}: {} overlaps, {} stale writes accepted", r.overlaps, r.stale_accepted));
        }
    }
    bad
}

async fn run_matrix(server: &str, target: Target, scenarios: &[Scenario]) {
    let mut rows = Vec::new();
    for &scenario in scenarios {
        let recipes: &[Recipe] =
            if scenario.needs_child() { &[Recipe::Mutex] } else { &[Recipe::Mutex, Recipe::RwLock, Recipe::Semaphore] };
        for &recipe in recipes {
            let started = std::time::Instant::now();
            let row = tokio::time::timeout(Duration::from_secs(180), cell(&target, scenario, recipe))
                .await
                .unwrap_or_else(|_| panic!("cell {} / {} did not finish", scenario.name(), recipe.name()));
            println!("{:?} in {:.1?}", row, started.elapsed());
            rows.push(row);
        }
    }
    let text = table(server, &rows);
    println!("{text}");
    write_table(&format!("{}.md", server.replace(' ', "-")), &text);
    let bad = verdicts(&rows);
    assert!(bad.is_empty(), "fault matrix on {server}:\n{}", bad.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_single_server() {
    let addr = zk_addr();
    let dir = std::env::var("DISTLOCK_TEST_ZK_DIR").ok();
    let server = std::env::var("DISTLOCK_TEST_SERVER_NAME").unwrap_or_else(|_| format!("server at {addr}"));
    let mut scenarios = vec![
        Scenario::None,
        Scenario::BlackholeShort,
        Scenario::BlackholeLong,
        Scenario::Reset,
        Scenario::LostReply,
        Scenario::Delay,
        Scenario::Pause { fenced: true },
        Scenario::Pause { fenced: false },
        Scenario::Kill,
    ];
    if dir.is_some() {
        scenarios.push(Scenario::ServerRestart);
    }
    run_matrix(&server, Target::Single { addr, dir }, &scenarios).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matrix_ensemble() {
    let Ok(dir) = std::env::var("DISTLOCK_TEST_ENSEMBLE_DIR") else {
        println!("no ensemble (DISTLOCK_TEST_ENSEMBLE_DIR unset): scripts/test.sh runs this against one");
        return;
    };
    let connect = std::fs::read_to_string(format!("{dir}/ensemble.addr")).expect("ensemble.addr").trim().to_string();
    let scenarios = [Scenario::None, Scenario::KillLeader, Scenario::IsolateFollower];
    run_matrix("Apache ZooKeeper 3-node ensemble", Target::Ensemble { connect, dir }, &scenarios).await;
}
