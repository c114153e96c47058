//! Checks shared by the tests of servers set up as production is (TLS only, authentication on).

use std::time::Duration;

/// Over `url`: two clients exclude each other on a lock whose tokens rise, an election names its
/// leader to the other, and a fresh job runs.
pub async fn locks_elects_and_runs_a_job(url: &str) {
    locks_elects_and_runs_a_job_under(url, "").await
}

/// [`locks_elects_and_runs_a_job`] with every lock, election and job name starting with `prefix`
/// (what a least-privilege user may touch).
pub async fn locks_elects_and_runs_a_job_under(url: &str, prefix: &str) {
    let (a, b) = (distlock::connect(url).await.unwrap(), distlock::connect(url).await.unwrap());
    let lock = format!("{prefix}tls-lock");
    let g = a.mutex(&lock).unwrap().lock().await.unwrap();
    assert!(b.mutex(&lock).unwrap().try_lock().await.unwrap().is_none(), "held over TLS");
    let first = g.fencing_token();
    g.release().await.unwrap();
    let g = b.mutex(&lock).unwrap().try_lock().await.unwrap().expect("free after the release");
    assert!(g.fencing_token() > first);
    g.release().await.unwrap();
    let election = format!("{prefix}tls-election");
    let leading = a.election(&election).unwrap().campaign("a").await.unwrap();
    assert_eq!(b.election(&election).unwrap().leader().await.unwrap().map(|l| l.value), Some("a".into()));
    leading.resign().await.unwrap();
    let job = a.schedule(&format!("{prefix}tls-job-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])).unwrap();
    match job.at_most_for(Duration::from_secs(5)).try_start().await.unwrap() {
        distlock::schedule::Started::Running(job) => drop(job.finish(Some(0)).await.unwrap()),
        distlock::schedule::Started::Skipped(s) => panic!("a fresh job skipped: {s}"),
    }
}

/// Every recipe on the contract under `prefix`, for a least-privilege user: mutex, read and write
/// locks, a semaphore permit, an election, a job, and the listing of `prefix`.
pub async fn every_recipe_under(url: &str, prefix: &str) {
    locks_elects_and_runs_a_job_under(url, prefix).await;
    let c = distlock::connect(url).await.unwrap();
    let rw = format!("{prefix}rw");
    // A kind a backend refuses (MariaDB's GET_LOCK gives the mutex only) is skipped.
    let supported = |r: distlock::Result<distlock::Lock>| match r {
        Err(distlock::Error::Unsupported { .. }) => None,
        r => Some(r.unwrap()),
    };
    if let Some(read) = supported(c.read_lock(&rw)) {
        let r1 = read.lock().await.unwrap();
        let r2 = c.read_lock(&rw).unwrap().try_lock().await.unwrap().expect("readers share");
        assert!(c.write_lock(&rw).unwrap().try_lock().await.unwrap().is_none(), "a writer waits for readers");
        listed(&c, prefix, "rw").await;
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        c.write_lock(&rw).unwrap().lock().await.unwrap().release().await.unwrap();
    } else {
        let held = c.mutex(&rw).unwrap().lock().await.unwrap();
        listed(&c, prefix, "rw").await;
        held.release().await.unwrap();
    }
    let sem = format!("{prefix}sem");
    if let Some(permit) = supported(c.semaphore_permit(&sem, 2)) {
        let p1 = permit.lock().await.unwrap();
        let p2 = c.semaphore_permit(&sem, 2).unwrap().lock().await.unwrap();
        assert!(c.semaphore_permit(&sem, 2).unwrap().try_lock().await.unwrap().is_none(), "two permits");
        p1.release().await.unwrap();
        p2.release().await.unwrap();
    }
    c.close(Duration::from_secs(2)).await;
}

/// The listing of `prefix` shows a lock named with `part`, where the backend lists by prefix
/// (PostgreSQL's advisory keys and MariaDB's GET_LOCK cannot: their refusal is accepted).
async fn listed(c: &distlock::Client, prefix: &str, part: &str) {
    match c.locks(prefix).await {
        Ok(listing) => assert!(listing.locks.iter().any(|l| l.name.contains(part)), "{listing:?}"),
        Err(distlock::Error::Unsupported { .. }) => {}
        Err(e) => panic!("listing {prefix}: {e}"),
    }
}

/// Connecting to `bad` (and, if that succeeds, taking a lock) fails within 10 s with an error
/// that says `says` and not `secret`.
pub async fn refused(bad: &str, says: &str, secret: &str) {
    refused_within(bad, says, secret, Duration::from_secs(10)).await
}

/// [`refused`], at once: within 1.5 s, where the URLs give a connect timeout of 3 s or more (a
/// cause the client can know is named without waiting the timeout out).
pub async fn refused_at_once(bad: &str, says: &str, secret: &str) {
    refused_within(bad, says, secret, Duration::from_millis(1500)).await
}

async fn refused_within(bad: &str, says: &str, secret: &str, bound: Duration) {
    let started = std::time::Instant::now();
    let shown = distlock::redact_url(bad);
    let e = match distlock::connect(bad).await {
        Ok(c) => match c.mutex("tls-refused").unwrap().try_lock().await {
            Ok(_) => panic!("{shown}: connected and locked"),
            Err(e) => e,
        },
        Err(e) => e,
    };
    let text = e.to_string();
    assert!(started.elapsed() < bound, "{shown}: took {:?}: {text}", started.elapsed());
    assert!(text.contains(says), "{shown}: {text}");
    assert!(!text.contains(secret), "the secret is in the error: {text}");
    println!("refused in {:?}: {text}", started.elapsed());
}
