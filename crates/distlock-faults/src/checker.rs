//! The fenced-resource checker: did two clients ever believe they held the lock at once, and did
//! the protected resource accept a write from an older holder?
//!
//! Clients record *believed-hold intervals* (from the moment an acquire returned to the moment
//! they released or learnt the lock was lost) and the writes they make with their fencing token.
//! Timestamps come from `CLOCK_MONOTONIC` ([`mono_now`]), which every process on one host shares,
//! so intervals measured in child processes can be merged with [`FencedResource::record_hold`].

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Nanoseconds of `CLOCK_MONOTONIC`: the same clock for every process on this host, never set
/// back, not advanced by wall-clock adjustments.
///
/// # Examples
///
/// ```
/// let a = distlock_faults::mono_now();
/// let b = distlock_faults::mono_now();
/// assert!(b >= a);
/// ```
pub fn mono_now() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed: {}", std::io::Error::last_os_error());
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// How a hold uses the resource.
///
/// # Examples
///
/// ```
/// use distlock_faults::{FencedResource, Mode};
///
/// let rw = FencedResource::new(false, 1);
/// let a = rw.begin(1, Mode::Shared, 1);
/// let b = rw.begin(2, Mode::Shared, 2); // readers may overlap
/// rw.end(a);
/// rw.end(b);
/// assert!(rw.report().is_clean());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// A mutex hold, a write lock or one semaphore permit: at most `permits` at a time, and never
    /// together with a [`Mode::Shared`] hold.
    Exclusive,
    /// A read lock: overlaps other shared holds freely, never an exclusive one.
    Shared,
}

/// One believed-hold interval, as reported in [`Report::overlaps`].
///
/// Times are [`mono_now`] nanoseconds. A hold that has not ended yet has `end_ns == u64::MAX`
/// ([`Hold::is_open`]); the checker treats it as lasting until the report was made.
///
/// # Examples
///
/// ```
/// use distlock_faults::{FencedResource, Mode};
///
/// let r = FencedResource::new(false, 1);
/// r.record_hold(1, Mode::Exclusive, 5, 100, 300);
/// r.record_hold(2, Mode::Exclusive, 6, 200, 400);
/// let (first, second) = r.report().overlaps[0];
/// assert_eq!((first.client, first.token, first.start_ns, first.end_ns), (1, 5, 100, 300));
/// assert_eq!((second.client, second.mode), (2, Mode::Exclusive));
/// assert!(!second.is_open());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The client that believed it held the lock.
    pub client: usize,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The fencing token of that hold.
    pub token: u64,
    /// When the hold began ([`mono_now`] nanoseconds).
    pub start_ns: u64,
    /// When it ended, or `u64::MAX` while it is still open.
    pub end_ns: u64,
}

impl Hold {
    /// True while the hold has not ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{Hold, Mode};
    /// let h = Hold { client: 0, mode: Mode::Shared, token: 1, start_ns: 5, end_ns: u64::MAX };
    /// assert!(h.is_open());
    /// ```
    pub fn is_open(&self) -> bool {
        self.end_ns == u64::MAX
    }
}

/// Names a hold begun with [`FencedResource::begin`], to end it with [`FencedResource::end`].
///
/// # Examples
///
/// ```
/// use distlock_faults::{FencedResource, HoldId, Mode};
///
/// let r = FencedResource::new(true, 1);
/// let id: HoldId = r.begin(3, Mode::Exclusive, 42);
/// r.end(id);
/// assert_eq!(r.report().holds, 1);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HoldId(usize);

