//! Deterministic simulation of distlock's ZooKeeper recipes, the vendored ZooKeeper client and the
//! embedded server (issue 54).
//!
//! One process, one thread per simulation: an embedded server and a few clients, each a turmoil
//! host running distlock's real lock code over the real client, on turmoil's simulated network and
//! tokio's paused clock. A seed decides everything: the fault schedule (partitions in one or both
//! directions, held links, client crashes, server crashes with and without the data directory),
//! the message latencies, the workload's waits and holds, and every runtime's random choices (with
//! `--cfg tokio_unstable`). The checker reads the events in the order they happened and asserts
//! exclusion before `lost()`, permits, rising fencing tokens, nothing left behind, and liveness
//! once the faults stop.
//!
//! Only built with `--cfg distlock_sim` (scripts/sim.sh). Environment:
//! - `DISTLOCK_SIM_SEEDS=N`: schedules per test (defaults: 200 mutex, 150 semaphore, 150
//!   read/write lock, 100 election, 100 reentrant mutex, 100 multi-lock, 50 revocation (the
//!   dearest: every hold revoked, about three times a mutex's schedule), 150 jobs: 1,000);
//! - `DISTLOCK_SIM_SEED=S`: one schedule, with its trace hash and its events printed;
//! - `DISTLOCK_SIM_PLANT=NAME`: a planted defect switched on (docs/reliability.md);
//! - `DISTLOCK_SIM_THREADS=N`: simulations run side by side (default: the machine's cores);
//! - `DISTLOCK_SIM_DETERMINISM_SEEDS=N`: seeds `simulation_seed_alone_same_trace` compares (32);
//! - `DISTLOCK_SIM_LOG=FILTER`: with `DISTLOCK_SIM_SEED`, the log (e.g. `distlock=debug`), stamped
//!   with simulated time.
#![cfg(distlock_sim)]

use distlock::zookeeper::Client;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const LOCK_PATH: &str = "/sim/lock";
/// The multi-lock workload's locks: `/sim/m0`, `/sim/m1`, ...
const MULTI_LOCKS: usize = 3;
/// The session timeout the clients ask for (the server's tick is 500 ms: 1 s to 10 s allowed).
const LEASE: Duration = Duration::from_secs(2);
/// Faults happen in the first FAULTS of simulated time; then everything heals.
const FAULTS: Duration = Duration::from_secs(30);
/// After healing, every client must be granted within this (liveness).
const QUIET: Duration = Duration::from_secs(15);
/// turmoil's step: every host runs once per tick (half the cost of 2 ms, the plants found as often).
const TICK: Duration = Duration::from_millis(4);
/// A holder asked to release (after the faults stopped, or from when they stop) has released or
/// been told lost within this: a session's lease and a second (the watch re-armed on reconnect).
const REVOKE_BOUND: Duration = Duration::from_secs(3);
/// The jobs workload's slot (`once_per`): several per fault, a few after healing.
const SLOT: Duration = Duration::from_secs(2);
/// The server's clock at the simulation's start (crates/distlock-server's `sim::wall_clock`):
/// 2026-01-01T00:00:00Z, in ms since the Unix epoch.
const SIM_EPOCH_MS: u64 = 1_767_225_600_000;
/// After healing, slots starting this much later must each have their run (sessions back, a
/// crashed runner's hold run out).
const JOBS_SETTLE: Duration = Duration::from_secs(4);
/// The whole simulation's bound: stopping and the audit must be done by then.
const LIMIT: Duration = Duration::from_secs(80);

/// A small deterministic generator (SplitMix64) for schedules and workloads.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

/// Which recipe the clients contend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    Mutex,
    /// A semaphore of this many permits.
    Semaphore(u32),
    /// Readers and writers; a writer may downgrade.
    RwLock,
    /// Candidates campaign; a leader resigns after its hold.
    Election,
    /// A reentrant mutex: each grant re-entered a few times, its guards released in any order.
    Reentrant,
    /// A random set of [`MULTI_LOCKS`] mutexes taken all or nothing.
    Multi,
    /// A mutex whose holders release when asked (Curator's revocation); the others ask them.
    Revocation,
    /// A job run at most once per [`SLOT`] (`Schedule::once_per`), started by every client.
    Jobs,
}

/// The lock directories a workload's clients queue in.
fn lock_dirs(workload: Workload) -> Vec<String> {
    match workload {
        Workload::Multi => (0..MULTI_LOCKS).map(|i| format!("/sim/m{i}")).collect(),
        // Its nodes are persistent by design (ShedLock's row and the record): the auditor reads
        // the record instead.
        Workload::Jobs => Vec::new(),
        _ => vec![LOCK_PATH.to_string()],
    }
}

/// What a client or the harness saw, in the order it happened (one thread runs everything).
// The texts are read through `Debug`: the trace, its hash and the printed events.
#[allow(dead_code)]
#[derive(Clone, Debug)]
enum Kind {
    Connected,
    /// A mutex's, a writer's (its fencing token) or a leader's (its epoch) grant; a permit's (0).
    Granted(u64),
    /// A read lock's grant.
    GrantedRead,
    /// A multi-lock's grant: each member's lock (its index) and fencing token.
    GrantedMany(Vec<(usize, u64)>),
    /// The node (its sequence number) of the hold just granted (revocation).
    Holding(u64),
    /// A revoker's request to the holder of this node (its sequence number) was applied.
    RevokeSent(u64),
    /// The holder was asked to release (its hold ends at the `Releasing` that follows).
    Revoked,
    /// A job's run began (in this slot of the server's clock, with this fencing token); it ends
    /// at the `Releasing` that follows (by its `stop_by`).
    JobRun {
        slot: u64,
        token: u64,
    },
    /// The client saw its recipe break a promise (e.g. a re-entry that waited).
    Broken(String),
    /// A writer took its read lock (it holds both until `WriteReleasing`).
    Downgraded,
    /// A downgraded writer is releasing its write lock (its read lock goes on).
    WriteReleasing,
    /// The holder decided to release (its hold ends here, before the request is sent).
    Releasing,
    ReleaseFailed(String),
    Lost(String),
    AcquireFailed(String),
    Crashed,
    ServerDown {
        wiped: bool,
    },
    ServerUp,
    Healed,
    Idle,
    Audit(Vec<String>),
}

#[derive(Clone, Debug)]
struct Event {
    at: Duration,
    client: usize,
    incarnation: u64,
    kind: Kind,
}

/// What the harness and the hosts share (all on one thread; the mutex only satisfies `Send`).
struct Shared {
    seed: u64,
    workload: Workload,
    events: Mutex<Vec<Event>>,
    incarnations: Mutex<Vec<u64>>,
    stopping: Mutex<bool>,
    quiet: Mutex<bool>,
    idle: Mutex<Vec<bool>>,
    audited: Mutex<bool>,
    /// The simulated time of the harness's current step.
    now: Mutex<Duration>,
}

