//! The fault matrix, one for every backend: every fault × every recipe the backend has (mutex,
//! read/write lock, semaphore, and an election's campaign: leading is holding), with contenders that record what they believe and write through
//! a fenced resource (`distlock-faults`). The contenders use only the one API
//! (`distlock::connect(url)`), so the same cells, pass criteria and checker judge every backend.
//!
//! Each cell runs three contenders (each its own client, each behind its own fault proxy on
//! network backends) that acquire, write with their fencing token while the guard is not lost,
//! and release, while a fault is injected into whoever holds. Afterwards the cell checks the
//! fenced resource (no overlapping believed holds, no stale write accepted) and the server
//! (nothing left behind: ZooKeeper's lock directory empty; elsewhere, the lock free again within
//! a lease). A paused holder (SIGSTOP, in a child process) is the one fault no lock can cover:
//! there the table shows the fence rejecting its stale writes, and an unfenced run of the same
//! cell shows the checker catching the violation. A cell that cannot pass on a backend by the
//! backend's nature (a Redis without persistence restarted empty forgets its locks) is judged
//! the same way, and the table says so.
//!
//! Every network backend (and the in-process store) also runs the cells of `many.rs`: one client
//! holding a hundred locks on its one session or few shared connections, partitioned or reset,
//! while a competitor waits for all of them (each lock judged by a fenced resource of its own);
//! SQLite, a file with no connection to cut, runs its analogs: a process holding a hundred locks
//! paused past the lease, or killed.
//!
//! Size: `DISTLOCK_MATRIX_FAULTS` faults per cell (default 2); `DISTLOCK_MATRIX_ONLY=TEXT` runs
//! only the scenarios whose names contain TEXT, `DISTLOCK_MATRIX_RECIPE=TEXT` only the recipes
//! whose names do (`election`).
//!
//! All are ignored unless asked for (`-- --ignored`); scripts/test.sh runs them:
//! - `matrix::zookeeper`, in each ZooKeeper pass when nothing else runs (it restarts the server):
//!   ZooKeeper at `DISTLOCK_TEST_ZK`; `DISTLOCK_TEST_ZK_DIR` (the `scripts/zk.sh` directory) adds
//!   the server crash-and-restart cells.
//! - `matrix_ensemble`: on the running `scripts/zk-ensemble.sh` ensemble that
//!   `DISTLOCK_TEST_ENSEMBLE_DIR` names.
//! - `matrix::redis`, `::postgres`, `::mysql`, `::etcd`, `::sqlite`, `::memory` and
//!   `matrix_over_tls::*`, once, beside each other (and `matrix::redis` again on Valkey when
//!   `DISTLOCK_REDIS_FLAVOUR=valkey`): on the servers of `DISTLOCK_TEST_REDIS`,
//!   `_POSTGRES`, `_MYSQL`, `_ETCD` (and their `_DIR`s for the restart cells); SQLite on a file
//!   of its own; the TLS ones on TLS-only servers of their own (the shared server's variable
//!   must still be set, as for every test per backend, though only its backend is used).
//!
//! Results go to stdout and to `DISTLOCK_MATRIX_OUT` (default `.tmp/fault-matrix`), one Markdown
//! table per server.

mod many;

use crate::common;
use crate::common::backends::on_every_backend;
use many::ManyFault;

use distlock::{Client, Guard};
use distlock_faults::{mono_now, Fault, FaultProxy, FencedResource, Mode};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// The lease in the matrix (ZooKeeper's session timeout), where the backend allows it (the SQL
/// servers' session timeouts count whole seconds from 3 s: `SQL_LEASE`). Faults last a share of
/// it: a short partition half a lease, a long one and a pause one and a half.
const LEASE: &str = "2s";
const SQL_LEASE: &str = "3s";
/// NATS's: its client reconnects with a backoff (up to a tenth of the TTL between tries) and then
/// rewrites every key it holds, each a request; after a reset refused for 0.5 s, a hundred locks
/// on a loaded machine need more of a 2 s lease than is left.
const NATS_LEASE: &str = "3s";
const CONTENDERS: usize = 3;
/// How long a contender holds; it writes every `WRITE_EVERY` meanwhile.
const HOLD: Duration = Duration::from_millis(150);
const WRITE_EVERY: Duration = Duration::from_millis(20);
/// Where a paused holder keeps its lock (PostgreSQL), the longest its hold may overlap the next
/// after it resumes: its last check before the stop to its write after it (`WRITE_EVERY`), and
/// the time a loaded machine takes to run it.
const RESUMED_GAP: Duration = Duration::from_secs(1);
/// The longest a child holder keeps the lock waiting for the parent's word (a bound, should the
/// parent never say it).
const CHILD_HOLD_MAX: Duration = Duration::from_secs(30);
/// How long an in-process contender rests after a release.
const REST: Duration = Duration::from_millis(30);
/// Gap between faults, so the lock moves on between them.
const GAP: Duration = Duration::from_millis(700);
const BOUND: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recipe {
    Mutex,
    RwLock,
    Semaphore,
    /// Candidates of an election: the leader is the holder, its epoch the token.
    Election,
    /// Starts of a scheduled job bounded by the lease (`at_most_for`): the run is the holder,
    /// its record's token the token, and a holder trusts it until `stop_by`.
    Job,
}