/// One write made to a [`FencedResource`], as listed by [`FencedResource::write_log`].
///
/// # Examples
///
/// ```
/// use distlock_faults::FencedResource;
///
/// let r = FencedResource::new(true, 1);
/// r.write(1, 7, 0);
/// r.write(2, 6, 1); // older token: rejected
/// let log = r.write_log();
/// assert!(log[0].accepted && !log[1].accepted);
/// assert_eq!((log[1].client, log[1].token, log[1].seq), (2, 6, 1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRecord {
    /// The writing client.
    pub client: usize,
    /// The fencing token it presented.
    pub token: u64,
    /// The caller's sequence number for this write (for example a per-client counter).
    pub seq: u64,
    /// When the write arrived ([`mono_now`] nanoseconds).
    pub at_ns: u64,
    /// Whether the resource accepted it.
    pub accepted: bool,
    /// Whether its token was lower than the highest token seen before it.
    pub stale: bool,
}

/// The result of checking a [`FencedResource`]; see [`Report::is_clean`].
///
/// # Examples
///
/// ```
/// use distlock_faults::{FencedResource, Mode};
///
/// let r = FencedResource::new(false, 1);
/// r.write(1, 9, 0);
/// r.write(2, 8, 0); // unfenced: accepted although stale
/// let report = r.report();
/// assert_eq!(report.stale_accepted, 1);
/// assert!(!report.is_clean());
/// assert_eq!(
///     report.to_string(),
///     "holds=0 overlaps=0 writes=2 stale_accepted=1 stale_rejected=0 max_token=9"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Number of holds recorded (open or ended).
    pub holds: usize,
    /// Pairs of holds that broke the mode/permit rule, the earlier-starting one first. With one
    /// permit every overlapping pair is listed; with `n` permits, each hold that started while
    /// `n` exclusive holds were already open is paired with each of them.
    pub overlaps: Vec<(Hold, Hold)>,
    /// Number of writes recorded.
    pub writes: usize,
    /// Writes accepted although their token was below the highest token seen (unfenced only).
    pub stale_accepted: usize,
    /// Writes rejected because their token was below the highest token accepted (fenced only).
    pub stale_rejected: usize,
    /// The highest token the resource accepted a write with (0 when none).
    pub max_token: u64,
}

impl Report {
    /// No overlapping holds and no stale write accepted.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::FencedResource;
    ///
    /// let r = FencedResource::new(true, 1);
    /// r.write(1, 9, 0);
    /// assert!(!r.write(2, 8, 0)); // fenced: the stale write is rejected, which is clean
    /// assert!(r.report().is_clean());
    /// ```
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.stale_accepted == 0
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "holds={} overlaps={} writes={} stale_accepted={} stale_rejected={} max_token={}",
            self.holds,
            self.overlaps.len(),
            self.writes,
            self.stale_accepted,
            self.stale_rejected,
            self.max_token
        )
    }
}

/// The protected resource of a lock test: it records believed-hold intervals and fenced writes,
/// and reports what went wrong.
///
/// Share it between tasks and threads as the `Arc` that [`FencedResource::new`] returns; every
/// method takes `&self`.
///
/// Rules checked by [`FencedResource::report`]:
/// - at most `permits` [`Mode::Exclusive`] holds are open at any instant;
/// - a [`Mode::Shared`] hold never overlaps an exclusive hold of *another* client (the same
///   client holding both is a downgrade, which is allowed);
/// - intervals are half-open: a hold ending at the instant another begins does not overlap it.
///
/// Record one hold per acquisition that takes a permit: a reentrant re-acquisition by the holder
/// is not a new hold.
///
/// Writes ([`FencedResource::write`]): when `fenced`, a write whose token is below the highest
/// token accepted so far is rejected, as a fencing storage would; when not fenced, every write is
/// accepted and the stale ones are counted, to show what fencing prevents.
///
/// # Examples
///
/// ```
/// use distlock_faults::{FencedResource, Mode};
///
/// let resource = FencedResource::new(true, 1);
/// let first = resource.begin(1, Mode::Exclusive, 10);
/// let second = resource.begin(2, Mode::Exclusive, 11); // overlaps the first: a violation
/// assert!(resource.write(2, 11, 0));
/// assert!(!resource.write(1, 10, 0)); // the paused old holder is fenced off
/// resource.end(first);
/// resource.end(second);
///
/// let report = resource.report();
/// assert_eq!(report.overlaps.len(), 1);
/// assert_eq!(report.stale_rejected, 1);
/// assert!(!report.is_clean());
/// println!("{report}");
/// ```
#[derive(Debug)]
pub struct FencedResource {
    fenced: bool,
    permits: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    holds: Vec<Hold>,
    writes: Vec<WriteRecord>,
    max_token: u64,
    stale_accepted: usize,
    stale_rejected: usize,
}

