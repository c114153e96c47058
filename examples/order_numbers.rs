//! The order-number demo: ten workers issue order numbers from one shared counter.
//!
//! Without a lock, workers read the same counter value and issue duplicate numbers. Under the
//! ZooKeeper mutex every number is issued exactly once, in order. The counter lives in a znode,
//! read and written with plain getData/setData (no version check), as a naive service would.
//!
//! Run: `cargo run --example order_numbers -- zk://127.0.0.1:2181` (or set DISTLOCK_BACKEND).
//! With neither, it starts distlock's embedded ZooKeeper-protocol server in-process.

use distlock::zookeeper::Client;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

const WORKERS: usize = 10;

async fn issue(client: &Client, counter: &str) -> u64 {
    let zk = client.zookeeper();
    let (data, _) = zk.get_data(counter).await.expect("read counter");
    let current: u64 = String::from_utf8_lossy(&data).parse().unwrap_or(0);
    // The business logic takes a moment between read and write: this is where races happen.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let next = current + 1;
    zk.set_data(counter, next.to_string().as_bytes(), None).await.expect("write counter");
    next
}

async fn run(url: &str, locked: bool) -> Vec<(usize, u64)> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let admin = Client::connect(url).await.expect("connect");
    let base = format!("/distlock-demo/{id}");
    let counter = format!("{base}-counter");
    let opts = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    admin.zookeeper().mkdir("/distlock-demo", &opts).await.expect("demo dir");
    admin.zookeeper().create(&counter, b"0", &opts).await.expect("counter");
    let issued = Arc::new(StdMutex::new(Vec::new()));
    let start = Arc::new(tokio::sync::Barrier::new(WORKERS));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let (url, counter, issued, start) = (url.to_string(), counter.clone(), issued.clone(), start.clone());
        let lock_path = format!("{base}-lock");
        tasks.push(tokio::spawn(async move {
            let client = Client::connect(&url).await.expect("connect");
            // The typed mutex as the one lock, which the template takes.
            let lock: distlock::Lock = client.mutex(&lock_path).expect("lock path").into();
            start.wait().await; // all ten start together, as a CountDownLatch would
            if locked {
                // Recorded while the lock is held, so the list's order is the order of the holds
                // (a worker recording after its release could be overtaken by the next holder).
                distlock::with_lock(&lock, Duration::from_secs(30), |_token| async {
                    let number = issue(&client, &counter).await;
                    issued.lock().unwrap().push((worker, number));
                })
                .await
                .expect("lock");
            } else {
                let number = issue(&client, &counter).await;
                issued.lock().unwrap().push((worker, number));
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
    admin.zookeeper().delete(&counter, None).await.expect("cleanup");
    let v = issued.lock().unwrap().clone();
    v
}

#[tokio::main]
async fn main() {
    let given = std::env::args().nth(1).or_else(|| std::env::var("DISTLOCK_BACKEND").ok());
    let embedded = match given {
        Some(_) => None,
        None => Some(distlock_server::EmbeddedServer::start().await.expect("start the embedded server")),
    };
    let url = given.unwrap_or_else(|| embedded.as_ref().unwrap().url());
    if embedded.is_some() {
        println!("(no backend given: using the embedded server at {url})\n");
    }

    let unlocked = run(&url, false).await;
    let mut numbers: Vec<u64> = unlocked.iter().map(|(_, n)| *n).collect();
    println!("without a lock, in completion order:");
    for (w, n) in &unlocked {
        println!("  worker {w} issued order #{n:04}");
    }
    numbers.sort();
    numbers.dedup();
    println!("  -> {} distinct numbers for {WORKERS} orders (duplicates mean lost updates)\n", numbers.len());

    let locked = run(&url, true).await;
    println!("under the distlock mutex, in the order of the holds:");
    for (w, n) in &locked {
        println!("  worker {w} issued order #{n:04}");
    }
    let got: Vec<u64> = locked.iter().map(|(_, n)| *n).collect();
    let expected: Vec<u64> = (1..=WORKERS as u64).collect();
    if got != expected {
        eprintln!("FAILED: under the lock the numbers must be 1..={WORKERS} in order, got {got:?}");
        std::process::exit(1);
    }
    println!("  -> every number issued once, strictly in order");
}
