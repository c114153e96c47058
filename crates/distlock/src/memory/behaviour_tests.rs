//! The in-process store under tokio's paused clock: every lock kind, loss, tokens, jobs and
//! elections, each at the instant time is advanced to.

use crate::schedule::Started;
use crate::LostReason;
use std::time::Duration;
use tokio::time::{advance, Instant};

async fn client(name: &str) -> crate::Client {
    crate::connect(&format!("memory://unit-{name}?lease=10s")).await.unwrap()
}

fn cut(client: &crate::Client) -> &super::Client {
    client.downcast::<super::Client>().expect("a memory client")
}

#[tokio::test(start_paused = true)]
async fn readers_share_a_writer_waits_in_turn_and_permits_count() {
    let c = client("kinds").await;
    let r1 = c.read_lock("doc").unwrap().lock().await.unwrap();
    let r2 = c.read_lock("doc").unwrap().try_lock().await.unwrap().expect("readers share");
    // A writer queues; a reader behind it does not overtake it.
    let writer = tokio::spawn({
        let c = c.clone();
        async move { c.write_lock("doc").unwrap().lock().await.unwrap() }
    });
    tokio::task::yield_now().await;
    assert!(c.read_lock("doc").unwrap().try_lock().await.unwrap().is_none(), "a writer waits: no barging");
    let listing = c.inspect("doc").await.unwrap();
    let modes: Vec<_> = listing.locks[0].entries.iter().map(|e| (e.holds, e.mode.as_str())).collect();
    assert_eq!(modes, [(true, "read"), (true, "read"), (false, "write")]);
    r1.release().await.unwrap();
    drop(r2);
    let w = writer.await.unwrap();
    assert!(w.fencing_token() > 2, "tokens rise: {}", w.fencing_token());
    w.release().await.unwrap();

    let p = |c: &crate::Client| c.semaphore_permit("pool", 2).unwrap();
    let (a, b) = (p(&c).lock().await.unwrap(), p(&c).lock().await.unwrap());
    assert!(p(&c).try_lock().await.unwrap().is_none(), "two permits");
    assert!(p(&c).lock_timeout(Duration::from_secs(5)).await.unwrap().is_none());
    drop(a);
    let third = p(&c).try_lock().await.unwrap().expect("a permit given back");
    assert!(third.fencing_token() > b.fencing_token());
    assert!(c.semaphore_permit("pool", 0).is_err(), "no permits is refused");
    let e = c.semaphore_permit("pool", 3).unwrap().try_lock().await.unwrap_err();
    assert!(e.to_string().contains("in use with 2 permits, not 3"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_cut_off_holder_is_told_before_the_lock_passes_on() {
    let (ours, theirs) = (client("loss").await, client("loss").await);
    let guard = ours.mutex("m").unwrap().lock().await.unwrap();
    let start = Instant::now();
    // Renewals keep it while the client is heard (a paused sleep runs every timer on its way).
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!guard.state().is_lost());
    let renewed = Instant::now();
    cut(&ours).partition();
    let waiter = tokio::spawn(async move {
        let g = theirs.mutex("m").unwrap().lock().await.unwrap();
        (Instant::now(), g.fencing_token())
    });
    assert_eq!(guard.lost().await, LostReason::LeaseExpired);
    let told = Instant::now();
    let (granted, token) = waiter.await.unwrap();
    assert!(told < granted, "told {:?} after the last renewal, granted {:?}", told - renewed, granted - renewed);
    assert!(granted - renewed <= Duration::from_secs(10) && granted > start);
    assert_eq!(token, guard.fencing_token() + 1);
    // Healed, the old holder's release finds the lock gone.
    cut(&ours).heal();
    assert!(guard.release().await.is_err());
}

/// A release from a cut-off client waits for the heal at most until its lease is over.
#[tokio::test(start_paused = true)]
async fn a_cut_off_release_ends_at_the_deadline() {
    let c = client("release").await;
    let guard = c.mutex("m").unwrap().lock().await.unwrap();
    cut(&c).partition();
    let e = guard.release().await.unwrap_err();
    assert!(matches!(e, crate::Error::LockLost { reason: LostReason::LeaseExpired, .. }), "{e}");
    cut(&c).heal();
    let next = c.mutex("m").unwrap().lock_timeout(Duration::from_secs(20)).await.unwrap();
    assert!(next.is_some(), "the store let it go at its lease");
}

/// One `advance` past the lease is a paused process: no renewal ran in it, so the lock is lost
/// (and another takes it); a paused `sleep` runs every timer on its way, so renewals keep it.
#[tokio::test(start_paused = true)]
async fn one_jump_past_the_lease_is_a_paused_holder() {
    let c = client("jump").await;
    let guard = c.mutex("m").unwrap().lock().await.unwrap();
    advance(Duration::from_secs(11)).await;
    assert!(guard.state().is_lost());
    let next = c.mutex("m").unwrap().try_lock().await.unwrap().expect("the store let it go");
    assert_eq!(next.fencing_token(), guard.fencing_token() + 1);
}

#[tokio::test(start_paused = true)]
async fn a_job_runs_once_per_slot_on_the_paused_clock() {
    let c = client("jobs").await;
    let job = c.schedule("nightly").unwrap().once_per(Duration::from_secs(3600)).at_most_for(Duration::from_secs(600));
    let Started::Running(run) = job.try_start().await.unwrap() else { panic!("the first run starts") };
    let first = run.fencing_token();
    run.finish(Some(0)).await.unwrap();
    assert!(matches!(job.try_start().await.unwrap(), Started::Skipped(_)), "once per slot");
    advance(Duration::from_secs(3600)).await;
    let Started::Running(run) = job.try_start().await.unwrap() else { panic!("the next slot runs") };
    assert!(run.fencing_token() > first);
    // Past its bound the run is lost, on the paused clock.
    advance(Duration::from_secs(600)).await;
    assert!(crate::contract::Held::state(&run).is_lost());
}

#[tokio::test(start_paused = true)]
async fn an_election_hands_on_with_a_higher_epoch_and_is_watched() {
    let (a, b) = (client("elect").await, client("elect").await);
    let (ea, eb) = (a.election("leader").unwrap(), b.election("leader").unwrap());
    let mut observer = eb.observe_every(Duration::from_secs(3600));
    let lead = ea.campaign("a").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(1), observer.next()).await.unwrap().unwrap();
    assert_eq!(seen.value(), "a", "woken by the watch, not the hourly poll");
    cut(&a).partition();
    assert_eq!(lead.lost().await, LostReason::LeaseExpired);
    let next = eb.campaign("b").await.unwrap();
    assert!(next.epoch() > lead.epoch());
    assert_eq!(eb.leader().await.unwrap().map(|l| l.value), Some("b".into()));
}

#[tokio::test]
async fn names_and_urls_are_checked() {
    let c = crate::connect("memory://").await.unwrap();
    assert!(c.mutex("").is_err());
    let e = crate::connect("memory://never-connected?setup=no").await.unwrap_err();
    assert!(matches!(e, crate::Error::NotSetUp { .. }), "{e}");
}

/// A client's holds are renewed together: 300 locks taken at their own times are renewed in a
/// bounded number of changes of the store per period (the store's change counter, which every
/// change moves), not one per hold; an entry taken out of the store among them loses that hold
/// alone, at its next renewal.
#[tokio::test(start_paused = true)]
async fn many_holds_are_renewed_in_one_change_and_a_gone_entry_loses_only_its_own() {
    const HELD: usize = 300;
    let period = Duration::from_secs(10) / 3;
    let c = client("many").await;
    let store = cut(&c).store.clone();
    let mut guards = Vec::new();
    // Taken over a period and a half, each at its own time.
    for i in 0..HELD {
        guards.push(c.mutex(&format!("m{i}")).unwrap().lock().await.unwrap());
        tokio::time::sleep(period / 200).await;
    }
    // From a period after the last grant on, every renewal round is one change.
    tokio::time::sleep(period * 2).await;
    let before = *store.subscribe().borrow();
    tokio::time::sleep(period * 6).await;
    let changes = *store.subscribe().borrow() - before;
    assert!((5..=8).contains(&changes), "{changes} changes of the store in six periods of {HELD} holds");
    assert!(guards.iter().all(|g| g.state() == crate::LockState::Held));

    // One entry goes (as if the store lost it): that hold is lost at its next renewal, no other.
    let (name, id) = ("m150".to_string(), guards[150].holder_id().to_string());
    store.change(|s, now| s.locks.get_mut(&name).unwrap().remove(&id, now));
    let reason = tokio::time::timeout(period * 2, guards[150].lost()).await.expect("lost at its next renewal");
    assert_eq!(reason, LostReason::LeaseExpired);
    tokio::time::sleep(period * 2).await;
    let held = guards.iter().filter(|g| g.state() == crate::LockState::Held).count();
    assert_eq!(held, HELD - 1, "only the hold whose entry went is lost");
}
