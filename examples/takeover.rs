//! The multi-process demo: three processes take turns on one lock; one is killed with
//! SIGKILL while it holds; the lock passes on once its session times out and the others carry on.
//!
//! Run: `cargo run --example takeover -- zk://127.0.0.1:2181` (or set DISTLOCK_BACKEND).
//! With neither, the parent starts distlock's embedded ZooKeeper-protocol server in-process and
//! the workers connect to it.
//! The example starts its three worker processes itself (`takeover --worker N URL LOCK`).
//! The times shown are the workers' own readings (the order lines arrive in may differ).
//!
//! Mutual exclusion is judged by the holders' own timestamps on `CLOCK_MONOTONIC`, which every
//! process on the machine shares: each worker reads the clock after it got the lock and again
//! before it lets go, and the parent checks, once every worker has finished, that no two of these
//! intervals overlap. The order in which the workers' lines reach the parent (three pipes, three
//! reader threads) proves nothing and is not used.

use distlock::zookeeper::Client;
// CLOCK_MONOTONIC in nanoseconds: the clock every process on this machine shares.
use distlock_faults::mono_now;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const TURNS: usize = 4;
const HOLD: Duration = Duration::from_millis(300);
const VICTIM: usize = 1;
/// How long the victim holds its first turn at most, waiting to be killed (a bound, so a parent
/// that died leaves no process behind for long).
const VICTIM_HOLD_BOUND: Duration = Duration::from_secs(60);

/// One worker process: `TURNS` turns under the lock. Each line carries the worker's own clock
/// reading: `holds` is read after the lock was granted, `done` before it is released, so the
/// interval between them lies inside the hold. The victim keeps its first turn until it is killed.
async fn worker(id: usize, url: &str, lock_path: &str) {
    let client = Client::connect(url).await.expect("connect");
    let lock = client.mutex(lock_path).expect("lock path");
    for turn in 1..=TURNS {
        let guard = lock.lock().await.expect("lock");
        println!("worker {id} holds turn {turn} at {} token {}", mono_now(), guard.fencing_token());
        if id == VICTIM {
            // Held until the parent kills this process: the kill surely lands while it holds.
            tokio::time::sleep(VICTIM_HOLD_BOUND).await;
            eprintln!("worker {id}: never killed");
            std::process::exit(1);
        }
        tokio::time::sleep(HOLD).await; // the work done under the lock
        println!("worker {id} done turn {turn} at {}", mono_now());
        guard.release().await.expect("release");
    }
}

/// What one line of a worker says.
enum Event {
    Holds { turn: usize, at: u64, token: u64 },
    Done { turn: usize, at: u64 },
}

fn parse(line: &str) -> Option<Event> {
    let w: Vec<&str> = line.split_whitespace().collect();
    match w.as_slice() {
        ["worker", _, "holds", "turn", turn, "at", at, "token", token] => {
            Some(Event::Holds { turn: turn.parse().ok()?, at: at.parse().ok()?, token: token.parse().ok()? })
        }
        ["worker", _, "done", "turn", turn, "at", at] => {
            Some(Event::Done { turn: turn.parse().ok()?, at: at.parse().ok()? })
        }
        _ => None,
    }
}

/// A turn under the lock, as its holder recorded it: `[from, to]` lies within the hold.
#[derive(Debug)]
struct Turn {
    worker: usize,
    turn: usize,
    from: u64,
    to: Option<u64>,
    token: u64,
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
    // Workers use a short session so a killed holder is noticed soon: 2 s on our own server,
    // 4 s on a given one (the least a stock ZooKeeper grants: 2 ticks of 2 s), unless its URL
    // says.
    let lease = if embedded.is_some() { "2s" } else { "4s" };
    let url = if ["lease=", "session_timeout=", "ttl="].iter().any(|k| base.contains(k)) {
        base.clone()
    } else {
        format!("{}{}session_timeout={lease}", base, if base.contains('?') { "&" } else { "?" })
    };
    let lock_path = format!("/distlock-demo/takeover-{}", uuid::Uuid::new_v4().simple());
    let exe = std::env::current_exe().expect("own path");

    let (tx, rx) = mpsc::channel::<(usize, String)>();
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
                let _ = tx.send((id, line));
            }
        });
        children.push(child);
    }
    drop(tx);

    let started = mono_now();
    let secs = |at: u64| at.saturating_sub(started) as f64 / 1e9;
    let mut turns: Vec<Turn> = Vec::new();
    let mut killed_at: Option<u64> = None;
    let mut ok = true;
    while let Ok((id, line)) = rx.recv_timeout(Duration::from_secs(60)) {
        match parse(&line) {
            Some(Event::Holds { turn, at, token }) => {
                println!("[{:6.2}s] worker {id} holds turn {turn} (fencing token {token})", secs(at));
                turns.push(Turn { worker: id, turn, from: at, to: None, token });
                if id == VICTIM && killed_at.is_none() {
                    // Read before the kill: the victim's hold ends no earlier than this.
                    let at = mono_now();
                    children[VICTIM].kill().expect("kill");
                    children[VICTIM].wait().expect("reap");
                    killed_at = Some(at);
                    println!("[{:6.2}s] >>> killed worker {VICTIM} with SIGKILL while it held the lock", secs(at));
                }
            }
            Some(Event::Done { turn, at }) => {
                println!("[{:6.2}s] worker {id} done turn {turn}", secs(at));
                match turns.iter_mut().find(|t| t.worker == id && t.turn == turn && t.to.is_none()) {
                    Some(t) => t.to = Some(at),
                    None => {
                        println!("FAILED: worker {id} finished turn {turn} it never reported holding");
                        ok = false;
                    }
                }
            }
            None => println!("          worker {id}: {line}"),
        }
    }
    for (id, child) in children.iter_mut().enumerate() {
        if id != VICTIM {
            let status = child.wait().expect("wait");
            if !status.success() {
                println!("FAILED: worker {id} exited with {status}");
                ok = false;
            }
        }
    }
    // The verdict, from the holders' own clock readings.
    turns.sort_by_key(|t| t.from);
    for t in &mut turns {
        if t.worker == VICTIM && t.to.is_none() {
            t.to = killed_at; // its hold lasted at least until the kill was sent
        }
    }
    for pair in turns.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        match a.to {
            Some(end) if end <= b.from => {}
            Some(end) => {
                println!(
                    "FAILED: worker {} took turn {} at {:.3}s while worker {} held turn {} until {:.3}s",
                    b.worker,
                    b.turn,
                    secs(b.from),
                    a.worker,
                    a.turn,
                    secs(end)
                );
                ok = false;
            }
            None => {
                println!(
                    "FAILED: worker {} never finished turn {} yet worker {} held after it",
                    a.worker, a.turn, b.worker
                );
                ok = false;
            }
        }
        if a.token >= b.token {
            println!("FAILED: fencing tokens did not rise: {} then {}", a.token, b.token);
            ok = false;
        }
    }
    let expected_turns = 2 * TURNS + 1; // two survivors' turns, plus the victim's fatal one
    if turns.len() != expected_turns {
        println!("FAILED: {} turns were taken, not {expected_turns}", turns.len());
        ok = false;
    }
    if let Some(k) = killed_at {
        if let Some(next) = turns.iter().find(|t| t.from > k) {
            println!(">>> the lock passed on {:.2}s after the kill", (next.from - k) as f64 / 1e9);
        }
    } else {
        println!("FAILED: the victim never held the lock");
        ok = false;
    }
    if !ok {
        std::process::exit(1);
    }
    println!(
        "the two surviving workers finished all {TURNS} turns each; no two holds overlapped; tokens rose throughout"
    );
}
