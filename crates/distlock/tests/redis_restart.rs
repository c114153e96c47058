//! A Redis without persistence restarted under a held lock: the holder learns it lost the lock,
//! and fencing tokens keep rising although the server came back empty. The test starts its own
//! redis-server with `scripts/redis.sh` (other tests share theirs, which must not restart).
#![cfg(feature = "redis")]

use distlock::redis::Client;
use distlock::LostReason;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

struct Server {
    dir: PathBuf,
    addr: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis.sh")
}

impl Server {
    fn start() -> Server {
        let dir = std::env::temp_dir().join(format!("distlock-redis-restart-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(script()).arg("start").arg(&dir).output().expect("scripts/redis.sh");
        assert!(out.status.success(), "redis.sh start: {}", String::from_utf8_lossy(&out.stderr));
        let addr = String::from_utf8(out.stdout).unwrap().trim().to_string();
        Server { dir, addr }
    }

    fn restart(&self) {
        let out = Command::new(script()).arg("restart").arg(&self.dir).output().unwrap();
        assert!(out.status.success(), "redis.sh restart: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn a_restart_without_persistence_is_a_loss_and_tokens_keep_rising() {
    let server = Server::start();
    let redis = Client::connect(&format!("redis://{}?lease=2s", server.addr)).await.unwrap();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = redis.mutex("restart").unwrap().lock().await.unwrap();
        tokens.push(g.fencing_token());
        g.release().await.unwrap();
    }
    let held = redis.mutex("restart").unwrap().lock().await.unwrap();
    tokens.push(held.fencing_token());
    server.restart(); // empty: the lock and the fencing counter are gone
    let reason =
        tokio::time::timeout(Duration::from_secs(10), held.lost()).await.expect("the holder learns of the loss");
    assert!(matches!(reason, LostReason::KeyDeleted | LostReason::LeaseExpired), "{reason:?}");
    // The counter restarted from nothing, yet the next token is larger than every earlier one.
    let next = tokio::time::timeout(Duration::from_secs(10), redis.mutex("restart").unwrap().lock())
        .await
        .expect("the restarted server grants the lock")
        .unwrap();
    assert!(
        tokens.iter().all(|t| next.fencing_token() > *t),
        "token {} after the restart, {tokens:?} before",
        next.fencing_token()
    );
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    next.release().await.unwrap();
    drop(held);
}