impl Shared {
    fn record(&self, client: usize, incarnation: u64, kind: Kind) {
        // On a host, its clock; in the harness (faults, healing), the step's time.
        let at = turmoil::sim_elapsed().unwrap_or_else(|| *self.now.lock().unwrap());
        self.events.lock().unwrap().push(Event { at, client, incarnation, kind });
    }
    fn flag(m: &Mutex<bool>) -> bool {
        *m.lock().unwrap()
    }
}

/// One fault of a schedule, applied at `at` and undone `lasting` later.
#[derive(Clone, Debug)]
enum Fault {
    /// Both directions between the client and the server: nothing passes.
    Partition(usize),
    /// Only the client's packets to the server are dropped.
    PartitionToServer(usize),
    /// Only the server's packets to the client are dropped.
    PartitionFromServer(usize),
    /// Packets held both ways and delivered afterwards (a stalled link or a host paused past
    /// its lease, as the network sees it).
    Hold(usize),
    /// The client host crashes; it restarts (a new process) when the fault ends.
    CrashClient(usize),
    /// The server crashes and restarts when the fault ends (on its data directory, if any).
    CrashServer,
    /// Every link's latency up to this many milliseconds for the fault's length.
    Slow(u64),
}

#[derive(Clone, Debug)]
struct Step {
    at: Duration,
    lasting: Duration,
    fault: Fault,
}

/// The schedule a seed stands for.
#[derive(Clone, Debug)]
struct Schedule {
    clients: usize,
    data_dir: bool,
    snapshot_every: u64,
    steps: Vec<Step>,
}

fn schedule(seed: u64) -> Schedule {
    let mut rng = Rng::new(seed);
    let clients = rng.range(2, 5) as usize;
    // Mostly with a data directory: a server restarted without one has forgotten every session
    // and node, which no lock can survive (the checker judges those runs by epochs).
    let data_dir = rng.chance(75);
    let snapshot_every = rng.range(3, 40);
    let mut steps = Vec::new();
    let mut at = rng.ms(500, 3000);
    while at < FAULTS {
        let c = rng.range(0, clients as u64) as usize;
        let (fault, lasting) = match rng.range(0, 100) {
            0..=21 => (Fault::Partition(c), rng.ms(200, 3 * LEASE.as_millis() as u64)),
            22..=31 => (Fault::PartitionToServer(c), rng.ms(200, 3 * LEASE.as_millis() as u64)),
            32..=41 => (Fault::PartitionFromServer(c), rng.ms(200, 3 * LEASE.as_millis() as u64)),
            42..=59 => (Fault::Hold(c), rng.ms(100, 2 * LEASE.as_millis() as u64)),
            60..=71 => (Fault::CrashClient(c), rng.ms(10, 2000)),
            72..=85 => (Fault::CrashServer, rng.ms(10, 3000)),
            _ => (Fault::Slow(rng.range(5, 400)), rng.ms(500, 5000)),
        };
        steps.push(Step { at, lasting, fault });
        at += lasting + rng.ms(0, 2500);
    }
    Schedule { clients, data_dir, snapshot_every, steps }
}

fn name(c: usize) -> String {
    format!("c{c}")
}

