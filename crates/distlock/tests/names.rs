//! What a name is, the same on every backend (the contract's rules, docs/cli.md "Names"):
//! - a mutex, the readers and the writers of one name are one lock: a held mutex keeps readers
//!   and writers out, and a reader keeps the mutex out;
//! - a semaphore and a lock cannot share a name: either order is refused with
//!   `Error::KindConflict` naming both kinds, also for a waiting acquire, and leaves nothing behind;
//! - a longer name (`base/x`) is another lock than `base`, and `inspect` shows them apart;
//! - no lock name holds a control character, refused with one error everywhere.

use distlock::Error;
use std::time::Duration;

use crate::common::backends::on_every_backend;
use crate::common::{eventually, unique};

async fn connect(url: &str) -> distlock::Client {
    distlock::connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Whether `lock` can be had now (a try that is refused is a test failure).
async fn free(lock: distlock::Lock, url: &str) -> bool {
    match lock.try_lock().await {
        Ok(Some(g)) => {
            g.release().await.unwrap();
            true
        }
        Ok(None) => false,
        Err(e) => panic!("{url}: a try failed: {e}"),
    }
}

on_every_backend!(
    #[tokio::test]
    a_mutex_and_a_read_write_lock_of_one_name_are_one_lock: zookeeper, redis, postgres, etcd, nats, memory
);
async fn a_mutex_and_a_read_write_lock_of_one_name_are_one_lock(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    let name = unique("one-lock");
    let mutex = a.mutex(&name).unwrap().lock().await.unwrap();
    assert!(!free(b.read_lock(&name).unwrap(), &url).await, "{url}: a reader ran beside a held mutex");
    assert!(!free(b.write_lock(&name).unwrap(), &url).await, "{url}: a writer ran beside a held mutex");
    // A reader that waits is let in once the mutex goes (the backend must wake it; that it
    // stays out while the mutex is held is the try above).
    let reader = b.read_lock(&name).unwrap();
    let waiting = tokio::spawn(async move { reader.lock_timeout(Duration::from_secs(20)).await });
    mutex.release().await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(25), waiting).await.unwrap().unwrap().unwrap();
    let read = read.unwrap_or_else(|| panic!("{url}: the reader was not let in after the mutex left"));
    assert!(!free(a.mutex(&name).unwrap(), &url).await, "{url}: a mutex ran beside a held read lock");
    read.release().await.unwrap();
    assert!(free(a.mutex(&name).unwrap(), &url).await, "{url}: left held");
}

/// The refusal every backend gives a name in use as the other kind.
fn assert_conflict(r: distlock::Result<Option<distlock::Guard>>, url: &str, what: &str) {
    match r {
        Err(e @ Error::KindConflict { .. }) => {
            let text = e.to_string();
            assert!(text.contains("semaphore") && text.contains("cannot be taken"), "{url}: {what}: {text}");
        }
        Err(e) => panic!("{url}: {what}: not the contract's refusal: {e}"),
        Ok(g) => {
            panic!("{url}: {what}: {}", if g.is_some() { "both kinds held one name" } else { "busy, not refused" })
        }
    }
}

