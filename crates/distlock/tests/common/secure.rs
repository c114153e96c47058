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

/// Connecting to `bad` (and, if that succeeds, taking a lock) fails within 10 s with an error
/// that says `says` and not `secret`.
pub async fn refused(bad: &str, says: &str, secret: &str) {
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
    assert!(started.elapsed() < Duration::from_secs(10), "{shown}: took {:?}: {text}", started.elapsed());
    assert!(text.contains(says), "{shown}: {text}");
    assert!(!text.contains(secret), "the secret is in the error: {text}");
    println!("refused in {:?}: {text}", started.elapsed());
}