impl FencedResource {
    /// A new resource: `fenced` decides whether stale writes are rejected; `permits` is how many
    /// exclusive holds may overlap (1 for a mutex or write lock, `n` for an `n`-permit semaphore).
    ///
    /// # Panics
    ///
    /// If `permits` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// let semaphore = distlock_faults::FencedResource::new(true, 3);
    /// assert!(semaphore.report().is_clean());
    /// ```
    pub fn new(fenced: bool, permits: usize) -> Arc<FencedResource> {
        assert!(permits > 0, "FencedResource::new: permits must be at least 1");
        Arc::new(FencedResource { fenced, permits, state: Mutex::new(State::default()) })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the report from the others.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records that `client` believes, from now on, that it holds the lock in `mode` with
    /// fencing token `token`. End the hold with [`FencedResource::end`].
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{FencedResource, Mode};
    ///
    /// let r = FencedResource::new(true, 1);
    /// let _still_open = r.begin(1, Mode::Exclusive, 1);
    /// let _overlapping = r.begin(2, Mode::Exclusive, 2);
    /// assert_eq!(r.report().overlaps.len(), 1); // open holds count as open until now
    /// ```
    pub fn begin(&self, client: usize, mode: Mode, token: u64) -> HoldId {
        let mut state = self.state();
        state.holds.push(Hold { client, mode, token, start_ns: mono_now(), end_ns: u64::MAX });
        HoldId(state.holds.len() - 1)
    }

    /// Records that the hold `id` ended now. Ending a hold twice keeps the first end.
    ///
    /// # Panics
    ///
    /// If `id` came from another `FencedResource`.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{FencedResource, Mode};
    ///
    /// let r = FencedResource::new(true, 1);
    /// let a = r.begin(1, Mode::Exclusive, 1);
    /// r.end(a);
    /// let b = r.begin(2, Mode::Exclusive, 2);
    /// r.end(b);
    /// assert!(r.report().is_clean());
    /// ```
    pub fn end(&self, id: HoldId) {
        self.end_at(id, mono_now());
    }

    /// Ends the hold `id` at `end_ns` (a [`mono_now`] time already past, for example the lease
    /// deadline the holder's lock reported when its loss is seen later), never before it began.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{mono_now, FencedResource, Mode};
    ///
    /// let r = FencedResource::new(true, 1);
    /// let id = r.begin(1, Mode::Exclusive, 1);
    /// let ended = mono_now();
    /// r.begin(2, Mode::Exclusive, 2); // begins after `ended`
    /// r.end_at(id, ended);
    /// assert!(r.report().is_clean());
    /// ```
    pub fn end_at(&self, id: HoldId, end_ns: u64) {
        let mut state = self.state();
        let hold = state.holds.get_mut(id.0).expect("FencedResource::end: HoldId from another FencedResource");
        if hold.is_open() {
            hold.end_ns = end_ns.max(hold.start_ns);
        }
    }

    /// Records a complete hold measured elsewhere (for example in a child process, with
    /// [`mono_now`] timestamps). `end_ns` may be `u64::MAX` for a hold that never ended.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{FencedResource, Mode};
    ///
    /// let r = FencedResource::new(false, 1);
    /// r.record_hold(1, Mode::Exclusive, 1, 1_000, 2_000);
    /// r.record_hold(2, Mode::Exclusive, 2, 2_000, 3_000); // starts as the first ends: fine
    /// assert!(r.report().is_clean());
    /// ```
    pub fn record_hold(&self, client: usize, mode: Mode, token: u64, start_ns: u64, end_ns: u64) {
        let end_ns = end_ns.max(start_ns);
        self.state().holds.push(Hold { client, mode, token, start_ns, end_ns });
    }

    /// A write by `client` with fencing token `token`; `seq` is the caller's own sequence number
    /// for it. Returns whether the resource accepted it.
    ///
    /// Fenced: rejected when `token` is below the highest token accepted so far (an equal token
    /// is accepted: one holder writes many times). Unfenced: always accepted, and counted as a
    /// stale write accepted when `token` is below the highest token seen. Every write is logged.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::FencedResource;
    ///
    /// let r = FencedResource::new(true, 1);
    /// assert!(r.write(1, 5, 0));
    /// assert!(r.write(1, 5, 1));
    /// assert!(!r.write(2, 4, 0));
    /// ```
    pub fn write(&self, client: usize, token: u64, seq: u64) -> bool {
        let at_ns = mono_now();
        let mut state = self.state();
        let stale = token < state.max_token;
        let accepted = !(self.fenced && stale);
        if accepted {
            state.max_token = state.max_token.max(token);
            if stale {
                state.stale_accepted += 1;
            }
        } else {
            state.stale_rejected += 1;
        }
        state.writes.push(WriteRecord { client, token, seq, at_ns, accepted, stale });
        accepted
    }

    /// Every write so far, in arrival order.
    ///
    /// # Examples
    ///
    /// ```
    /// let r = distlock_faults::FencedResource::new(true, 1);
    /// r.write(1, 1, 0);
    /// assert_eq!(r.write_log().len(), 1);
    /// ```
    pub fn write_log(&self) -> Vec<WriteRecord> {
        self.state().writes.clone()
    }

    /// Checks everything recorded so far; holds still open count as open until now.
    ///
    /// # Examples
    ///
    /// ```
    /// use distlock_faults::{FencedResource, Mode};
    ///
    /// let r = FencedResource::new(true, 2);
    /// r.record_hold(1, Mode::Exclusive, 1, 0, 10);
    /// r.record_hold(2, Mode::Exclusive, 2, 1, 10);
    /// r.record_hold(3, Mode::Exclusive, 3, 2, 10); // a third permit: violation
    /// let report = r.report();
    /// assert_eq!(report.holds, 3);
    /// assert!(!report.is_clean());
    /// assert!(report.overlaps.iter().all(|(_, later)| later.client == 3));
    /// ```
    pub fn report(&self) -> Report {
        let now = mono_now();
        let state = self.state();
        Report {
            holds: state.holds.len(),
            overlaps: find_overlaps(&state.holds, self.permits, now),
            writes: state.writes.len(),
            stale_accepted: state.stale_accepted,
            stale_rejected: state.stale_rejected,
            max_token: state.max_token,
        }
    }
}

/// Sweeps the holds' endpoints in time order (ends before starts at the same instant, so that
/// intervals are half-open) and, at each start, pairs the new hold with the open holds it
/// conflicts with. Cost: O(h log h) plus the open holds visited at each start.
fn find_overlaps(holds: &[Hold], permits: usize, now: u64) -> Vec<(Hold, Hold)> {
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum Kind {
        End,
        Start,
    }
    let mut events: Vec<(u64, Kind, usize)> = Vec::with_capacity(holds.len() * 2);
    for (i, h) in holds.iter().enumerate() {
        let end = if h.is_open() { now.max(h.start_ns) } else { h.end_ns };
        if end == h.start_ns {
            continue; // empty interval: overlaps nothing
        }
        events.push((h.start_ns, Kind::Start, i));
        events.push((end, Kind::End, i));
    }
    events.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)).then_with(|| a.2.cmp(&b.2)));

    // Open holds by index; BTreeSet keeps the report deterministic (earlier-recorded first).
    let mut exclusive: BTreeSet<usize> = BTreeSet::new();
    let mut shared: BTreeSet<usize> = BTreeSet::new();
    let mut overlaps = Vec::new();
    let earlier_first = |a: usize, b: usize| -> (Hold, Hold) {
        let (ha, hb) = (holds[a], holds[b]);
        match ha.start_ns.cmp(&hb.start_ns).then(a.cmp(&b)) {
            Ordering::Greater => (hb, ha),
            _ => (ha, hb),
        }
    };
    for (_, kind, i) in events {
        let hold = holds[i];
        match (kind, hold.mode) {
            (Kind::End, Mode::Exclusive) => {
                exclusive.remove(&i);
            }
            (Kind::End, Mode::Shared) => {
                shared.remove(&i);
            }
            (Kind::Start, Mode::Exclusive) => {
                for &s in &shared {
                    if holds[s].client != hold.client {
                        overlaps.push(earlier_first(s, i));
                    }
                }
                if exclusive.len() >= permits {
                    overlaps.extend(exclusive.iter().map(|&x| earlier_first(x, i)));
                }
                exclusive.insert(i);
            }
            (Kind::Start, Mode::Shared) => {
                for &x in &exclusive {
                    if holds[x].client != hold.client {
                        overlaps.push(earlier_first(x, i));
                    }
                }
                shared.insert(i);
            }
        }
    }
    overlaps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disjoint_exclusive_holds_are_clean() {
        let r = FencedResource::new(true, 1);
        for (i, start) in [0u64, 10, 20, 30].into_iter().enumerate() {
            r.record_hold(i, Mode::Exclusive, i as u64 + 1, start, start + 10);
        }
        let report = r.report();
        assert_eq!(report.holds, 4);
        assert!(report.is_clean(), "{report}");
    }

    #[test]
    fn overlapping_exclusive_holds_are_reported() {
        let r = FencedResource::new(true, 1);
        r.record_hold(1, Mode::Exclusive, 1, 0, 100);
        r.record_hold(2, Mode::Exclusive, 2, 50, 150);
        r.record_hold(3, Mode::Exclusive, 3, 150, 200);
        let report = r.report();
        assert!(!report.is_clean());
        assert_eq!(report.overlaps.len(), 1, "{:?}", report.overlaps);
        let (a, b) = report.overlaps[0];
        assert_eq!((a.client, b.client), (1, 2));
    }

    #[test]
    fn every_overlapping_pair_is_listed_for_one_permit() {
        let r = FencedResource::new(false, 1);
        // One long hold, three short ones inside it that also overlap each other pairwise
        // only for the first two.
        r.record_hold(0, Mode::Exclusive, 1, 0, 1000);
        r.record_hold(1, Mode::Exclusive, 2, 100, 300);
        r.record_hold(2, Mode::Exclusive, 3, 200, 400);
        r.record_hold(3, Mode::Exclusive, 4, 500, 600);
        let mut pairs: Vec<(usize, usize)> = r.report().overlaps.iter().map(|(a, b)| (a.client, b.client)).collect();
        pairs.sort_unstable();
        assert_eq!(pairs, vec![(0, 1), (0, 2), (0, 3), (1, 2)]);
    }

    #[test]
    fn an_open_hold_counts_until_now() {
        let r = FencedResource::new(true, 1);
        let _open = r.begin(1, Mode::Exclusive, 1);
        let later = r.begin(2, Mode::Exclusive, 2);
        r.end(later);
        let report = r.report();
        assert_eq!(report.overlaps.len(), 1);
        assert!(report.overlaps[0].0.is_open());
        assert!(!report.overlaps[0].1.is_open());
    }

    #[test]
    fn ending_twice_keeps_the_first_end() {
        let r = FencedResource::new(true, 1);
        let a = r.begin(1, Mode::Exclusive, 1);
        r.end(a);
        let b = r.begin(2, Mode::Exclusive, 2);
        r.end(a);
        r.end(b);
        assert!(r.report().is_clean());
    }

    #[test]
    fn stale_write_is_rejected_when_fenced() {
        let r = FencedResource::new(true, 1);
        assert!(r.write(1, 5, 0));
        assert!(r.write(1, 5, 1), "an equal token is the same holder writing again");
        assert!(r.write(2, 6, 0));
        assert!(!r.write(1, 5, 2), "token 5 is older than 6");
        let report = r.report();
        assert_eq!((report.writes, report.stale_accepted, report.stale_rejected, report.max_token), (4, 0, 1, 6));
        assert!(report.is_clean());
        let log = r.write_log();
        assert!(log[3].stale && !log[3].accepted);
    }

    #[test]
    fn stale_write_is_accepted_and_counted_when_unfenced() {
        let r = FencedResource::new(false, 1);
        assert!(r.write(2, 6, 0));
        assert!(r.write(1, 5, 0));
        let report = r.report();
        assert_eq!((report.writes, report.stale_accepted, report.stale_rejected, report.max_token), (2, 1, 0, 6));
        assert!(!report.is_clean());
        assert_eq!(report.to_string(), "holds=0 overlaps=0 writes=2 stale_accepted=1 stale_rejected=0 max_token=6");
    }

    #[test]
    fn shared_holds_overlap_each_other_but_not_an_exclusive_one() {
        let r = FencedResource::new(true, 1);
        r.record_hold(1, Mode::Shared, 1, 0, 100);
        r.record_hold(2, Mode::Shared, 2, 10, 100);
        r.record_hold(3, Mode::Shared, 3, 20, 50);
        assert!(r.report().is_clean());

        r.record_hold(4, Mode::Exclusive, 4, 60, 200);
        let report = r.report();
        let mut pairs: Vec<(usize, usize)> = report.overlaps.iter().map(|(a, b)| (a.client, b.client)).collect();
        pairs.sort_unstable();
        assert_eq!(pairs, vec![(1, 4), (2, 4)], "the reader that ended at 50 does not conflict");

        // A reader arriving during a writer's hold is reported too.
        let r = FencedResource::new(true, 1);
        r.record_hold(1, Mode::Exclusive, 1, 0, 100);
        r.record_hold(2, Mode::Shared, 2, 99, 150);
        assert_eq!(r.report().overlaps.len(), 1);
    }

    #[test]
    fn a_downgrade_by_the_same_client_is_not_an_overlap() {
        let r = FencedResource::new(true, 1);
        r.record_hold(1, Mode::Exclusive, 1, 0, 100);
        r.record_hold(1, Mode::Shared, 1, 90, 200);
        assert!(r.report().is_clean());
    }

    #[test]
    fn two_permits_allow_two_but_not_three() {
        let r = FencedResource::new(true, 2);
        r.record_hold(1, Mode::Exclusive, 1, 0, 100);
        r.record_hold(2, Mode::Exclusive, 2, 10, 100);
        r.record_hold(3, Mode::Exclusive, 3, 100, 200); // starts as two end: fine
        r.record_hold(4, Mode::Exclusive, 4, 150, 250);
        assert!(r.report().is_clean(), "{}", r.report());

        r.record_hold(5, Mode::Exclusive, 5, 160, 170); // third at once with 3 and 4
        let report = r.report();
        assert!(!report.is_clean());
        let mut pairs: Vec<(usize, usize)> = report.overlaps.iter().map(|(a, b)| (a.client, b.client)).collect();
        pairs.sort_unstable();
        assert_eq!(pairs, vec![(3, 5), (4, 5)]);
    }

    #[test]
    fn many_holds_are_checked_quickly() {
        let r = FencedResource::new(true, 1);
        for i in 0..20_000u64 {
            r.record_hold(i as usize, Mode::Exclusive, i, i * 10, i * 10 + 10);
        }
        r.record_hold(99_999, Mode::Exclusive, 1, 55, 56);
        let report = r.report();
        assert_eq!(report.holds, 20_001);
        assert_eq!(report.overlaps.len(), 1);
    }

    #[test]
    fn mono_now_advances() {
        let a = mono_now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(mono_now() >= a + 1_000_000);
    }
}
