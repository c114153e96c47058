//! The simulation's workloads on the in-process store (issue 54, item 5): clients contend for a
//! mutex, a semaphore of 2 permits, or a read/write lock on tokio's paused clock, while a seeded
//! schedule cuts clients off ([`Client::partition`](super::Client::partition)) and heals them.
//! The checker is crates/distlock-sim's: no grant beside a holder not yet told `lost()`
//! (permits for a semaphore, readers beside readers only), tokens rising for exclusive holds,
//! every client granted once the faults stop. One thread runs each seed, so the order of the
//! events is the order they happened.

use crate::Client;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;
use tokio::time::Instant;

/// The store's lease: short, so that cut-off holders run out within a schedule.
const LEASE: Duration = Duration::from_secs(2);
const FAULTS: Duration = Duration::from_secs(30);
const QUIET: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Mutex,
    Semaphore,
    RwLock,
}

#[derive(Debug)]
enum Event {
    /// Exclusive (a mutex, a writer) with its token, or a permit.
    Granted(usize, u64),
    GrantedRead(usize),
    /// The hold ends (a release about to be sent, or the loss told).
    Ended(usize),
    LostAtGrant(usize),
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

type Log = Rc<RefCell<Vec<(Duration, Event)>>>;

async fn contend(c: Client, id: usize, kind: Kind, seed: u64, start: Instant, log: Log) -> bool {
    let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(id as u64));
    let record = |e| log.borrow_mut().push((start.elapsed(), e));
    let mut granted_after = false;
    while start.elapsed() < FAULTS + QUIET {
        let quiet = start.elapsed() >= FAULTS + LEASE * 2;
        let write = kind == Kind::RwLock && rng.next() % 100 < 40;
        let lock = match kind {
            Kind::Mutex => c.mutex("sim"),
            Kind::Semaphore => c.semaphore_permit("sim", 2),
            Kind::RwLock if write => c.write_lock("sim"),
            Kind::RwLock => c.read_lock("sim"),
        }
        .unwrap();
        let (wait, hold) = (rng.ms(100, 5000), rng.ms(5, 1500));
        let got = if quiet { lock.lock().await.map(Some) } else { lock.lock_timeout(wait).await };
        let Ok(Some(guard)) = got else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        granted_after |= quiet;
        if guard.state().is_lost() {
            record(Event::LostAtGrant(id));
        }
        match kind {
            Kind::RwLock if !write => record(Event::GrantedRead(id)),
            Kind::Semaphore => record(Event::Granted(id, 0)),
            _ => record(Event::Granted(id, guard.fencing_token())),
        }
        tokio::select! {
            biased;
            _ = guard.lost() => record(Event::Ended(id)),
            _ = tokio::time::sleep(hold) => {
                record(Event::Ended(id));
                let _ = guard.release().await;
            }
        }
    }
    granted_after
}

fn check(seed: u64, kind: Kind, log: &[(Duration, Event)]) -> Vec<String> {
    let mut bad = Vec::new();
    // client -> exclusive (true) or read (false)
    let mut holders: BTreeMap<usize, bool> = BTreeMap::new();
    let mut last = 0;
    for (at, e) in log {
        match e {
            Event::Granted(id, token) => {
                let limit = if kind == Kind::Semaphore { 1 } else { 0 };
                if holders.len() > limit {
                    bad.push(format!("seed {seed} at {at:?}: c{id} granted beside {holders:?}"));
                }
                if kind != Kind::Semaphore {
                    if *token <= last {
                        bad.push(format!("seed {seed} at {at:?}: c{id} token {token} not above {last}"));
                    }
                    last = *token;
                }
                holders.insert(*id, true);
            }
            Event::GrantedRead(id) => {
                if holders.values().any(|w| *w) {
                    bad.push(format!("seed {seed} at {at:?}: c{id} read beside a writer {holders:?}"));
                }
                holders.insert(*id, false);
            }
            Event::Ended(id) => {
                holders.remove(id);
            }
            Event::LostAtGrant(id) => bad.push(format!("seed {seed} at {at:?}: c{id} was handed a guard already lost")),
        }
    }
    bad
}

/// One seed: three clients of one store, a schedule of cut-offs (some past the lease), then quiet.
async fn run(seed: u64, kind: Kind) -> Vec<String> {
    let url = format!("memory://sim-{kind:?}-{seed}?lease={}ms", LEASE.as_millis());
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(crate::connect(&url).await.unwrap());
    }
    let (start, log): (Instant, Log) = (Instant::now(), Log::default());
    let local = tokio::task::LocalSet::new();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(id, c)| local.spawn_local(contend(c.clone(), id, kind, seed, start, log.clone())))
        .collect();
    let cuts: Vec<super::Client> = clients.iter().map(|c| c.downcast::<super::Client>().unwrap().clone()).collect();
    local
        .run_until(async {
            let mut rng = Rng(seed);
            while start.elapsed() < FAULTS {
                tokio::time::sleep(rng.ms(200, 3000)).await;
                let victim = &cuts[(rng.next() % 3) as usize];
                victim.partition();
                tokio::time::sleep(rng.ms(100, 3 * LEASE.as_millis() as u64)).await;
                victim.heal();
            }
            let mut bad = Vec::new();
            for (id, t) in tasks.into_iter().enumerate() {
                if !t.await.unwrap() {
                    bad.push(format!("seed {seed}: c{id} was never granted once the faults stopped"));
                }
            }
            bad.extend(check(seed, kind, &log.borrow()));
            bad
        })
        .await
}

fn simulate(kind: Kind, first: u64, seeds: u64) {
    let mut bad = Vec::new();
    for seed in first..first + seeds {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        bad.extend(rt.block_on(run(seed, kind)));
    }
    assert!(bad.is_empty(), "{} violations on memory:// ({kind:?}):\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn memory_mutex_under_cut_offs() {
    simulate(Kind::Mutex, 1, 100);
}

#[test]
fn memory_semaphore_under_cut_offs() {
    simulate(Kind::Semaphore, 1_000_001, 100);
}

#[test]
fn memory_rwlock_under_cut_offs() {
    simulate(Kind::RwLock, 2_000_001, 100);
}

/// The checker can fail: a holder whose loss is never recorded makes the next grant a violation.
#[test]
fn the_memory_checker_fails_an_overlap() {
    let log = [(Duration::ZERO, Event::Granted(0, 1)), (Duration::from_secs(1), Event::Granted(1, 2))];
    assert_eq!(check(9, Kind::Mutex, &log).len(), 1);
}
