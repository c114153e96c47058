//! The seeds' multi-process demo: three processes take turns on one lock; one is killed with
//! SIGKILL while it holds; the lock passes on once its session times out and the others carry on.
//!
//! Run: `cargo run --example takeover -- zk://127.0.0.1:2181` (or set DISTLOCK_BACKEND).
//! With neither, the parent starts distlock's embedded ZooKeeper-protocol server in-process and
//! the workers connect to it.
//! The example starts its three worker processes itself (`takeover --worker N URL LOCK`).

use distlock::zookeeper::Client;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TURNS: usize = 4;
const HOLD: Duration = Duration::from_millis(300);
const VICTIM: usize = 1;

async fn worker(id: usize, url: &str, lock_path: &str) {
    let client = Client::connect(url).await.expect("connect");
    let lock = client.mutex(lock_path).expect("lock path");
    for turn in 1..=TURNS {
        let guard = lock.lock().await.expect("lock");
        println!("worker {id} holds turn {turn} token {}", guard.fencing_token());
        tokio::time::sleep(HOLD).await; // the work done under the lock
        println!("worker {id} done turn {turn}");
        guard.release().await.expect("release");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--worker") {
        let id: usize = args[2].parse().expect("worker id");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        rt.block_on(worker(id, &args[3], &args[4]));
        return;
    }
    let given = args.get(1).cloned().or_else(|| std::env::var("DISTLOCK_BACKEND").ok());
    // The runtime (and the embedded server on it, if any) lives as long as main.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let embedded = match given {
        Some(_) => None,
        None => {
            let cfg = distlock_server::Config { tick: Duration::from_millis(500), ..Default::default() };
            Some(rt.block_on(distlock_server::EmbeddedServer::start_with(cfg)).expect("start the embedded server"))
        }
    };
    let base = given.unwrap_or_else(|| embedded.as_ref().unwrap().url());
    if embedded.is_some() {
        println!("(no backend given: using the embedded server at {base})");
    }
    // Workers use a short session so a killed holder is noticed within 2 s.
    let url = format!("{}{}session_timeout=2s", base, if base.contains('?') { "&" } else { "?" });
    let lock_path = format!("/distlock-demo/takeover-{}", uuid::Uuid::new_v4().simple());
    let exe = std::env::current_exe().expect("own path");

    let (tx, rx) = mpsc::channel::<(usize, String, Instant)>();
    let mut children = Vec::new();
    for id in 0..3 {
        let mut child = Command::new(&exe)
            .args(["--worker", &id.to_string(), &url, &lock_path])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start worker");
        let out = BufReader::new(child.stdout.take().unwrap());
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let _ = tx.send((id, line, Instant::now()));
            }
        });
        children.push(child);
    }
    drop(tx);

    let started = Instant::now();
    let mut killed_at: Option<Instant> = None;
    let mut reported = false;
    let mut holder: Option<usize> = None;
    let mut tokens = Vec::new();
    let mut ok = true;
    while let Ok((id, line, at)) = rx.recv_timeout(Duration::from_secs(60)) {
        let t = at.duration_since(started).as_secs_f64();
        println!("[{t:6.2}s] {line}");
        if line.contains(" holds ") {
            if let Some(h) = holder {
                if h != id {
                    println!("FAILED: worker {id} holds while worker {h} still does");
                    ok = false;
                }
            }
            holder = Some(id);
            tokens.push(line.rsplit(' ').next().unwrap().parse::<u64>().unwrap());
            if id == VICTIM && killed_at.is_none() {
                children[VICTIM].kill().expect("kill");
                children[VICTIM].wait().expect("reap");
                killed_at = Some(Instant::now());
                holder = None; // a dead process holds nothing; its node lives on until its session expires
                println!("[{t:6.2}s] >>> killed worker {VICTIM} with SIGKILL while it held the lock");
            }
        } else if line.contains(" done ") {
            holder = None;
        }
        if line.contains(" holds ") && id != VICTIM && !reported {
            if let Some(k) = killed_at {
                println!("[{t:6.2}s] >>> the lock passed on {:.2}s after the kill", at.duration_since(k).as_secs_f64());
                reported = true;
            }
        }
    }
    for (id, child) in children.iter_mut().enumerate() {
        if id != VICTIM {
            let status = child.wait().expect("wait");
            ok &= status.success();
        }
    }
    if !tokens.windows(2).all(|w| w[0] < w[1]) {
        println!("FAILED: fencing tokens did not rise: {tokens:?}");
        ok = false;
    }
    let expected_turns = 2 * TURNS + 1; // two survivors' turns, plus the victim's fatal one
    if tokens.len() < expected_turns {
        println!("FAILED: only {} turns were taken", tokens.len());
        ok = false;
    }
    if !ok {
        std::process::exit(1);
    }
    println!("the two surviving workers finished all {TURNS} turns each; tokens rose throughout");
}