impl Recipe {
    fn name(self) -> &'static str {
        match self {
            Recipe::Mutex => "mutex",
            Recipe::RwLock => "rwlock",
            Recipe::Semaphore => "semaphore(2)",
            Recipe::Election => "election",
            Recipe::Job => "job",
        }
    }

    fn by_name(name: &str) -> Recipe {
        [Recipe::Mutex, Recipe::RwLock, Recipe::Semaphore, Recipe::Election, Recipe::Job]
            .into_iter()
            .find(|r| r.name() == name)
            .unwrap_or(Recipe::Mutex)
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
    /// A silent partition of the holder for half its lease.
    BlackholeShort,
    /// A silent partition of the holder for one and a half leases.
    BlackholeLong,
    /// The holder's connections reset and reconnection refused for 0.5 s.
    Reset,
    /// One reply to the holder lost (applied on the server, never delivered), with a reset
    /// (ZooKeeper: the proxy frames its protocol).
    LostReply,
    /// 300 ms added to every reply to the holder for 2 s.
    Delay,
    /// The holder (a child process) stopped for one and a half leases, then resumed.
    Pause {
        fenced: bool,
    },
    /// The holder (a child process) killed.
    Kill,
    /// The server killed and restarted.
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
            Scenario::BlackholeShort => "holder partitioned ½ lease (silent)".into(),
            Scenario::BlackholeLong => "holder partitioned 1½ leases (silent)".into(),
            Scenario::Reset => "holder reset, reconnect refused 0.5 s".into(),
            Scenario::LostReply => "holder loses one reply".into(),
            Scenario::Delay => "holder's replies delayed 300 ms".into(),
            Scenario::Pause { fenced: true } => "holder paused 1½ leases (SIGSTOP), fenced".into(),
            Scenario::Pause { fenced: false } => "holder paused 1½ leases (SIGSTOP), unfenced".into(),
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

    /// Whether the fault needs the contenders behind proxies.
    fn needs_proxy(self) -> bool {
        !matches!(self, Scenario::ServerRestart | Scenario::KillLeader | Scenario::IsolateFollower)
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
    /// The longest overlap, in microseconds (a hold still open counts until the report).
    longest_overlap_us: u64,
    stale_accepted: usize,
    stale_rejected: usize,
    leaked: usize,
    recovery_ms: u64,
    losses: usize,
    /// The cell cannot keep exclusion by the backend's nature: judged by the fence.
    by_nature: bool,
    /// A paused holder keeps the lock on this backend (its connection stays up: nothing to fence).
    pause_holds: bool,
    /// How many of the holder's locks the fault must have lost (0: any number).
    must_lose: usize,
    /// The fault must have lost none (a loss would be false).
    must_keep: bool,
    /// Breaches found by a cell's own checks beyond the fenced resource's (the many-locks cells
    /// with a child holder: a grant before the holder's lease deadline, a token not above the
    /// holder's, more stale writes than a pause can straddle): must be 0.
    violations: Vec<String>,
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
    /// mono_now() just before each SIGKILL of a child holder, by its pid.
    killed_at: StdMutex<std::collections::HashMap<u32, u64>>,
    stop: AtomicBool,
    losses: AtomicUsize,
    seq: AtomicU64,
    /// Per contender: its client, once connected (the in-process store's partition switch).
    clients: StdMutex<Vec<Option<Client>>>,
}

impl Shared {
    fn holder(&self) -> Option<usize> {
        (0..self.holding.len()).find(|&i| self.holding[i].load(Ordering::SeqCst))
    }

    /// Cuts contender `id` off (`cut`) or lets it through again: through its proxies (one per
    /// server it knows), or, on the in-process store, which has no network, by the client's own
    /// switch.
    fn cut(&self, proxies: &[Arc<FaultProxy>], id: usize, cut: bool) {
        match (proxies.is_empty(), cut) {
            (false, true) => proxies.iter().for_each(|p| p.set(Fault::Blackhole)),
            (false, false) => proxies.iter().for_each(|p| p.heal()),
            (true, _) => {
                let clients = self.clients.lock().unwrap();
                let client = clients[id].as_ref().expect("the holder is connected");
                let memory = client.downcast::<distlock::memory::Client>().expect("no proxy: the in-process store");
                if cut {
                    memory.partition()
                } else {
                    memory.heal()
                }
            }
        }
    }
}

/// A backend and how the matrix reaches and hurts it.
#[derive(Clone)]
struct Target {
    /// The server's name in the table.
    server: String,
    /// The backend URL with `{addr}` where the server's address goes (directly or a proxy's);
    /// without it (SQLite), no network faults apply.
    url: String,
    /// The server's own address; a cluster's members' addresses, comma-separated (each
    /// contender then reaches each member through a proxy of its own, and its URL lists them).
    addr: Option<String>,
    /// The script and directory that kill and restart the server.
    restart: Option<(&'static str, String)>,
    /// A ZooKeeper ensemble's `scripts/zk-ensemble.sh` directory.
    ensemble: Option<String>,
    /// A restart loses every lock by the server's nature (Redis without persistence).
    restart_forgets: bool,
    /// The lease in the URL.
    lease: Duration,
    /// A paused holder keeps its lock: the server frees it only when the connection ends, and a
    /// stopped process's kernel keeps the connection up (PostgreSQL's session locks).
    pause_holds: bool,
    /// The lock lives as long as its connection (PostgreSQL, MariaDB): a reset ends it on the
    /// server at the moment it ends for the holder, so the holder cannot be told first; the
    /// overlap is the time the holder takes to see its socket closed, and only the fence covers it.
    connection_bound: bool,
}

/// What a backend does by its nature under some faults (see [`Target`]).
#[derive(Clone, Copy, Default)]
struct Nature {
    restart_forgets: bool,
    pause_holds: bool,
    connection_bound: bool,
}

impl Target {
    fn url_via(&self, addr: &str) -> String {
        self.url.replace("{addr}", addr)
    }

    fn direct_url(&self) -> String {
        self.url_via(self.addr.as_deref().unwrap_or(""))
    }

    fn is_zk(&self) -> bool {
        self.url.starts_with("zk://") || self.url.starts_with("zks://")
    }
}

/// The lock of `recipe` on `name`; `shared` takes the read side of a read/write lock.
fn lock_of(c: &Client, recipe: Recipe, name: &str, shared: bool) -> distlock::Result<distlock::Lock> {
    match recipe {
        Recipe::Mutex => c.mutex(name),
        Recipe::RwLock if shared => c.read_lock(name),
        Recipe::RwLock => c.write_lock(name),
        Recipe::Semaphore => c.semaphore_permit(name, 2),
        Recipe::Election => c.election(name)?.candidate(&format!("candidate of pid {}", std::process::id())),
        // A job name is ShedLock's (64 characters, no '/' on ZooKeeper): the path's unique end.
        Recipe::Job => {
            let flat = name.replace('/', "-");
            let tail: String = flat.chars().skip(flat.chars().count().saturating_sub(60)).collect();
            c.schedule(&format!("job{tail}"))?.at_most_for(c.lease()).lock()
        }
    }
}

/// Runs one in-process contender until `stop`: acquire, write while not lost, release.
async fn contender(id: usize, recipe: Recipe, name: String, url: String, shared: Arc<Shared>, rest: Duration) {
    let mut client: Option<Client> = None;
    let mut round = 0usize;
    while !shared.stop.load(Ordering::SeqCst) {
        round += 1;
        let c = match &client {
            Some(c) => c.clone(),
            None => match distlock::connect(&url).await {
                Ok(c) => {
                    shared.clients.lock().unwrap()[id] = Some(c.clone());
                    client.insert(c).clone()
                }
                Err(_) => {
                    // The server or the path to it is down: try again shortly.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        // Readers and writers alternate on the read/write lock (contender 0 always writes).
        let shared_mode = recipe == Recipe::RwLock && id != 0 && round.is_multiple_of(2);
        let acquired = match lock_of(&c, recipe, &name, shared_mode) {
            Ok(lock) => lock.lock_timeout(Duration::from_secs(5)).await,
            Err(e) => Err(e),
        };
        let guard = match acquired {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(e) => {
                tracing::info!(id, error = %e, "acquire failed; reconnecting");
                // The in-process store's partition is the client's own switch: a new client
                // would slip past it (through a proxy, reconnecting stays cut off).
                if !url.starts_with("memory:") {
                    client = None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let token = guard.fencing_token();
        let mode = if shared_mode { Mode::Shared } else { Mode::Exclusive };
        let hold = shared.resource.begin(id, mode, token);
        shared.grants.lock().unwrap().push(mono_now());
        shared.holding[id].store(true, Ordering::SeqCst);
        let was_lost = hold_and_write(&guard, recipe, mode, |token| {
            shared.resource.write(id, token, shared.seq.fetch_add(1, Ordering::SeqCst));
        })
        .await;
        shared.holding[id].store(false, Ordering::SeqCst);
        shared.resource.end(hold);
        if was_lost {
            shared.losses.fetch_add(1, Ordering::SeqCst);
            println!("contender {id} was told its hold (token {token}) was lost: {:?}", guard.state());
            drop(guard);
            continue;
        }
        // Release errors (a loss found at release) are counted, not fatal.
        match tokio::time::timeout(Duration::from_secs(10), guard.release()).await {
            Ok(Ok(())) => {}
            failed => {
                shared.losses.fetch_add(1, Ordering::SeqCst);
                let why = failed.map_or("no answer within 10 s".to_string(), |r| r.unwrap_err().to_string());
                println!("contender {id}'s release (token {token}) failed: {why}");
            }
        }
        // A rest between holds: on a lock without a queue (Redis wakes every waiter and the
        // quickest wins) the child holder of the pause and kill cells would never get a turn.
        tokio::time::sleep(rest).await;
    }
    if let Some(c) = client {
        c.close(Duration::from_secs(2)).await;
    }
}

/// Holds for `HOLD`, writing with the token every `WRITE_EVERY` while the guard is not lost;
/// true if it was lost.
async fn hold_and_write(guard: &Guard, recipe: Recipe, mode: Mode, write: impl Fn(u64)) -> bool {
    let lost = guard.lost();
    let work = async {
        let until = tokio::time::Instant::now() + HOLD;
        while tokio::time::Instant::now() < until {
            // A careful holder checks before each write; the fence covers what a check cannot.
            if guard.state().is_lost() {
                return;
            }
            if mode == Mode::Exclusive && recipe != Recipe::Semaphore {
                write(guard.fencing_token());
            }
            tokio::time::sleep(WRITE_EVERY).await;
        }
    };
    tokio::select! {
        _ = work => guard.state().is_lost(),
        _ = lost => true,
    }
}

/// The child process side of the pause and kill cells: holds a mutex in cycles and reports on
/// stdout (`HELD token start_ns`, `WRITE token seq`, `END start_ns end_ns`). Each hold lasts
/// until the parent writes a line to its stdin (or the lock is lost, or `CHILD_HOLD_MAX`
/// passed), so the parent's pause or kill surely lands while it holds. Run by the parent through
/// this test binary; does nothing when started by hand.
#[test]
#[ignore = "run by the fault matrix as a child process"]
fn child_holder() {
    let (Ok(url), Ok(name)) = (std::env::var("DISTLOCK_CHILD_URL"), std::env::var("DISTLOCK_CHILD_PATH")) else {
        return;
    };
    let recipe = Recipe::by_name(&std::env::var("DISTLOCK_CHILD_RECIPE").unwrap_or_default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        // The parent's "let go" lines, counted: a hold ends once the count moves past the one
        // seen when it began.
        // Its stdin closed, the parent is done with the cell: the hold ends and the child exits.
        let (let_go, let_go_count) = tokio::sync::watch::channel(0u64);
        let parent_done = Arc::new(AtomicBool::new(false));
        let done = parent_done.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(_)) = lines.next_line().await {
                let_go.send_modify(|n| *n += 1);
            }
            done.store(true, Ordering::SeqCst);
            let_go.send_modify(|n| *n += 1);
        });
        let mut out = std::io::stdout();
        let mut seq = 0u64;
        let mut client: Option<Client> = None;
        while !parent_done.load(Ordering::SeqCst) {
            let c = match &client {
                Some(c) => c.clone(),
                None => match distlock::connect(&url).await {
                    Ok(c) => client.insert(c).clone(),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                },
            };
            let guard = match lock_of(&c, recipe, &name, false).unwrap().lock_timeout(Duration::from_secs(5)).await {
                Ok(Some(g)) => g,
                Ok(None) => continue,
                Err(_) => {
                    // After a pause longer than the lease: a new client.
                    client = None;
                    continue;
                }
            };
            let token = guard.fencing_token();
            let start = mono_now();
            let told = *let_go_count.borrow();
            say(&mut out, &format!("HELD {token} {start}"));
            // Held until the parent says let go (after its pause or instead of a kill).
            let until = tokio::time::Instant::now() + CHILD_HOLD_MAX;
            while tokio::time::Instant::now() < until
                && !guard.state().is_lost()
                && *let_go_count.borrow() == told
                && !parent_done.load(Ordering::SeqCst)
            {
                // The work between the check and the write: a pause here makes a stale write.
                tokio::time::sleep(WRITE_EVERY).await;
                seq += 1;
                say(&mut out, &format!("WRITE {token} {seq}"));
            }
            say(&mut out, &format!("END {start} {}", mono_now()));
            let _ = tokio::time::timeout(Duration::from_secs(10), guard.release()).await;
        }
        if let Some(c) = client {
            c.close(Duration::from_secs(2)).await;
        }
    });
}

/// This test binary run again as a child process, running only the ignored test `test` (its
/// full name), with `envs`; its stdin and stdout piped to us, killed if dropped.
fn spawn_test_child(test: &str, envs: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn the child {test}: {e}"))
}

/// The words of a child holder's report line (`HELD …`, `WRITE …`, `END …`), read from where its
/// first word begins: the test harness starts its own line ("test child_holder ... ") before
/// the first report.
fn report_words(line: &str) -> Vec<&str> {
    let at = ["HELD ", "WRITE ", "END "].iter().filter_map(|w| line.find(w)).min().unwrap_or(0);
    line[at..].split_whitespace().collect()
}

fn say(out: &mut std::io::Stdout, line: &str) {
    use std::io::Write;
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Starts the child holder and feeds its reports into the shared state as contender `id`.
async fn spawn_child(
    id: usize,
    url: String,
    name: String,
    recipe: Recipe,
    shared: Arc<Shared>,
) -> (u32, tokio::process::Child) {
    let test = common::test_name(module_path!(), "child_holder");
    let envs = [
        ("DISTLOCK_CHILD_URL", url.as_str()),
        ("DISTLOCK_CHILD_PATH", &name),
        ("DISTLOCK_CHILD_RECIPE", recipe.name()),
    ];
    let mut child = spawn_test_child(&test, &envs);
    let pid = child.id().unwrap();
    let stdout = child.stdout.take().unwrap();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut open: Option<(u64, u64)> = None;
        while let Ok(Some(line)) = lines.next_line().await {
            let f = report_words(&line);
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
        // The child died holding. Killed, its hold ended at the SIGKILL: it runs nothing after
        // that, and the server frees its lock only once its connection closes, later still. (The
        // end of its output comes later than both, by as long as this task waited to run: on a
        // busy machine a grant on the connection's close came before it.) Otherwise its hold
        // ended with its output.
        let killed = shared.killed_at.lock().unwrap().remove(&pid);
        if let Some((token, start)) = open {
            shared.resource.record_hold(id, Mode::Exclusive, token, start, killed.unwrap_or_else(mono_now));
            shared.holding[id].store(false, Ordering::SeqCst);
        }
    });
    (pid, child)
}

fn script(args: &[&str]) -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let out = std::process::Command::new("bash")
        .args(args.iter().map(|a| if a.starts_with("scripts/") { format!("{root}/{a}") } else { a.to_string() }))
        .output()
        .expect("run script");
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The script that kills, restarts, pauses and names the leader of a cluster's members (by
/// number): ZooKeeper's ensemble's, or NATS's (the leader of the bucket's stream).
fn ensemble_tool(target: &Target) -> &'static str {
    if target.url.starts_with("nats") {
        "scripts/nats.sh"
    } else {
        "scripts/zk-ensemble.sh"
    }
}

/// Runs one cell and returns its row.
async fn cell(target: &Target, scenario: Scenario, recipe: Recipe) -> Row {
    let name = format!(
        "matrix-{}-{}",
        recipe.name().trim_end_matches("(2)"),
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let name = if target.is_zk() { format!("/distlock-test/{name}") } else { name };
    let fenced = !matches!(scenario, Scenario::Pause { fenced: false });
    let shared = Arc::new(Shared {
        resource: FencedResource::new(fenced, recipe.permits()),
        holding: (0..CONTENDERS).map(|_| AtomicBool::new(false)).collect(),
        grants: StdMutex::new(Vec::new()),
        killed_at: StdMutex::default(),
        stop: AtomicBool::new(false),
        losses: AtomicUsize::new(0),
        seq: AtomicU64::new(0),
        clients: StdMutex::new(vec![None; CONTENDERS]),
    });
    let mut proxies = Vec::new();
    let mut urls = Vec::new();
    let mut tasks = Vec::new();
    let mut child = None;
    for id in 0..CONTENDERS {
        let mut mine = Vec::new();
        if let Some(addr) = target.addr.as_ref().filter(|_| scenario.needs_proxy()) {
            for member in addr.split(',') {
                mine.push(Arc::new(FaultProxy::start(member.parse().unwrap()).await.unwrap()));
            }
        }
        let url = if mine.is_empty() {
            target.direct_url()
        } else {
            target.url_via(&mine.iter().map(|p| p.addr().to_string()).collect::<Vec<_>>().join(","))
        };
        proxies.push(mine);
        urls.push(url.clone());
        if id == 0 && scenario.needs_child() {
            child = Some(spawn_child(id, url, name.clone(), recipe, shared.clone()).await);
            continue;
        }
        // Beside a child holder, in-process contenders rest longer, so that it gets its turns.
        let rest = if scenario.needs_child() { REST * 10 } else { REST };
        tasks.push(tokio::spawn(contender(id, recipe, name.clone(), url, shared.clone(), rest)));
    }
    // Inject the faults.
    let mut fault_starts = Vec::new();
    let mut injected = 0;
    for _ in 0..faults_per_cell() {
        tokio::time::sleep(GAP).await;
        let victim = if scenario.needs_child() {
            // Wait (bounded) until the child holds.
            let deadline = tokio::time::Instant::now() + BOUND;
            while !shared.holding[0].load(Ordering::SeqCst) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            0
        } else {
            // Someone who holds (waited for, bounded: the lock may be between holders).
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                match shared.holder() {
                    Some(h) => break h,
                    None if tokio::time::Instant::now() >= deadline => break 0,
                    None => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
        };
        fault_starts.push(mono_now());
        injected += 1;
        let proxy = proxies[victim].clone();
        match scenario {
            Scenario::None => {}
            Scenario::BlackholeShort | Scenario::BlackholeLong => {
                shared.cut(&proxy, victim, true);
                let d = if scenario == Scenario::BlackholeShort { target.lease / 2 } else { target.lease * 3 / 2 };
                tokio::time::sleep(d).await;
                shared.cut(&proxy, victim, false);
            }
            Scenario::Reset => {
                for p in &proxy {
                    p.set(Fault::RefuseNew);
                    p.reset_all();
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                proxy.iter().for_each(|p| p.heal());
            }
            Scenario::LostReply => proxy[0].lose_next_reply(distlock_faults::zk_reply),
            Scenario::Delay => {
                let delay = Fault::Delay { to_client: Duration::from_millis(300), to_upstream: Duration::ZERO };
                proxy.iter().for_each(|p| p.set(delay));
                tokio::time::sleep(Duration::from_secs(2)).await;
                proxy.iter().for_each(|p| p.heal());
            }
            Scenario::Pause { .. } => {
                let pid = child.as_ref().unwrap().0;
                let paused_at = mono_now();
                distlock_faults::pause(pid).unwrap();
                tokio::time::sleep(target.lease * 3 / 2).await;
                if !(target.pause_holds && recipe != Recipe::Job) {
                    // Paused until someone else has the lock (bounded): the checker then has a
                    // stale holder to catch, whatever the machine's load did to the timing.
                    let deadline = tokio::time::Instant::now() + BOUND;
                    while !shared.grants.lock().unwrap().iter().any(|&g| g > paused_at)
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                distlock_faults::resume(pid).unwrap();
                // Resumed, it writes (stale, or fenced off) and learns its loss; then let go.
                tokio::time::sleep(WRITE_EVERY * 5).await;
                let stdin = child.as_mut().unwrap().1.stdin.as_mut().unwrap();
                let _ = stdin.write_all(b"let go\n").await;
                let _ = stdin.flush().await;
            }
            Scenario::Kill => {
                let (pid, c) = child.take().unwrap();
                shared.killed_at.lock().unwrap().insert(pid, mono_now());
                distlock_faults::kill(pid).unwrap();
                drop(c);
                // A new child takes its place for the next fault.
                child = Some(spawn_child(0, urls[0].clone(), name.clone(), recipe, shared.clone()).await);
            }
            Scenario::ServerRestart => {
                let (tool, dir) = target.restart.as_ref().expect("a restartable server");
                script(&[tool, "kill", dir]);
                tokio::time::sleep(Duration::from_millis(500)).await;
                script(&[tool, "restart", dir]);
            }
            Scenario::KillLeader => {
                let (dir, tool) = (target.ensemble.as_ref().unwrap(), ensemble_tool(target));
                let leader = script(&[tool, "leader", dir]);
                script(&[tool, "kill", dir, &leader]);
                tokio::time::sleep(Duration::from_secs(3)).await;
                script(&[tool, "restart", dir, &leader]);
            }
            Scenario::IsolateFollower => {
                let (dir, tool) = (target.ensemble.as_ref().unwrap(), ensemble_tool(target));
                let leader = script(&[tool, "leader", dir]);
                let follower = if leader == "1" { "2" } else { "1" };
                script(&[tool, "pause", dir, follower]);
                tokio::time::sleep(Duration::from_secs(4)).await;
                script(&[tool, "resume", dir, follower]);
            }
        }
    }
    // Let the lock move on after the last fault, then stop everyone: the child first (its stdin
    // closed, it lets go and exits), or the contenders would wait out its hold.
    tokio::time::sleep(GAP * 2).await;
    shared.stop.store(true, Ordering::SeqCst);
    if let Some((pid, mut c)) = child.take() {
        distlock_faults::resume(pid).ok();
        drop(c.stdin.take());
        if tokio::time::timeout(Duration::from_secs(15), c.wait()).await.is_err() {
            distlock_faults::kill(pid).ok();
        }
    }
    for t in tasks {
        tokio::time::timeout(BOUND, t).await.expect("contender stops").unwrap();
    }
    drop(proxies);
    // Nothing may be left on the server once every client has released or ended.
    let leaked = leaked_after(target, recipe, &name, Duration::from_secs(8).max(target.lease * 2)).await;
    let grants = shared.grants.lock().unwrap().clone();
    let recovery_ms = fault_starts
        .iter()
        .filter_map(|&f| grants.iter().filter(|&&g| g > f).min().map(|g| (g - f) / 1_000_000))
        .max()
        .unwrap_or(0);
    let report = shared.resource.report();
    let now = distlock_faults::mono_now();
    let longest_overlap_us = longest_overlap_us(report.overlaps.iter(), now);
    Row {
        scenario: scenario.name(),
        recipe: recipe.name(),
        acquisitions: report.holds,
        faults: injected,
        overlaps: report.overlaps.len(),
        longest_overlap_us,
        stale_accepted: report.stale_accepted,
        stale_rejected: report.stale_rejected,
        leaked,
        recovery_ms,
        losses: shared.losses.load(Ordering::SeqCst),
        // A job's hold is a lease on every backend, never its connection's.
        by_nature: (scenario == Scenario::ServerRestart && target.restart_forgets)
            || (scenario == Scenario::Reset && target.connection_bound && recipe != Recipe::Job),
        pause_holds: matches!(scenario, Scenario::Pause { .. }) && target.pause_holds && recipe != Recipe::Job,
        // A cluster's holder cut off from every member past its lease must be told (at least once
        // in the cell: a fault may catch it between two holds); a client that reconnected around
        // its proxies would renew on and never be.
        must_lose: usize::from(scenario == Scenario::BlackholeLong && target.ensemble.is_some()),
        // A reset or a lost reply the lease outlives loses nothing (a session, a lease or a key
        // outlives its connection), nor do replies 300 ms late: a loss reported there is false.
        must_keep: (matches!(scenario, Scenario::Reset | Scenario::LostReply) && !target.connection_bound)
            || scenario == Scenario::Delay,
        violations: Vec::new(),
    }
}

/// The longest of `overlaps`, in microseconds; a hold still open counts until `now`.
fn longest_overlap_us<'a>(
    overlaps: impl Iterator<Item = &'a (distlock_faults::Hold, distlock_faults::Hold)>,
    now: u64,
) -> u64 {
    let end = |h: &distlock_faults::Hold| if h.is_open() { now } else { h.end_ns };
    overlaps.map(|(a, b)| end(a).min(end(b)).saturating_sub(a.start_ns.max(b.start_ns)) / 1_000).max().unwrap_or(0)
}

/// What is left of the lock after waiting up to `bound` for clients that ended to be cleaned
/// up: on ZooKeeper the nodes under its path (and its semaphore's subdirectories); elsewhere 1
/// if the lock (every permit of it) could not be taken by a fresh client, else 0.
async fn leaked_after(target: &Target, recipe: Recipe, name: &str, bound: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + bound;
    let observer = connect_within(&target.direct_url(), BOUND).await;
    let left = loop {
        let left = match observer.zookeeper() {
            Some(zk) => {
                let mut left = 0;
                for dir in [name.to_string(), format!("{name}/leases"), format!("{name}/locks")] {
                    left +=
                        common::zk::children(zk, &dir).await.iter().filter(|n| *n != "leases" && *n != "locks").count();
                }
                left
            }
            None => {
                let mut taken = Vec::new();
                for _ in 0..recipe.permits() {
                    let lock = lock_of(&observer, recipe, name, false).expect("the lock");
                    if let Ok(Some(g)) = lock.try_lock().await {
                        taken.push(g);
                    }
                }
                let free = taken.len() == recipe.permits();
                for g in taken {
                    let _ = g.release().await;
                }
                usize::from(!free)
            }
        };
        if left == 0 || tokio::time::Instant::now() >= deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    observer.close(Duration::from_secs(2)).await;
    left
}

/// A fresh client of `url`, connecting again until `bound` runs out: a server just restarted on
/// a loaded machine may take longer than one connect's own bound to take a session, and the
/// observer's connect is not what a cell judges.
async fn connect_within(url: &str, bound: Duration) -> distlock::Client {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match distlock::connect(url).await {
            Ok(c) => return c,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "the observer's connect failed; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the observer connects within {bound:?}: {e}"),
        }
    }
}

fn table(server: &str, rows: &[Row]) -> String {
    let mut t = format!(
        "### {server}\n\n| scenario | recipe | acquisitions | faults | overlaps | stale writes accepted | stale writes rejected | left on the server | losses reported | recovery (ms) |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for r in rows {
        let scenario = if r.by_nature && r.scenario.contains("reset") {
            format!("{} (the server frees the lock as the holder learns: fenced)", r.scenario)
        } else if r.by_nature {
            format!("{} (forgets its locks: fenced)", r.scenario)
        } else if r.pause_holds {
            format!("{} (the paused holder keeps the lock until it resumes)", r.scenario)
        } else {
            r.scenario.clone()
        };
        t += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            scenario,
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
            bad.push(format!("{what}: {} left on the server", r.leaked));
        }
        if r.acquisitions == 0 {
            bad.push(format!("{what}: no acquisition at all"));
        }
        if r.losses < r.must_lose {
            bad.push(format!("{what}: {} of {} locks reported lost", r.losses, r.must_lose));
        }
        for v in r.violations.iter().take(5) {
            bad.push(format!("{what}: {v}"));
        }
        if r.violations.len() > 5 {
            bad.push(format!("{what}: and {} more such", r.violations.len() - 5));
        }
        if r.must_keep && r.losses > 0 {
            bad.push(format!("{what}: {} false losses (the lease outlives the fault)", r.losses));
        }
        if r.pause_holds {
            // The lock stays with the paused holder while it is stopped. Resumed past its lease,
            // the holder is told it lost the lock and its connection is closed, which frees the
            // lock: a write it checked just before the stop may still land after the next grant
            // (its hold then overlaps the next by its check-to-write gap). So no overlap longer
            // than that gap (a lock freed during the pause would overlap by seconds), and no
            // stale write accepted where the resource is fenced.
            let fenced = !r.scenario.contains("unfenced");
            if r.longest_overlap_us > RESUMED_GAP.as_micros() as u64 || (fenced && r.stale_accepted > 0) {
                bad.push(format!(
                    "{what}: {} overlaps (longest {} µs, more than a resumed holder's check-to-write gap of {RESUMED_GAP:?}?), {} stale writes accepted",
                    r.overlaps, r.longest_overlap_us, r.stale_accepted
                ));
            }
        } else if r.scenario.contains("unfenced") {
            // The checker must catch the paused holder when nothing fences it.
            if r.stale_accepted == 0 && r.overlaps == 0 {
                bad.push(format!("{what}: the unfenced pause went unnoticed (the checker cannot fail?)"));
            }
        } else if r.scenario.contains("paused") || r.by_nature {
            if r.stale_accepted > 0 {
                bad.push(format!("{what}: {} stale writes accepted despite fencing", r.stale_accepted));
            }
        } else if r.overlaps > 0 || r.stale_accepted > 0 {
            bad.push(format!(
                "{what}: {} overlaps (longest {} µs), {} stale writes accepted",
                r.overlaps, r.longest_overlap_us, r.stale_accepted
            ));
        }
    }
    bad
}

/// `DISTLOCK_MATRIX_LOG=distlock::nats=debug` (tracing targets and levels, as `Targets` parses
/// them) prints the library's events on stderr while a matrix runs.
fn log_if_asked() {
    use tracing_subscriber::layer::SubscriberExt;
    let Some(targets) =
        std::env::var("DISTLOCK_MATRIX_LOG").ok().and_then(|t| t.parse::<tracing_subscriber::filter::Targets>().ok())
    else {
        return;
    };
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false);
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(log).with(targets));
}

/// Runs every scenario × every recipe the backend has, then the cells of many locks on one
/// client (`many`).
async fn run_matrix(target: Target, scenarios: &[Scenario], many: &[ManyFault]) {
    log_if_asked();
    let probe = distlock::connect(&target.direct_url()).await.expect("connect to the backend");
    let only_recipe = std::env::var("DISTLOCK_MATRIX_RECIPE").unwrap_or_default();
    let recipes: Vec<Recipe> = [Recipe::Mutex, Recipe::RwLock, Recipe::Semaphore, Recipe::Election, Recipe::Job]
        .into_iter()
        .filter(|&r| r.name().contains(&only_recipe) && lock_of(&probe, r, "matrix-probe", false).is_ok())
        .collect();
    probe.close(Duration::from_secs(2)).await;
    let mut rows = Vec::new();
    // `DISTLOCK_MATRIX_ONLY=paused` runs only the cells whose scenario names contain it.
    let only = std::env::var("DISTLOCK_MATRIX_ONLY").unwrap_or_default();
    for &scenario in scenarios.iter().filter(|s| s.name().contains(&only)) {
        // A child process holds in the pause and kill cells: a mutex, a leader, a job's run.
        let in_child: Vec<Recipe> =
            recipes.iter().copied().filter(|r| matches!(r, Recipe::Mutex | Recipe::Election | Recipe::Job)).collect();
        let recipes: &[Recipe] = if scenario.needs_child() { &in_child } else { &recipes };
        for &recipe in recipes {
            // A job's run renews nothing: the short partition and the delay (which test
            // renewals) are left out of its cells unless DISTLOCK_MATRIX_FULL=1.
            let full = std::env::var("DISTLOCK_MATRIX_FULL").is_ok_and(|v| v == "1");
            if recipe == Recipe::Job && !full && matches!(scenario, Scenario::BlackholeShort | Scenario::Delay) {
                continue;
            }
            let started = std::time::Instant::now();
            let row =
                tokio::time::timeout(Duration::from_secs(180), cell(&target, scenario, recipe)).await.unwrap_or_else(
                    |_| panic!("{}: cell {} / {} did not finish", target.server, scenario.name(), recipe.name()),
                );
            println!("{}: {:?} in {:.1?}", target.server, row, started.elapsed());
            rows.push(row);
        }
    }
    if recipes.contains(&Recipe::Mutex) {
        for &fault in many.iter().filter(|f| f.name().contains(&only)) {
            let started = std::time::Instant::now();
            let row = tokio::time::timeout(Duration::from_secs(240), many::cell(&target, fault))
                .await
                .unwrap_or_else(|_| panic!("{}: cell {} did not finish", target.server, fault.name()));
            println!("{}: {:?} in {:.1?}", target.server, row, started.elapsed());
            rows.push(row);
        }
    }
    let text = table(&target.server, &rows);
    println!("{text}");
    write_table(&format!("{}.md", target.server.replace([' ', '/'], "-")), &text);
    let bad = verdicts(&rows);
    assert!(bad.is_empty(), "fault matrix on {}:\n{}", target.server, bad.join("\n"));
}

/// The cells every network backend runs (the server restart when its directory is known).
fn network_scenarios(restart: bool) -> Vec<Scenario> {
    let mut s = vec![
        Scenario::None,
        Scenario::BlackholeShort,
        Scenario::BlackholeLong,
        Scenario::Reset,
        Scenario::Delay,
        Scenario::Pause { fenced: true },
        Scenario::Pause { fenced: false },
        Scenario::Kill,
    ];
    if restart {
        s.push(Scenario::ServerRestart);
    }
    s
}

on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a long matrix: scripts/test.sh runs it (ZooKeeper's alone in each ZooKeeper pass)"]
    matrix
);
/// The fault matrix on the backend of `url` (its server as the test run gives it: address,
/// script directory for the restart cells).
async fn matrix(url: String) {
    match url.split(':').next().unwrap() {
        "zk" => zookeeper_matrix().await,
        "redis" => redis_matrix().await,
        "postgres" | "postgresql" => postgres_matrix().await,
        "mysql" => mariadb_matrix().await,
        "etcd" => etcd_matrix().await,
        "nats" => nats_matrix().await,
        "sqlite" => sqlite_matrix().await,
        "memory" => memory_matrix().await,
        other => panic!("no fault matrix for {other}"),
    }
}

/// ZooKeeper at `DISTLOCK_TEST_ZK` (Apache's or the embedded server): every network cell and a
/// lost reply; the restart cell when `DISTLOCK_TEST_ZK_DIR` names its `scripts/zk.sh` directory.
async fn zookeeper_matrix() {
    let addr = common::zk::zk_addr();
    let dir = std::env::var("DISTLOCK_TEST_ZK_DIR").ok();
    let server = std::env::var("DISTLOCK_TEST_SERVER_NAME").unwrap_or_else(|_| format!("server at {addr}"));
    let mut scenarios = network_scenarios(dir.is_some());
    scenarios.insert(4, Scenario::LostReply);
    let target = Target {
        server,
        url: format!("zk://{{addr}}?lease={LEASE}"),
        addr: Some(addr),
        restart: dir.map(|d| ("scripts/zk.sh", d)),
        ensemble: None,
        restart_forgets: false,
        lease: distlock::parse_duration(LEASE).unwrap(),
        pause_holds: false,
        connection_bound: false,
    };
    run_matrix(target, &scenarios, &[ManyFault::Partition, ManyFault::Reset]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a scripts/zk-ensemble.sh ensemble: scripts/test.sh runs it"]
async fn matrix_ensemble() {
    let dir = std::env::var("DISTLOCK_TEST_ENSEMBLE_DIR").expect(
        "DISTLOCK_TEST_ENSEMBLE_DIR unset: scripts/test.sh runs this against a scripts/zk-ensemble.sh ensemble",
    );
    let connect = std::fs::read_to_string(format!("{dir}/ensemble.addr")).expect("ensemble.addr").trim().to_string();
    let target = Target {
        server: "Apache ZooKeeper 3-node ensemble".into(),
        url: format!("zk://{connect}?lease={LEASE}"),
        addr: None,
        restart: None,
        ensemble: Some(dir),
        restart_forgets: false,
        lease: distlock::parse_duration(LEASE).unwrap(),
        pause_holds: false,
        connection_bound: false,
    };
    run_matrix(target, &[Scenario::None, Scenario::KillLeader, Scenario::IsolateFollower], &[]).await;
}

/// A 3-node NATS JetStream cluster of the test's own (`scripts/nats.sh cluster`), the bucket
/// with three replicas: no fault, the holder partitioned silently from all three members for
/// one and a half leases, the bucket stream's leader killed (and restarted), a follower paused.
/// Each contender reaches each member through a proxy of its own and its URL lists the three
/// proxies; the servers advertise no other address (`no_advertise`), so a client cannot
/// reconnect around its proxies. The lease is longer than a leader's failover (about 4 s
/// measured: no stream leader answers meanwhile), so a holder renewing through it keeps its lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long matrix on a cluster of its own: scripts/test.sh runs it"]
async fn matrix_nats_cluster() {
    if std::env::var("DISTLOCK_TEST_NATS").is_err() {
        panic!("DISTLOCK_TEST_NATS unset: run the tests with scripts/test.sh");
    }
    let dir = std::env::temp_dir().join(format!("distlock-nats-cluster-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = dir.display().to_string();
    let servers = script(&["scripts/nats.sh", "cluster", &dir]);
    let lease = "8s";
    let target = Target {
        server: "NATS 2.15 (3-node cluster, R3 bucket, sync_interval always)".into(),
        url: format!("nats://{{addr}}?lease={lease}&replicas=3"),
        addr: Some(servers),
        restart: None,
        ensemble: Some(dir.clone()),
        restart_forgets: false,
        lease: distlock::parse_duration(lease).unwrap(),
        pause_holds: false,
        connection_bound: false,
    };
    let run = std::panic::AssertUnwindSafe(run_matrix(
        target,
        &[Scenario::None, Scenario::BlackholeLong, Scenario::KillLeader, Scenario::IsolateFollower],
        &[],
    ));
    let result = futures::FutureExt::catch_unwind(run).await;
    script(&["scripts/nats.sh", "stop", &dir]);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A network backend's matrix on the server its variable gives: `url` has `{addr}` for the server's address; `env` names its address's variable, whose
/// `_DIR` twin is the script's directory for the restart cell.
async fn backend_matrix(
    server: &str,
    env: &str,
    lease: &str,
    url: impl Fn(&str) -> String,
    tool: &'static str,
    nature: Nature,
) {
    let given = std::env::var(env).unwrap_or_else(|_| panic!("{env} unset: run the tests with scripts/test.sh"));
    // The address inside the URL (redis and etcd give host:port; SQL backends a URL).
    let addr = match given.split_once('@') {
        Some((_, rest)) => rest.split('/').next().unwrap().to_string(),
        None => given.clone(),
    };
    let dir = std::env::var(format!("{env}_DIR")).ok();
    let target = Target {
        server: server.to_string(),
        url: url(&given).replace(&addr, "{addr}"),
        addr: Some(addr.replace("localhost", "127.0.0.1")),
        restart: dir.clone().map(|d| (tool, d)),
        ensemble: None,
        restart_forgets: nature.restart_forgets,
        lease: distlock::parse_duration(lease).unwrap(),
        pause_holds: nature.pause_holds,
        connection_bound: nature.connection_bound,
    };
    run_matrix(target, &network_scenarios(dir.is_some()), &[ManyFault::Partition, ManyFault::Reset]).await;
}

async fn redis_matrix() {
    let url = |addr: &str| format!("redis://{addr}?lease={LEASE}");
    // `scripts/test.sh` runs this matrix on Redis and on Valkey (its server from `scripts/redis.sh`
    // with `DISTLOCK_REDIS_FLAVOUR=valkey`, which the restart cells' calls of the script inherit).
    let server = match std::env::var("DISTLOCK_REDIS_FLAVOUR").as_deref() {
        Ok("valkey") => "Valkey 9 (standalone, no persistence)",
        _ => "Redis 7 (standalone, no persistence)",
    };
    backend_matrix(
        server,
        "DISTLOCK_TEST_REDIS",
        LEASE,
        url,
        "scripts/redis.sh",
        Nature { restart_forgets: true, ..Nature::default() },
    )
    .await;
}

async fn postgres_matrix() {
    let url = |given: &str| format!("{given}?lease={SQL_LEASE}");
    backend_matrix(
        "PostgreSQL 15",
        "DISTLOCK_TEST_POSTGRES",
        SQL_LEASE,
        url,
        "scripts/postgres.sh",
        Nature { pause_holds: true, connection_bound: true, ..Nature::default() },
    )
    .await;
}

async fn mariadb_matrix() {
    let url = |given: &str| format!("{given}?lease={SQL_LEASE}");
    backend_matrix(
        "MariaDB",
        "DISTLOCK_TEST_MYSQL",
        SQL_LEASE,
        url,
        "scripts/mariadb.sh",
        Nature { connection_bound: true, ..Nature::default() },
    )
    .await;
}

async fn etcd_matrix() {
    let url = |addr: &str| format!("etcd://{addr}?lease={LEASE}");
    backend_matrix("etcd 3.4 (one member)", "DISTLOCK_TEST_ETCD", LEASE, url, "scripts/etcd.sh", Nature::default())
        .await;
}

/// NATS 2.15 (one server, JetStream with `sync_interval: always`): the network cells, and the
/// server's SIGKILL and restart when `DISTLOCK_TEST_NATS_DIR` names its `scripts/nats.sh`
/// directory (the bucket's keys and their TTLs survive it: nothing forgotten).
async fn nats_matrix() {
    let url = |addr: &str| format!("nats://{addr}?lease={NATS_LEASE}");
    let server = "NATS 2.15 (one server, sync_interval always)";
    backend_matrix(server, "DISTLOCK_TEST_NATS", NATS_LEASE, url, "scripts/nats.sh", Nature::default()).await;
}

/// SQLite: a file, no network; the cells that apply to a file (a paused and a killed holder,
/// the lease running out under them; the same with a hundred locks in the holder).
async fn sqlite_matrix() {
    let dir = std::env::temp_dir().join(format!("distlock-matrix-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let target = Target {
        server: "SQLite (one file)".into(),
        url: format!("sqlite://{}/locks.db?lease={LEASE}", dir.display()),
        addr: None,
        restart: None,
        ensemble: None,
        restart_forgets: false,
        lease: distlock::parse_duration(LEASE).unwrap(),
        pause_holds: false,
        connection_bound: false,
    };
    run_matrix(
        target,
        &[Scenario::None, Scenario::Pause { fenced: true }, Scenario::Pause { fenced: false }, Scenario::Kill],
        // A file has no connection to cut or reset: a hundred locks held by a process paused or
        // killed in their place.
        &[ManyFault::Pause, ManyFault::Kill],
    )
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The in-process store (`memory://`): no network and no other process, so the cells of a
/// silent partition, made by the client's own switch ([`distlock::memory::Client::partition`]).
async fn memory_matrix() {
    let target = Target {
        server: "memory (in-process)".into(),
        url: format!("memory://matrix-{}?lease={LEASE}", uuid::Uuid::new_v4().simple()),
        addr: None,
        restart: None,
        ensemble: None,
        restart_forgets: false,
        lease: distlock::parse_duration(LEASE).unwrap(),
        pause_holds: false,
        connection_bound: false,
    };
    run_matrix(target, &[Scenario::None, Scenario::BlackholeShort, Scenario::BlackholeLong], &[ManyFault::Partition])
        .await;
}

/// The cells that touch the connection (partitions shorter and longer than the lease, a reset,
/// a server restart), over TLS, on a server set up as production is (its script's `start-tls`:
/// TLS only, logins required). The fault proxy passes the encrypted bytes through unchanged.
async fn tls_matrix(
    server: &str,
    script: &'static str,
    url: impl Fn(&str, &str, &str) -> String,
    lease: &str,
    nature: Nature,
) {
    let own = distlock_faults::OwnServer::start(script.trim_start_matches("scripts/"), "start-tls", &[]);
    let password = std::fs::read_to_string(own.dir().join("password")).unwrap().trim().to_string();
    let files = format!(
        "cacert={}&cert={}&key={}",
        own.file("certs/ca.pem"),
        own.file("certs/client.pem"),
        own.file("certs/client.key")
    );
    let printed = own.printed.trim();
    let addr = printed.rsplit('@').next().unwrap().split('/').next().unwrap().to_string();
    let target = Target {
        server: server.to_string(),
        url: url("{addr}", &password, &files),
        addr: Some(addr),
        restart: Some((script, own.dir().display().to_string())),
        ensemble: None,
        restart_forgets: nature.restart_forgets,
        lease: distlock::parse_duration(lease).unwrap(),
        pause_holds: nature.pause_holds,
        connection_bound: nature.connection_bound,
    };
    let scenarios = [Scenario::BlackholeShort, Scenario::BlackholeLong, Scenario::Reset, Scenario::ServerRestart];
    run_matrix(target, &scenarios, &[]).await;
    drop(own);
}

on_every_backend!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a long matrix: scripts/test.sh runs it once, beside the others"]
    matrix_over_tls: zookeeper, redis, postgres, mysql, etcd, nats
);
/// The connection cells over TLS on the backend of `url`, on a TLS-only server of the test's own
/// (so `url`, the shared server's, only names the backend).
async fn matrix_over_tls(url: String) {
    match url.split(':').next().unwrap() {
        "zk" => tls_zookeeper().await,
        "redis" => tls_redis().await,
        "postgres" | "postgresql" => tls_postgres().await,
        "mysql" => tls_mysql().await,
        "etcd" => tls_etcd().await,
        "nats" => tls_nats().await,
        other => panic!("no TLS matrix for {other}"),
    }
}

async fn tls_zookeeper() {
    let url = |addr: &str, pw: &str, files: &str| format!("zks://distlock:{pw}@{addr}?auth=sasl&{files}&lease={LEASE}");
    tls_matrix("Apache ZooKeeper 3.8 over TLS, SASL login", "scripts/zk.sh", url, LEASE, Nature::default()).await;
}

async fn tls_redis() {
    let url = |addr: &str, pw: &str, files: &str| format!("rediss://distlock:{pw}@{addr}?{files}&lease={LEASE}");
    let nature = Nature { restart_forgets: true, ..Nature::default() };
    tls_matrix("Redis 7 over TLS, ACL user", "scripts/redis.sh", url, LEASE, nature).await;
}

async fn tls_postgres() {
    let url = |addr: &str, pw: &str, files: &str| {
        format!("postgres://distlock:{pw}@{addr}/locks?sslmode=verify-full&{files}&lease={SQL_LEASE}")
    };
    let nature = Nature { pause_holds: true, connection_bound: true, ..Nature::default() };
    tls_matrix("PostgreSQL 15 over TLS, SCRAM login", "scripts/postgres.sh", url, SQL_LEASE, nature).await;
}

async fn tls_mysql() {
    let url = |addr: &str, pw: &str, files: &str| {
        format!("mysql://distlock:{pw}@{addr}/distlock?ssl-mode=VERIFY_IDENTITY&{files}&lease={SQL_LEASE}")
    };
    let nature = Nature { connection_bound: true, ..Nature::default() };
    tls_matrix("MariaDB over TLS, password login", "scripts/mariadb.sh", url, SQL_LEASE, nature).await;
}

async fn tls_nats() {
    let url = |addr: &str, pw: &str, files: &str| format!("natss://distlock:{pw}@{addr}?{files}&lease={NATS_LEASE}");
    tls_matrix("NATS 2.15 over TLS, user login", "scripts/nats.sh", url, NATS_LEASE, Nature::default()).await;
}

async fn tls_etcd() {
    let url = |addr: &str, pw: &str, files: &str| format!("etcds://distlock:{pw}@{addr}?{files}&lease={LEASE}");
    tls_matrix("etcd 3.4 over TLS, user login", "scripts/etcd.sh", url, LEASE, Nature::default()).await;
}
