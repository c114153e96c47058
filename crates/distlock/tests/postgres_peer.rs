//! Interoperability with DistributedLock's PostgreSQL locks, through its Rust port
//! (`distributed-lock-postgres`) as the peer: for every form of name (packed ASCII, a hex key, an
//! integer pair, a hashed name) the peer's lock and ours exclude each other on the same server.
#![cfg(feature = "postgres")]

use distributed_lock_core::traits::{DistributedLock, LockHandle, LockProvider};
use distributed_lock_postgres::PostgresLockProvider;
use std::time::Duration;

fn pg_url() -> String {
    std::env::var("DISTLOCK_TEST_POSTGRES").expect(
        "DISTLOCK_TEST_POSTGRES is not set: run the tests with scripts/test.sh, which starts PostgreSQL on a free port",
    )
}

#[tokio::test]
async fn distributedlock_and_distlock_exclude_each_other_for_every_form_of_name() {
    let ours = distlock::postgres::Client::connect(&pg_url()).await.unwrap();
    let peer = PostgresLockProvider::new(pg_url()).await.unwrap();
    let r = uuid::Uuid::new_v4().as_u128();
    let names = [
        format!("p{:08x}", r as u32),              // ≤ 9 ASCII characters: packed
        format!("{:016x}", (r >> 32) as u64 >> 1), // 16 hex digits: the bigint
        // An integer pair. Hex keys and words below 0x80000000 only, here and above: the port
        // parses them as signed hex and hashes the name otherwise, where DistributedLock (and
        // distlock) take the bits as they are (the key unit test covers those).
        format!("{:08X},{:08x}", (r >> 96) as u32 >> 1, (r >> 64) as u32 >> 1),
        format!("distlock-test:peer:{r:x}"), // anything else: SHA-1
        format!("锁/订单/{r:x}"),
    ];
    for name in &names {
        let theirs = peer.create_lock(name);
        let mine = ours.mutex(name).unwrap();
        // The peer holds: we cannot have it, not even after a bounded wait.
        let handle =
            theirs.try_acquire().await.unwrap().unwrap_or_else(|| panic!("{name}: the peer takes a free lock"));
        assert!(mine.try_lock().await.unwrap().is_none(), "{name}: held by the peer, free for us");
        assert!(mine.lock_timeout(Duration::from_millis(200)).await.unwrap().is_none(), "{name}: after a wait");
        handle.release().await.unwrap();
        // We hold: the peer cannot have it.
        let guard = tokio::time::timeout(Duration::from_secs(10), mine.lock())
            .await
            .unwrap_or_else(|_| panic!("{name}: free again after the peer's release"))
            .unwrap();
        assert!(theirs.try_acquire().await.unwrap().is_none(), "{name}: held by us, free for the peer");
        guard.release().await.unwrap();
        let again = theirs.try_acquire().await.unwrap().unwrap_or_else(|| panic!("{name}: free after our release"));
        again.release().await.unwrap();
    }
}