/// A client host: connects (again after a lost session), then contends until told to stop.
async fn client_host(id: usize, shared: Arc<Shared>) -> turmoil::Result {
    let incarnation = {
        let mut all = shared.incarnations.lock().unwrap();
        all[id] += 1;
        all[id]
    };
    shared.idle.lock().unwrap()[id] = false;
    let mut rng = Rng::new(shared.seed.wrapping_mul(31).wrapping_add((id as u64) << 20 | incarnation));
    let url = format!("zk://server:2181?lease={}ms&connect_timeout=5s", LEASE.as_millis());
    let record = |kind| shared.record(id, incarnation, kind);
    'session: loop {
        // The election runs through the backend-neutral client (its only API); the others
        // through the ZooKeeper client's recipes. Either is one session.
        let client = match Conn::connect(&url, shared.workload).await {
            Ok(c) => c,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                continue;
            }
        };
        record(Kind::Connected);
        loop {
            if Shared::flag(&shared.stopping) {
                shared.idle.lock().unwrap()[id] = true;
                record(Kind::Idle);
                while !Shared::flag(&shared.audited) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                client.close().await;
                return Ok(());
            }
            // Once the faults stop, waiters wait for good: every one must be granted.
            let wait = (!Shared::flag(&shared.quiet)).then(|| rng.ms(100, 5000));
            let hold = rng.ms(5, 1500);
            let outcome = match (&client, shared.workload) {
                (Conn::Zk(c), Workload::Mutex) => mutex_round(c, wait, hold, &record).await,
                (Conn::Zk(c), Workload::Semaphore(permits)) => semaphore_round(c, permits, wait, hold, &record).await,
                (Conn::Zk(c), Workload::RwLock) => {
                    let (write, downgrade) = (rng.chance(40), rng.chance(50));
                    rwlock_round(c, write, downgrade, wait, hold, &record).await
                }
                (Conn::Any(c), Workload::Election) => election_round(c, id, wait, hold, &record).await,
                (Conn::Zk(c), Workload::Reentrant) => {
                    let (depth, order) = (rng.range(1, 4) as usize, rng.next());
                    reentrant_round(c, depth, order, wait, hold, &record).await
                }
                (Conn::Zk(c), Workload::Multi) => {
                    // A non-empty subset of the locks, as a bit set.
                    let set = rng.range(1, 1 << MULTI_LOCKS) as usize;
                    multi_round(c, set, wait, hold, &record).await
                }
                (Conn::Any(c), Workload::Jobs) => {
                    // Crons firing at random moments, several a slot; after healing short runs, so
                    // that every slot has its run (a run may outlast its slot and its bound before).
                    let quiet = wait.is_none();
                    let fire_in = if quiet { rng.ms(100, 500) } else { rng.ms(100, 1500) };
                    let hold = if quiet { rng.ms(20, 400) } else { rng.ms(20, 2500) };
                    jobs_round(c, fire_in, hold, &record).await
                }
                (Conn::Zk(c), Workload::Revocation) => {
                    // Holds longer than the revocation bound (a holder deaf to requests shows);
                    // after healing every waiter asks the holder first.
                    let revoke_first = rng.chance(25) || wait.is_none();
                    let hold = rng.ms(REVOKE_BOUND.as_millis() as u64 + 1000, 8000);
                    revocation_round(c, revoke_first, wait, hold, &record).await
                }
                _ => unreachable!("Conn::connect picks the client by workload"),
            };
            if let Err(e) = outcome {
                let gone = matches!(e, distlock::Error::SessionExpired | distlock::Error::Closed);
                record(Kind::AcquireFailed(e.to_string()));
                if gone {
                    continue 'session;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A client host's session: the ZooKeeper client, or the backend-neutral one (elections).
enum Conn {
    Zk(Client),
    Any(distlock::Client),
}

impl Conn {
    async fn connect(url: &str, workload: Workload) -> distlock::Result<Conn> {
        match workload {
            Workload::Election | Workload::Jobs => distlock::connect(url).await.map(Conn::Any),
            _ => Client::connect(url).await.map(Conn::Zk),
        }
    }

    async fn close(self) {
        match self {
            Conn::Zk(c) => c.close(Duration::from_secs(2)).await,
            Conn::Any(c) => c.close(Duration::from_secs(2)).await,
        }
    }
}

async fn mutex_round(
    c: &Client,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let lock = c.mutex(LOCK_PATH).expect("lock path");
    let got = match wait {
        Some(w) => lock.lock_timeout(w).await?,
        None => Some(lock.lock().await?),
    };
    if let Some(guard) = got {
        record(Kind::Granted(guard.fencing_token()));
        hold_then_release(record, hold, guard.lost(), guard.release()).await;
    }
    Ok(())
}

async fn semaphore_round(
    c: &Client,
    permits: u32,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let sem = c.semaphore(LOCK_PATH, permits).expect("semaphore path");
    let got = match wait {
        Some(w) => sem.acquire_timeout(1, w).await?,
        None => Some(sem.acquire().await?),
    };
    if let Some(permit) = got {
        record(Kind::Granted(0));
        hold_then_release(record, hold, permit.lost(), permit.release()).await;
    }
    Ok(())
}

/// A reader, or a writer that may downgrade half-way through its hold (its read guard then holds
/// the rest, the write guard released first).
async fn rwlock_round(
    c: &Client,
    write: bool,
    downgrade: bool,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let lock = c.rwlock(LOCK_PATH).expect("lock path");
    if !write {
        let got = match wait {
            Some(w) => lock.read_timeout(w).await?,
            None => Some(lock.read().await?),
        };
        if let Some(guard) = got {
            record(Kind::GrantedRead);
            hold_then_release(record, hold, guard.lost(), guard.release()).await;
        }
        return Ok(());
    }
    let got = match wait {
        Some(w) => lock.write_timeout(w).await?,
        None => Some(lock.write().await?),
    };
    let Some(guard) = got else { return Ok(()) };
    record(Kind::Granted(guard.fencing_token()));
    if !downgrade {
        hold_then_release(record, hold, guard.lost(), guard.release()).await;
        return Ok(());
    }
    if unless_lost(record, guard.lost(), tokio::time::sleep(hold / 2)).await.is_none() {
        return Ok(());
    }
    // Told of a loss while downgrading or releasing the write lock: the hold ends there.
    let Some(downgraded) = unless_lost(record, guard.lost(), guard.downgrade()).await else { return Ok(()) };
    match downgraded {
        Ok(read) => {
            record(Kind::Downgraded);
            record(Kind::WriteReleasing);
            let Some(released) = unless_lost(record, read.lost(), guard.release()).await else { return Ok(()) };
            if let Err(e) = released {
                record(Kind::ReleaseFailed(e.to_string()));
            }
            hold_then_release(record, hold / 2, read.lost(), read.release()).await;
        }
        Err(e) => {
            record(Kind::Releasing);
            record(Kind::ReleaseFailed(format!("downgrade: {e}")));
        }
    }
    Ok(())
}

/// A reentrant mutex: granted, re-entered `depth` times (each at once, with the same token), held,
/// then its guards released in an order `order` picks: the lock stays held until the last.
async fn reentrant_round(
    c: &Client,
    depth: usize,
    order: u64,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let lock = c.reentrant_mutex(LOCK_PATH).expect("lock path");
    let got = match wait {
        Some(w) => lock.lock_timeout(w).await?,
        None => Some(lock.lock().await?),
    };
    let Some(outer) = got else { return Ok(()) };
    let token = outer.fencing_token();
    record(Kind::Granted(token));
    let mut guards = vec![outer];
    for _ in 0..depth {
        // A re-entry never waits: a zero timeout must grant it.
        let Some(again) = unless_lost(record, guards[0].lost(), lock.lock_timeout(Duration::ZERO)).await else {
            return Ok(());
        };
        match again {
            Ok(Some(g)) if g.fencing_token() == token => guards.push(g),
            Ok(Some(g)) => record(Kind::Broken(format!("re-entry token {} for a hold of {token}", g.fencing_token()))),
            Ok(None) => record(Kind::Broken("a re-entry was not granted at once".into())),
            Err(e) => {
                // Told the hold is gone (the session expired under it).
                record(Kind::Lost(format!("re-entry: {e}")));
                return Ok(());
            }
        }
    }
    if lock.hold_count() != guards.len() {
        record(Kind::Broken(format!("hold count {} after {} acquisitions", lock.hold_count(), guards.len())));
    }
    if unless_lost(record, guards[0].lost(), tokio::time::sleep(hold)).await.is_none() {
        return Ok(());
    }
    // Every guard but one released, in the order `order` picks (the first acquisition too): the
    // lock stays held; the last one's release is the hold's end.
    let last = guards.swap_remove((order % guards.len() as u64) as usize);
    let mut order = order;
    while !guards.is_empty() {
        order = order.rotate_left(7);
        let g = guards.swap_remove((order % guards.len() as u64) as usize);
        let Some(released) = unless_lost(record, last.lost(), g.release()).await else { return Ok(()) };
        if let Err(e) = released {
            record(Kind::Lost(format!("inner release: {e}")));
            return Ok(());
        }
    }
    if lock.hold_count() != 1 {
        record(Kind::Broken(format!("hold count {} with one guard left", lock.hold_count())));
    }
    record(Kind::Releasing);
    if let Err(e) = last.release().await {
        record(Kind::ReleaseFailed(e.to_string()));
    }
    Ok(())
}

/// The locks in `set` (a bit set over [`MULTI_LOCKS`]) taken all or nothing, held, released.
async fn multi_round(
    c: &Client,
    set: usize,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let wanted: Vec<usize> = (0..MULTI_LOCKS).filter(|i| set & (1 << i) != 0).collect();
    let specs = wanted
        .iter()
        .map(|i| c.mutex(&format!("/sim/m{i}")).map(distlock::zookeeper::LockSpec::Exclusive))
        .collect::<distlock::Result<Vec<_>>>()?;
    let multi = distlock::zookeeper::MultiLock::new(specs)?;
    let got = match wait {
        Some(w) => multi.lock_timeout(w).await?,
        None => Some(multi.lock().await?),
    };
    let Some(guard) = got else { return Ok(()) };
    let mut held: Vec<(usize, u64)> = guard
        .parts()
        .iter()
        .map(|p| {
            let index = p.lock_path().strip_prefix("/sim/m").and_then(|i| i.parse().ok()).unwrap_or(usize::MAX);
            (index, p.fencing_token())
        })
        .collect();
    held.sort();
    let got: Vec<usize> = held.iter().map(|(i, _)| *i).collect();
    if got != wanted {
        record(Kind::Broken(format!("asked for locks {wanted:?}, granted {got:?}")));
    }
    record(Kind::GrantedMany(held));
    hold_then_release(record, hold, guard.lost(), guard.release()).await;
    Ok(())
}

async fn election_round(
    c: &distlock::Client,
    id: usize,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    let election = c.election(LOCK_PATH)?;
    let value = name(id);
    let got = match wait {
        Some(w) => election.campaign_timeout(&value, w).await?,
        None => Some(election.campaign(&value).await?),
    };
    if let Some(lead) = got {
        record(Kind::Granted(lead.epoch()));
        let lost = lead.lost();
        hold_then_release(record, hold, lost, lead.resign()).await;
    }
    Ok(())
}

/// The sequence number of a lock node's name (`_c_<uuid>-lock-0000000007`: 7); the uuid is not
/// the seed's, so the trace names nodes by this.
fn sequence(node: &str) -> Option<u64> {
    node.rsplit_once("lock-").and_then(|(_, seq)| seq.parse().ok())
}

/// Asks the holder of [`LOCK_PATH`] (its lowest node) to release; records the request once the
/// server applied it. A failure (no holder, the node gone meanwhile, the connection) is no
/// event: the acquire that follows meets the session's troubles.
async fn revoke_holder(c: &Client, record: &impl Fn(Kind)) {
    let Ok(children) = c.zookeeper().list_children(LOCK_PATH).await else { return };
    let Some((seq, node)) = children.iter().filter_map(|n| sequence(n).map(|s| (s, n))).min() else { return };
    if c.revoke(&format!("{LOCK_PATH}/{node}")).await.is_ok() {
        record(Kind::RevokeSent(seq));
    }
}

/// A revoker (first, if `revoke_first`) and a holder that releases when asked: acquire with a
/// timeout, hold for `hold` unless asked to release or told of a loss first, release.
async fn revocation_round(
    c: &Client,
    revoke_first: bool,
    wait: Option<Duration>,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    if revoke_first {
        revoke_holder(c, record).await;
    }
    let lock = c.mutex(LOCK_PATH).expect("lock path");
    let got = match wait {
        Some(w) => lock.lock_timeout(w).await?,
        None => Some(lock.lock().await?),
    };
    let Some(guard) = got else { return Ok(()) };
    record(Kind::Granted(guard.fencing_token()));
    record(Kind::Holding(sequence(guard.node_path()).unwrap_or(u64::MAX)));
    let asked = guard.revocation_requested();
    tokio::select! {
        biased;
        why = guard.lost() => {
            record(Kind::Lost(format!("{why:?}")));
            return Ok(());
        }
        _ = asked => record(Kind::Revoked),
        _ = tokio::time::sleep(hold) => {}
    }
    record(Kind::Releasing);
    if let Err(e) = guard.release().await {
        record(Kind::ReleaseFailed(e.to_string()));
    }
    Ok(())
}

/// The jobs workload's job (`/shedlock/sim-job`, `/distlock-jobs/sim-job`).
const JOB: &str = "sim-job";

/// A cron firing in `fire_in`: starts the job if its slot has no run yet, runs it for `hold` or
/// until its `stop_by`, finishes it.
async fn jobs_round(
    c: &distlock::Client,
    fire_in: Duration,
    hold: Duration,
    record: &impl Fn(Kind),
) -> distlock::Result<()> {
    tokio::time::sleep(fire_in).await;
    let job = c.schedule(JOB)?.once_per(SLOT);
    let distlock::schedule::Started::Running(run) = job.try_start().await? else { return Ok(()) };
    record(Kind::JobRun { slot: run.run().slot.unwrap_or(u64::MAX), token: run.fencing_token() });
    let stop_by = tokio::time::Instant::from_std(run.stop_by());
    let _ = tokio::time::timeout_at(stop_by, tokio::time::sleep(hold)).await;
    record(Kind::Releasing);
    if let Err(e) = run.finish(Some(0)).await {
        record(Kind::ReleaseFailed(e.to_string()));
    }
    Ok(())
}

/// `fut`'s output, unless told of a loss first: then the loss is recorded, and `None`.
async fn unless_lost<T>(
    record: &impl Fn(Kind),
    lost: impl std::future::Future<Output = distlock::LostReason>,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        why = lost => {
            record(Kind::Lost(format!("{why:?}")));
            None
        }
        r = fut => Some(r),
    }
}

/// Holds for `hold` unless told of a loss first; then releases (or drops a lost guard).
async fn hold_then_release<R>(
    record: &impl Fn(Kind),
    hold: Duration,
    lost: impl std::future::Future<Output = distlock::LostReason>,
    release: impl std::future::Future<Output = distlock::Result<R>>,
) {
    tokio::select! {
        biased;
        why = lost => record(Kind::Lost(format!("{why:?}"))),
        _ = tokio::time::sleep(hold) => {
            record(Kind::Releasing);
            if let Err(e) = release.await {
                record(Kind::ReleaseFailed(e.to_string()));
            }
        }
    }
}

/// The auditor: once every client is idle, lists what is left under the lock's path.
async fn auditor(shared: Arc<Shared>, clients: usize) -> turmoil::Result {
    loop {
        let all_idle = shared.idle.lock().unwrap().iter().take(clients).all(|i| *i);
        if Shared::flag(&shared.stopping) && all_idle {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let zk = zookeeper_client::Client::connect("server:2181").await?;
    // The lock's nodes, and the semaphore's under its `leases` and `locks` directories (Curator's
    // layout: directories, not holders).
    let mut left = Vec::new();
    let roots = lock_dirs(shared.workload);
    let mut dirs = roots.clone();
    while let Some(dir) = dirs.pop() {
        let children = match zk.list_children(&dir).await {
            Ok(children) => children,
            Err(zookeeper_client::Error::NoNode) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        for c in children {
            if roots.contains(&dir) && (c == "leases" || c == "locks") {
                dirs.push(format!("{dir}/{c}"));
            } else {
                left.push(format!("{dir}/{c}"));
            }
        }
    }
    if shared.workload == Workload::Jobs {
        // The record's run ended: no run left going (or given up without its end).
        match zk.get_data(&format!("/distlock-jobs/{JOB}")).await {
            Ok((data, _)) if String::from_utf8_lossy(&data).contains("\"ended_ms\":null") => {
                left.push(format!("a run not ended: {}", String::from_utf8_lossy(&data)));
            }
            Ok(_) | Err(zookeeper_client::Error::NoNode) => {}
            Err(e) => return Err(e.into()),
        }
    }
    left.sort();
    shared.record(usize::MAX, 0, Kind::Audit(left));
    *shared.audited.lock().unwrap() = true;
    Ok(())
}

/// The outcome of one schedule.
struct Outcome {
    seed: u64,
    simulated: Duration,
    hash: u64,
    violations: Vec<String>,
    events: Vec<Event>,
    /// The wall time the schedule took.
    wall: Duration,
}

fn plant() -> Option<String> {
    std::env::var("DISTLOCK_SIM_PLANT").ok().filter(|p| !p.is_empty())
}

/// Runs the schedule of `seed` under `workload` and checks it.
fn run(seed: u64, workload: Workload) -> Outcome {
    let plan = schedule(seed);
    // The client's endpoint shuffling and back-off jitter draw from fastrand's thread-local
    // generator: seeded here, on the thread that runs the whole simulation.
    fastrand::seed(seed);
    let dir = tempfile::tempdir().expect("temporary directory");
    let shared = Arc::new(Shared {
        seed,
        workload,
        events: Mutex::new(Vec::new()),
        incarnations: Mutex::new(vec![0; plan.clients]),
        stopping: Mutex::new(false),
        quiet: Mutex::new(false),
        idle: Mutex::new(vec![false; plan.clients]),
        audited: Mutex::new(false),
        now: Mutex::new(Duration::ZERO),
    });
    let mut sim = turmoil::Builder::new()
        .simulation_duration(LIMIT + Duration::from_secs(30))
        .tick_duration(TICK)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(8))
        .ephemeral_ports(1024..=65535)
        .rng_seed(seed)
        .build();
    let config = distlock_server::Config {
        tick: Duration::from_millis(500),
        data_dir: plan.data_dir.then(|| dir.path().to_path_buf()),
        fsync: distlock_server::persist::Fsync::Never,
        snapshot_every: plan.snapshot_every,
        ..Default::default()
    };
    sim.host("server", move || {
        let config = config.clone();
        async move {
            let listener = turmoil::net::TcpListener::bind("0.0.0.0:2181").await?;
            distlock_server::Server::open(config)?.serve(listener, std::future::pending()).await;
            Ok(())
        }
    });
    for c in 0..plan.clients {
        let shared = shared.clone();
        sim.host(name(c), move || client_host(c, shared.clone()));
    }
    {
        let shared = shared.clone();
        sim.client("auditor", auditor(shared, plan.clients));
    }
    let mut violations = Vec::new();
    // (when, do or undo, the step)
    let mut actions: Vec<(Duration, bool, Step)> = Vec::new();
    for s in &plan.steps {
        actions.push((s.at, true, s.clone()));
        actions.push((s.at + s.lasting, false, s.clone()));
    }
    actions.sort_by_key(|(at, doing, _)| (*at, *doing));
    let mut next = 0;
    let heal_at = FAULTS + Duration::from_secs(6);
    let stop_at = heal_at + QUIET;
    let (mut healed, mut stopped) = (false, false);
    loop {
        let now = sim.elapsed();
        *shared.now.lock().unwrap() = now;
        while next < actions.len() && actions[next].0 <= now && now < heal_at {
            let (_, doing, step) = &actions[next];
            apply(&mut sim, &shared, step, *doing, plan.data_dir);
            next += 1;
        }
        if !healed && now >= heal_at {
            healed = true;
            heal(&mut sim, &shared, &plan);
            *shared.quiet.lock().unwrap() = true;
            shared.record(usize::MAX, 0, Kind::Healed);
        }
        if !stopped && now >= stop_at {
            stopped = true;
            *shared.stopping.lock().unwrap() = true;
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                violations.push(format!("the simulation failed: {e}"));
                break;
            }
        }
        if now > LIMIT {
            violations.push(format!("liveness: not every client was idle by {LIMIT:?}"));
            break;
        }
    }
    let simulated = sim.elapsed();
    let events = shared.events.lock().unwrap().clone();
    violations.extend(check(&events, workload, &plan, heal_at));
    let hash = trace_hash(&events);
    Outcome { seed, simulated, hash, violations, events, wall: Duration::ZERO }
}

fn apply(sim: &mut turmoil::Sim<'_>, shared: &Shared, step: &Step, doing: bool, data_dir: bool) {
    match (&step.fault, doing) {
        (Fault::Partition(c), true) => sim.partition(name(*c), "server"),
        (Fault::Partition(c), false) => sim.repair(name(*c), "server"),
        (Fault::PartitionToServer(c), true) => sim.partition_oneway(name(*c), "server"),
        (Fault::PartitionToServer(c), false) => sim.repair_oneway(name(*c), "server"),
        (Fault::PartitionFromServer(c), true) => sim.partition_oneway("server", name(*c)),
        (Fault::PartitionFromServer(c), false) => sim.repair_oneway("server", name(*c)),
        (Fault::Hold(c), true) => sim.hold(name(*c), "server"),
        (Fault::Hold(c), false) => sim.release(name(*c), "server"),
        (Fault::CrashClient(c), true) => {
            if sim.is_host_running(name(*c)) {
                sim.crash(name(*c));
                let inc = shared.incarnations.lock().unwrap()[*c];
                shared.record(*c, inc, Kind::Crashed);
            }
        }
        (Fault::CrashClient(c), false) => {
            if !sim.is_host_running(name(*c)) {
                sim.bounce(name(*c));
            }
        }
        (Fault::CrashServer, true) => {
            if sim.is_host_running("server") {
                sim.crash("server");
                shared.record(usize::MAX, 0, Kind::ServerDown { wiped: !data_dir });
            }
        }
        (Fault::CrashServer, false) => {
            if !sim.is_host_running("server") {
                sim.bounce("server");
                shared.record(usize::MAX, 0, Kind::ServerUp);
            }
        }
        (Fault::Slow(ms), true) => sim.set_max_message_latency(Duration::from_millis(*ms)),
        (Fault::Slow(_), false) => sim.set_max_message_latency(Duration::from_millis(8)),
    }
}

/// Every fault undone: links repaired and released, crashed hosts restarted.
fn heal(sim: &mut turmoil::Sim<'_>, shared: &Shared, plan: &Schedule) {
    for c in 0..plan.clients {
        sim.repair(name(c), "server");
        sim.release(name(c), "server");
        if !sim.is_host_running(name(c)) {
            sim.bounce(name(c));
        }
    }
    sim.set_max_message_latency(Duration::from_millis(8));
    if !sim.is_host_running("server") {
        sim.bounce("server");
        shared.record(usize::MAX, 0, Kind::ServerUp);
    }
}

/// What a client (one incarnation) holds now, as the checker sees it.
#[derive(Clone, Copy, Default)]
struct Hold {
    /// An exclusive hold: a mutex, a write lock, a lead (for a semaphore: a permit).
    exclusive: bool,
    read: bool,
}

/// Who holds: a client's incarnation.
type Who = (usize, u64);

/// The verdict on one run's events.
fn check(events: &[Event], workload: Workload, plan: &Schedule, heal_at: Duration) -> Vec<String> {
    let mut bad = Vec::new();
    // Holders now, per lock (the multi-lock's member index; 0 for the others). A wiped server
    // starts a new epoch: what was held before it is judged no more (the server forgot it), and
    // tokens start again.
    let mut holders: BTreeMap<(usize, Who), Hold> = BTreeMap::new();
    let mut last_token: BTreeMap<usize, u64> = BTreeMap::new();
    let mut granted_after_heal = vec![false; plan.clients];
    let mut audit = None;
    let mut wiped_down = false;
    let mut revocations = Revocations::default();
    let mut jobs = JobRuns::default();
    for e in events {
        let who = (e.client, e.incarnation);
        let at = |what: &str| format!("at {:?}: c{}.{} {what}", e.at, e.client, e.incarnation);
        bad.extend(revocations.overdue(e.at));
        revocations.see(e, who, heal_at);
        bad.extend(jobs.see(e, who));
        // The others holding `lock` exclusively (or also reading, unless `writers_only`).
        let others = |holders: &BTreeMap<(usize, Who), Hold>, lock: usize, writers_only: bool| -> Vec<String> {
            holders
                .iter()
                .filter(|((l, w), h)| *l == lock && *w != who && (h.exclusive || (!writers_only && h.read)))
                .map(|((_, (c, i)), h)| format!("c{c}.{i}{}", if h.exclusive { "" } else { " (reading)" }))
                .collect()
        };
        let grants: Vec<(usize, u64)> = match &e.kind {
            Kind::Granted(token) => vec![(0, *token)],
            Kind::GrantedMany(members) => members.clone(),
            _ => Vec::new(),
        };
        for (lock, token) in grants {
            let (held, limit) = match workload {
                Workload::Semaphore(n) => (others(&holders, lock, true), n as usize - 1),
                _ => (others(&holders, lock, false), 0),
            };
            if held.len() > limit {
                bad.push(at(&format!(
                    "granted lock {lock} while {held:?} still held it (not told lost): {} holders for {} permit(s)",
                    held.len() + 1,
                    limit + 1
                )));
            }
            if !matches!(workload, Workload::Semaphore(_)) {
                let last = last_token.entry(lock).or_default();
                if token <= *last {
                    bad.push(at(&format!("got fencing token {token} on lock {lock}, not above the last one, {last}")));
                }
                *last = (*last).max(token);
            }
            holders.entry((lock, who)).or_default().exclusive = true;
        }
        match &e.kind {
            Kind::GrantedRead => {
                let writers = others(&holders, 0, true);
                if !writers.is_empty() {
                    bad.push(at(&format!(
                        "granted a read lock while {writers:?} still held the write lock (not told lost)"
                    )));
                }
                holders.entry((0, who)).or_default().read = true;
            }
            Kind::Downgraded => holders.entry((0, who)).or_default().read = true,
            Kind::WriteReleasing => holders.entry((0, who)).or_default().exclusive = false,
            Kind::Releasing | Kind::Lost(_) | Kind::Crashed => holders.retain(|(_, w), _| *w != who),
            // A grant recorded while a wiped server is down was made by it before the crash (its
            // reply was on the way): the old epoch's, forgotten at the restart like the rest.
            Kind::ServerDown { wiped } => {
                wiped_down = *wiped;
                if *wiped {
                    holders.clear();
                    last_token.clear();
                }
            }
            Kind::ServerUp if wiped_down => {
                wiped_down = false;
                holders.clear();
                last_token.clear();
            }
            Kind::Broken(what) => bad.push(at(what)),
            Kind::Audit(left) => audit = Some(left.clone()),
            _ => {}
        }
        let granted = matches!(e.kind, Kind::Granted(_) | Kind::GrantedRead | Kind::GrantedMany(_));
        if granted && e.at >= heal_at && e.client < plan.clients {
            granted_after_heal[e.client] = true;
        }
    }
    bad.extend(revocations.overdue(events.last().map_or(Duration::ZERO, |e| e.at)));
    if workload == Workload::Jobs {
        // One run per slot, not one per client: every slot after the settling has its run.
        bad.extend(jobs.missing(heal_at + JOBS_SETTLE, heal_at + QUIET));
        granted_after_heal.fill(true);
    }
    for (c, granted) in granted_after_heal.iter().enumerate() {
        if !granted {
            bad.push(format!("liveness: c{c} was never granted in the {QUIET:?} after the faults stopped"));
        }
    }
    match audit {
        None => bad.push("no audit: the run did not reach its end".into()),
        Some(left) if !left.is_empty() => {
            bad.push(format!("left behind after every release: {left:?}"));
        }
        Some(_) => {}
    }
    bad
}

/// The revocation workload's promise: a holder asked to release has released (or was told lost)
/// within [`REVOKE_BOUND`] of the request, or of the faults' end if the request came before.
#[derive(Default)]
struct Revocations {
    /// Who holds each node (its sequence number), as its `Holding` said.
    holding: BTreeMap<u64, Who>,
    /// Holders asked to release: who, the node, and by when.
    asked: Vec<(Who, u64, Duration)>,
}

impl Revocations {
    fn see(&mut self, e: &Event, who: Who, heal_at: Duration) {
        match &e.kind {
            Kind::Holding(seq) => {
                self.holding.insert(*seq, who);
            }
            Kind::RevokeSent(seq) => {
                if let Some(&holder) = self.holding.get(seq) {
                    self.asked.push((holder, *seq, e.at.max(heal_at) + REVOKE_BOUND));
                }
            }
            Kind::Releasing | Kind::Lost(_) | Kind::Crashed => {
                self.holding.retain(|_, w| *w != who);
                self.asked.retain(|(w, _, _)| *w != who);
            }
            // The wiped server forgot every node (and every request).
            Kind::ServerDown { wiped: true } => {
                self.holding.clear();
                self.asked.clear();
            }
            _ => {}
        }
    }

    /// The requests not honoured by `now` (each reported once).
    fn overdue(&mut self, now: Duration) -> Vec<String> {
        let mut bad = Vec::new();
        self.asked.retain(|((c, i), seq, by)| {
            if now <= *by {
                return true;
            }
            bad.push(format!("revocation: c{c}.{i} still held node {seq} at {now:?}, asked to release it by {by:?}"));
            false
        });
        bad
    }
}

/// The jobs workload's promises (crate::schedule): at most one run per slot, runs that never
/// overlap (each ends by its `stop_by`, before the job can be another's), fencing tokens rising
/// from run to run; after healing, every slot run.
#[derive(Default)]
struct JobRuns {
    /// Each slot's run: who ran it, its token.
    slots: BTreeMap<u64, (Who, u64)>,
    /// The run going on now, if any.
    running: Option<Who>,
    last_token: u64,
}

impl JobRuns {
    fn see(&mut self, e: &Event, who: Who) -> Vec<String> {
        let mut bad = Vec::new();
        let at = |what: String| format!("at {:?}: c{}.{} {what}", e.at, e.client, e.incarnation);
        match &e.kind {
            Kind::JobRun { slot, token } => {
                if let Some(((c, i), t)) = self.slots.get(slot) {
                    bad.push(at(format!("ran slot {slot} (token {token}), already run by c{c}.{i} (token {t})")));
                }
                if let Some((c, i)) = self.running.filter(|w| *w != who) {
                    bad.push(at(format!("started a run (slot {slot}) while c{c}.{i}'s was going on")));
                }
                if *token <= self.last_token {
                    bad.push(at(format!("run token {token}, not above the last one, {}", self.last_token)));
                }
                self.last_token = self.last_token.max(*token);
                self.slots.insert(*slot, (who, *token));
                self.running = Some(who);
            }
            Kind::Releasing | Kind::Crashed if self.running == Some(who) => self.running = None,
            // A server that lost its data lost the record: a slot may run again (the contract's
            // limit), but not the tokens' rise (they follow the server's clock).
            Kind::ServerDown { wiped: true } => {
                self.slots.clear();
                self.running = None;
            }
            _ => {}
        }
        bad
    }

    /// The slots wholly within `from..to` (simulated time) without a run.
    fn missing(&self, from: Duration, to: Duration) -> Vec<String> {
        let slot_ms = SLOT.as_millis() as u64;
        let first = (SIM_EPOCH_MS + from.as_millis() as u64).div_ceil(slot_ms);
        let last = (SIM_EPOCH_MS + to.as_millis() as u64) / slot_ms;
        (first..last)
            .filter(|s| !self.slots.contains_key(s))
            .map(|s| {
                let start = Duration::from_millis(s * slot_ms - SIM_EPOCH_MS);
                format!("liveness: slot {s} (from {start:?}) after healing had no run")
            })
            .collect()
    }
}

/// FNV-1a over the events' text: the same seed must give the same hash.
fn trace_hash(events: &[Event]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for e in events {
        for b in format!("{e:?}\n").bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().map(|v| v.trim().parse().unwrap_or_else(|_| panic!("{key}={v} is not a number")))
}

/// With `DISTLOCK_SIM_LOG=FILTER` (e.g. `distlock=debug,zookeeper_client=debug`), one schedule's
/// log lines, each stamped with its simulated time.
fn log_one_schedule() {
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            let at = turmoil::sim_elapsed().unwrap_or_default();
            write!(w, "{:>9.3}s", at.as_secs_f64())
        }
    }
    let Ok(filter) = std::env::var("DISTLOCK_SIM_LOG") else { return };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_timer(SimTime)
        .with_ansi(false)
        .try_init();
}

/// Simulations side by side: `DISTLOCK_SIM_THREADS`, else the machine's cores.
fn threads() -> usize {
    env_u64("DISTLOCK_SIM_THREADS")
        .map(|n| n as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Runs `seeds` (each with its workload) on `threads` threads side by side; returns the outcomes
/// in seed order.
fn run_many(seeds: Vec<(u64, Workload)>, threads: usize) -> Vec<Outcome> {
    // The planted-defects test's children stop handing out seeds after the first failure.
    let stop_at_first = std::env::var_os("DISTLOCK_SIM_STOP_AT_FIRST").is_some();
    let seeds = Arc::new(seeds);
    let next = Arc::new(AtomicUsize::new(0));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (seeds, next, outcomes) = (seeds.clone(), next.clone(), outcomes.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(seed, workload)) = seeds.get(i) else { break };
                let started = Instant::now();
                let mut outcome = run(seed, workload);
                outcome.wall = started.elapsed();
                if stop_at_first && !outcome.violations.is_empty() {
                    next.store(usize::MAX / 2, Ordering::SeqCst);
                }
                outcomes.lock().unwrap().push(outcome);
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a simulation thread panicked");
    }
    let mut all = std::mem::take(&mut *outcomes.lock().unwrap());
    all.sort_by_key(|o| o.seed);
    all
}

/// The test body: one seed (`DISTLOCK_SIM_SEED`) or many; prints the summary line and every
/// failing seed's replay command.
fn simulate(test: &str, workload: Workload, default_seeds: u64, first_seed: u64) {
    let started = Instant::now();
    let one = env_u64("DISTLOCK_SIM_SEED");
    if one.is_some() {
        log_one_schedule();
    }
    let seeds: Vec<u64> = match one {
        Some(s) => vec![s],
        None => {
            let n = env_u64("DISTLOCK_SIM_SEEDS").unwrap_or(default_seeds);
            (first_seed..first_seed + n).collect()
        }
    };
    let outcomes = run_many(seeds.into_iter().map(|s| (s, workload)).collect(), threads());
    let simulated: Duration = outcomes.iter().map(|o| o.simulated).sum();
    let plant = plant().map(|p| format!("DISTLOCK_SIM_PLANT={p} ")).unwrap_or_default();
    let mut failed = Vec::new();
    for o in &outcomes {
        if one.is_some() {
            for e in &o.events {
                println!("  {:>9.3}s c{}.{} {:?}", e.at.as_secs_f64(), e.client as i64, e.incarnation, e.kind);
            }
            println!("simulation trace hash: {:016x}", o.hash);
        }
        if !o.violations.is_empty() {
            let mut text = format!("seed {} ({:?}):\n", o.seed, schedule(o.seed));
            for v in &o.violations {
                let _ = writeln!(text, "  {v}");
            }
            let _ = writeln!(text, "  replay: DISTLOCK_SIM_SEED={} {plant}scripts/sim.sh {test}", o.seed);
            failed.push(text);
        }
    }
    // Each seed's trace hash, one line each, to compare two processes' runs.
    if let Ok(file) = std::env::var("DISTLOCK_SIM_HASHES") {
        let lines: String =
            outcomes.iter().map(|o| format!("{} {:016x} {}\n", o.seed, o.hash, o.simulated.as_millis())).collect();
        std::fs::write(&file, lines).expect("DISTLOCK_SIM_HASHES: the file");
    }
    let slowest = outcomes.iter().max_by_key(|o| o.wall);
    println!(
        "simulation: {} schedules, {} simulated seconds, {:.1} wall seconds (slowest: seed {}, {:.1} s)",
        outcomes.len(),
        simulated.as_secs(),
        started.elapsed().as_secs_f64(),
        slowest.map_or(0, |o| o.seed),
        slowest.map_or(0.0, |o| o.wall.as_secs_f64())
    );
    if !failed.is_empty() {
        let first = failed.iter().take(5).cloned().collect::<String>();
        panic!("{} of {} schedules failed ({test}):\n{first}", failed.len(), outcomes.len());
    }
}

/// Every workload's test: its name, workload, default seeds and first seed.
const WORKLOADS: &[(&str, Workload, u64, u64)] = &[
    ("simulation_mutex", Workload::Mutex, 200, 1),
    ("simulation_semaphore", Workload::Semaphore(2), 150, 1_000_001),
    ("simulation_rwlock", Workload::RwLock, 150, 2_000_001),
    ("simulation_election", Workload::Election, 100, 3_000_001),
    ("simulation_reentrant", Workload::Reentrant, 100, 4_000_001),
    ("simulation_multilock", Workload::Multi, 100, 5_000_001),
    ("simulation_revocation", Workload::Revocation, 50, 6_000_001),
    ("simulation_jobs", Workload::Jobs, 150, 7_000_001),
];

/// The test body of the workload named `test` in [`WORKLOADS`].
fn simulate_workload(test: &str) {
    let (_, workload, seeds, first) =
        *WORKLOADS.iter().find(|w| w.0 == test).unwrap_or_else(|| panic!("{test} is not in WORKLOADS"));
    simulate(test, workload, seeds, first);
}

#[test]
fn simulation_mutex() {
    simulate_workload("simulation_mutex");
}

#[test]
fn simulation_semaphore() {
    simulate_workload("simulation_semaphore");
}

#[test]
fn simulation_rwlock() {
    simulate_workload("simulation_rwlock");
}

#[test]
fn simulation_election() {
    simulate_workload("simulation_election");
}

#[test]
fn simulation_reentrant() {
    simulate_workload("simulation_reentrant");
}

#[test]
fn simulation_multilock() {
    simulate_workload("simulation_multilock");
}

#[test]
fn simulation_revocation() {
    simulate_workload("simulation_revocation");
}

#[test]
fn simulation_jobs() {
    simulate_workload("simulation_jobs");
}

/// Seeds that once failed, each kept in its workload whatever the default range: the semaphore's
/// permit handed out after its session had expired (its gate's release waited out a one-way
/// partition longer than the session; fixed in `Semaphore::acquire_with`).
#[test]
fn simulation_regressions() {
    if env_u64("DISTLOCK_SIM_SEED").is_some() || plant().is_some() {
        return;
    }
    let mut bad = Vec::new();
    for (workload, seed) in REGRESSIONS {
        let o = run(*seed, *workload);
        bad.extend(o.violations.iter().map(|v| format!("seed {seed} ({workload:?}): {v}")));
    }
    assert!(bad.is_empty(), "regression seeds failed:\n{}", bad.join("\n"));
}

const REGRESSIONS: &[(Workload, u64)] = &[
    (Workload::Semaphore(2), 1_000_337),
    (Workload::Semaphore(2), 1_000_418),
    (Workload::Semaphore(2), 1_000_509),
    (Workload::Semaphore(2), 1_000_529),
    (Workload::Semaphore(2), 1_000_561),
];

/// Every seed's trace is its own, whatever ran before it (the replay of a failure found in a
/// batch): a few seeds of every workload run in one batch (mixed, on two threads), again on this
/// thread in the opposite order, and each alone in a child process; all three traces must agree.
/// `DISTLOCK_SIM_DETERMINISM_SEEDS=N`: how many seeds (default 32).
#[test]
fn simulation_seed_alone_same_trace() {
    if env_u64("DISTLOCK_SIM_SEED").is_some() || plant().is_some() {
        return;
    }
    let started = Instant::now();
    let n = env_u64("DISTLOCK_SIM_DETERMINISM_SEEDS").unwrap_or(32) as usize;
    let picks: Vec<(u64, Workload, &str)> = (0..n)
        .map(|i| {
            let (test, workload, _, first) = WORKLOADS[i % WORKLOADS.len()];
            (first + (i / WORKLOADS.len()) as u64, workload, test)
        })
        .collect();
    let batch = run_many(picks.iter().map(|(s, w, _)| (*s, *w)).collect(), 2);
    let batch: BTreeMap<u64, u64> = batch.iter().map(|o| (o.seed, o.hash)).collect();
    let reversed: BTreeMap<u64, u64> = picks.iter().rev().map(|(s, w, _)| (*s, run(*s, *w).hash)).collect();
    let exe = std::env::current_exe().expect("this test binary");
    let mut differ = Vec::new();
    for (seed, _, test) in &picks {
        let out = std::process::Command::new(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env("DISTLOCK_SIM_SEED", seed.to_string())
            .env_remove("DISTLOCK_SIM_LOG")
            .output()
            .expect("the child run");
        let text = String::from_utf8_lossy(&out.stdout);
        let alone = text
            .lines()
            .find_map(|l| l.strip_prefix("simulation trace hash: "))
            .and_then(|h| u64::from_str_radix(h.trim(), 16).ok());
        let (b, r) = (batch[seed], reversed[seed]);
        if alone != Some(b) || r != b {
            differ.push(format!(
                "seed {seed} ({test}): {b:016x} in the batch, {r:016x} in the reversed batch, {} alone",
                alone.map_or("none".to_string(), |h| format!("{h:016x}"))
            ));
        }
    }
    println!(
        "simulation determinism: {n} seeds, {} with the same trace in a batch, in the reversed batch and alone ({:.1} wall seconds)",
        n - differ.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        differ.is_empty(),
        "{} of {n} seeds' traces depend on what ran before:\n{}",
        differ.len(),
        differ.join("\n")
    );
}

/// The planted defects (docs/reliability.md): each found within its number of seeds, in a child
/// run of this binary with `DISTLOCK_SIM_PLANT` set. A regression check on the simulation itself.
#[test]
fn simulation_finds_planted_defects() {
    if env_u64("DISTLOCK_SIM_SEED").is_some() || plant().is_some() {
        return;
    }
    let exe = std::env::current_exe().expect("this test binary");
    for (plant, test, seeds) in PLANTS {
        let started = Instant::now();
        let out = std::process::Command::new(&exe)
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env("DISTLOCK_SIM_PLANT", plant)
            .env("DISTLOCK_SIM_STOP_AT_FIRST", "1")
            .env("DISTLOCK_SIM_SEEDS", seeds.to_string())
            .output()
            .expect("the child run");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let found = text.lines().find(|l| l.contains("schedules failed")).unwrap_or("").to_string();
        println!("plant {plant}: {found} ({:.1} s)", started.elapsed().as_secs_f64());
        assert!(
            !out.status.success() && text.contains("replay: DISTLOCK_SIM_SEED="),
            "DISTLOCK_SIM_PLANT={plant} was not found in {seeds} seeds:\n{text}"
        );
    }
}

/// Each planted defect, the test that must find it, and within how many of its default seeds.
const PLANTS: &[(&str, &str, u64)] = &[
    ("release-leak", "simulation_mutex", 40),
    ("snapshot-session", "simulation_mutex", 60),
    ("semaphore-lost-permit", "simulation_semaphore", 400),
];