on_every_backend!(
    #[tokio::test]
    a_semaphore_and_a_lock_cannot_share_a_name: zookeeper, redis, postgres, etcd, nats, memory
);
async fn a_semaphore_and_a_lock_cannot_share_a_name(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    // A lock first: the semaphore is refused, a try and a wait alike.
    let name = unique("kinds");
    let mutex = a.mutex(&name).unwrap().lock().await.unwrap();
    let permit = b.semaphore_permit(&name, 2).unwrap();
    assert_conflict(permit.try_lock().await, &url, "a permit's try beside a mutex");
    assert_conflict(permit.lock_timeout(Duration::from_secs(5)).await, &url, "a permit's wait beside a mutex");
    mutex.release().await.unwrap();
    let reader = a.read_lock(&name).unwrap().lock().await.unwrap();
    assert_conflict(permit.try_lock().await, &url, "a permit's try beside a reader");
    reader.release().await.unwrap();
    // A semaphore first: the mutex, readers and writers are refused.
    let name = unique("kinds");
    let held = a.semaphore_permit(&name, 2).unwrap().lock().await.unwrap();
    assert_conflict(b.mutex(&name).unwrap().try_lock().await, &url, "a mutex's try beside a permit");
    let waited = b.mutex(&name).unwrap().lock_timeout(Duration::from_secs(5)).await;
    assert_conflict(waited, &url, "a mutex's wait beside a permit");
    assert_conflict(b.read_lock(&name).unwrap().try_lock().await, &url, "a reader beside a permit");
    assert_conflict(b.write_lock(&name).unwrap().try_lock().await, &url, "a writer beside a permit");
    // Refusals leave nothing behind: the second permit is there, and once the first is gone the
    // name is free for a mutex.
    let second = b.semaphore_permit(&name, 2).unwrap().try_lock().await.unwrap();
    let second = second.unwrap_or_else(|| panic!("{url}: a refused acquire took a permit"));
    second.release().await.unwrap();
    held.release().await.unwrap();
    // A semaphore's directories (ZooKeeper) are reaped a moment after its last holder.
    let (lock, what) = (b.mutex(&name).unwrap(), format!("{url}: {name} free for a mutex once its permits are gone"));
    eventually(Duration::from_secs(10), &what, || async { free(lock.clone(), &url).await }).await;
}

on_every_backend!(
    #[tokio::test]
    a_longer_name_is_another_lock
);
async fn a_longer_name_is_another_lock(url: String) {
    let (a, b) = (connect(&url).await, connect(&url).await);
    // ZooKeeper's bare names are one segment; a longer name is a path there.
    let base = match a.backend() {
        "zookeeper" => format!("/distlock/{}", unique("nest")),
        _ => unique("nest"),
    };
    let inner = format!("{base}/x");
    let held = a.mutex(&inner).unwrap().lock().await.unwrap();
    assert!(free(b.mutex(&base).unwrap(), &url).await, "{url}: {inner} held blocks {base}");
    let seen = b.inspect(&base).await.unwrap();
    assert!(seen.locks.iter().all(|l| l.entries.is_empty()), "{url}: inspect {base} shows {inner}'s holder: {seen:?}");
    held.release().await.unwrap();
    let held = a.mutex(&base).unwrap().lock().await.unwrap();
    assert!(free(b.mutex(&inner).unwrap(), &url).await, "{url}: {base} held blocks {inner}");
    held.release().await.unwrap();
}

on_every_backend!(
    #[tokio::test]
    control_characters_in_a_name_are_refused_alike
);
async fn control_characters_in_a_name_are_refused_alike(url: String) {
    let client = connect(&url).await;
    let control = "a control character";
    let cases = [
        ("a\u{1b}[2Jb", "001B", control),
        ("a\nb", "000A", control),
        ("a\u{7f}", "007F", control),
        ("a\u{9b}b", "009B", control),
        ("a\u{202e}b", "202E", "a text-direction or separator character"),
    ];
    for (name, code, what) in cases {
        let want = format!(
            "invalid lock path {name:?}: holds the character U+{code} ({what}); a lock name is printable text on every backend"
        );
        let seen = [
            ("mutex", client.mutex(name).err()),
            ("inspect", client.inspect(name).await.err()),
            ("election", client.election(name).err()),
        ];
        for (what, e) in seen {
            let e = e.unwrap_or_else(|| panic!("{url}: {what} of {name:?} accepted"));
            assert_eq!(e.to_string(), want, "{url}: {what}");
        }
    }
    let empty = client.mutex("").err().map(|e| e.to_string());
    assert_eq!(empty.as_deref(), Some("invalid lock path \"\": the lock name is empty"), "{url}");
}
