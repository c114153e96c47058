//! `distlock serve` (its `--listen` forms, `--data-dir` errors, pauses and crashes) end to end,
//! and `distlock bench`, which runs the `distlock-bench` program (tested in its own crate). Each
//! test starts what it needs.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use distlock_faults::process::{run_bounded, Scratch};

const BIN: &str = env!("CARGO_BIN_EXE_distlock");

/// `distlock bench ARGS` runs the `distlock-bench` beside it with ARGS as given; a `distlock`
/// with no distlock-bench beside it or on PATH says where to get it, and exits 2.
#[test]
fn bench_runs_distlock_bench_or_says_where_to_get_it() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = Scratch::new();
    let (with, alone) = (scratch.0.join("with"), scratch.0.join("alone"));
    for dir in [&with, &alone] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::copy(BIN, dir.join("distlock")).unwrap();
    }
    // A stand-in that prints the arguments it was given, one per line.
    let stand_in = with.join("distlock-bench");
    std::fs::write(&stand_in, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let args = ["--backend", "embedded", "--duration", "-1", "a b"];
    let out = run_bounded(Command::new(with.join("distlock")).arg("bench").args(args), Duration::from_secs(30));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().collect::<Vec<_>>(), args);

    let out = run_bounded(
        Command::new(alone.join("distlock")).env("PATH", scratch.0.join("empty")).args(["bench", "raw"]),
        Duration::from_secs(30),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("distlock-bench, found neither beside this distlock nor on PATH"), "{stderr}");
    assert!(stderr.contains("cargo install --path crates/distlock-bench"), "{stderr}");
}

/// A `distlock serve` this test started, killed when dropped.
struct Served {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `distlock serve ARGS --addr-file F` and waits (bounded) for F to name the address.
fn serve(args: &[&str], scratch: &Scratch) -> Served {
    let addr_file = scratch.0.join(format!("addr-{}", uuid::Uuid::new_v4().simple()));
    let child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .arg("--addr-file")
        .arg(&addr_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut served = Served { child, addr: "0.0.0.0:0".parse().unwrap() };
    served.addr = crate::common::eventually_some(
        Duration::from_secs(30),
        &format!("distlock serve {args:?} to write its address"),
        || {
            if let Ok(text) = std::fs::read_to_string(&addr_file) {
                return Some(text.trim().parse().unwrap_or_else(|e| panic!("addr file holds {text:?}: {e}")));
            }
            if let Some(status) = served.child.try_wait().unwrap() {
                panic!("distlock serve {args:?} exited ({status}) before writing its address");
            }
            None
        },
    );
    served
}

/// True if a ZooKeeper-protocol server answers `ruok` at `addr`.
fn answers(addr: SocketAddr) -> bool {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"ruok").unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply == "imok"
}

#[test]
fn serve_bare_port_listens_on_loopback() {
    let scratch = Scratch::new();
    // A port that was free a moment ago (not 2181: a real server may be there).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let s = serve(&["--listen", &port.to_string()], &scratch);
    assert_eq!(s.addr, SocketAddr::from(([127, 0, 0, 1], port)));
    assert!(answers(s.addr));
}

#[test]
fn serve_resolves_host_names() {
    let scratch = Scratch::new();
    let s = serve(&["--listen", "localhost:0"], &scratch);
    assert!(s.addr.ip().is_loopback() && s.addr.port() != 0, "{}", s.addr);
    assert!(answers(s.addr));
}

#[test]
fn serve_names_bad_listen_values() {
    let serve_on = |listen: &str| {
        let out = run_bounded(Command::new(BIN).args(["serve", "--listen", listen]), Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "--listen {listen}: {stderr}");
        stderr
    };
    // Malformed: a usage error naming the value.
    for bad in ["localhost", "70000", "localhost:http", "::1", ":2181", "a:b:2181"] {
        let stderr = serve_on(bad);
        assert!(stderr.contains(&format!("invalid value '{bad}' for '--listen <ADDR>'")), "--listen {bad}: {stderr}");
    }
    // Well formed but unusable: the value and the reason.
    let stderr = serve_on("no-such-host.invalid:0");
    assert!(
        stderr.starts_with("distlock: cannot listen on no-such-host.invalid:0: cannot resolve no-such-host.invalid: "),
        "{stderr}"
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let stderr = serve_on(&port.to_string());
    assert!(stderr.starts_with(&format!("distlock: cannot listen on {port} (127.0.0.1:{port}): ")), "{stderr}");
    drop(taken);
}

#[test]
fn serve_names_an_unusable_data_dir() {
    let scratch = Scratch::new();
    let file = scratch.0.join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let under_file = file.join("data");
    for (dir, reason) in [
        (&file, "it exists and is not a directory".to_string()),
        (&under_file, format!("{} is not a directory", file.display())),
    ] {
        let addr_file = scratch.0.join("addr");
        let out = run_bounded(
            Command::new(BIN)
                .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
                .arg(dir)
                .arg("--addr-file")
                .arg(&addr_file),
            Duration::from_secs(30),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        let want = format!("distlock: cannot use data directory {}: {reason}", dir.display());
        assert_eq!(stderr.trim_end(), want);
        assert!(!addr_file.exists(), "a server that did not start announced an address");
    }
    // A missing directory (parents too) is created.
    let fresh = scratch.0.join("new/data");
    let s = serve(&["--listen", "127.0.0.1:0", "--data-dir", fresh.to_str().unwrap()], &scratch);
    assert!(answers(s.addr));
    assert!(fresh.join(format!("log.{:016x}.jsonl", 1)).is_file(), "the first log segment");
}

/// A frame: the body with its length in front (ZooKeeper's framing).
fn framed(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn jute_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Reads one frame's body.
fn read_framed(sock: &mut std::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    sock.read_exact(&mut body)?;
    Ok(body)
}

/// A server that was itself slow (here: paused with SIGSTOP for twice the session timeout)
/// expires nobody for it: its clients could not be heard meanwhile. The session and its ephemeral
/// node (a held lock) survive, and the client's next request is answered. A raw client is used:
/// it waits as long as it is told to, where a library client gives its session up on its own.
#[test]
fn a_paused_server_expires_no_session_for_its_own_pause() {
    let scratch = Scratch::new();
    let s = serve(&["--listen", "127.0.0.1:0", "--tick", "200ms"], &scratch);
    let mut sock = std::net::TcpStream::connect(s.addr).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&0i32.to_be_bytes()); // protocol version
    hello.extend_from_slice(&0i64.to_be_bytes()); // last zxid seen
                                                  // 3 s: this raw client sends no pings, so the session must outlast the steps between the
                                                  // create and the pause, and between the resume and the ping, on a busy machine too.
    hello.extend_from_slice(&3000i32.to_be_bytes()); // session timeout 3 s
    hello.extend_from_slice(&0i64.to_be_bytes()); // new session
    jute_string(&mut hello, "0123456789abcdef"); // password
    sock.write_all(&framed(&hello)).unwrap();
    let connected = read_framed(&mut sock).unwrap();
    assert_eq!(i32::from_be_bytes(connected[4..8].try_into().unwrap()), 3000, "negotiated 3 s");
    let mut create = Vec::new();
    create.extend_from_slice(&1i32.to_be_bytes()); // xid
    create.extend_from_slice(&1i32.to_be_bytes()); // create
    jute_string(&mut create, "/held-while-paused");
    create.extend_from_slice(&0i32.to_be_bytes()); // empty data
    create.extend_from_slice(&1i32.to_be_bytes()); // one ACL: world:anyone, all
    create.extend_from_slice(&31i32.to_be_bytes());
    jute_string(&mut create, "world");
    jute_string(&mut create, "anyone");
    create.extend_from_slice(&1i32.to_be_bytes()); // ephemeral
    sock.write_all(&framed(&create)).unwrap();
    let created = read_framed(&mut sock).unwrap();
    assert_eq!(i32::from_be_bytes(created[12..16].try_into().unwrap()), 0, "created");
    let pid = s.child.id().to_string();
    assert!(Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    // The fault: the server is paused for twice the session timeout.
    std::thread::sleep(Duration::from_secs(6));
    assert!(Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    // The client speaks again only now: the server's clock is past the session's deadline.
    let mut ping = Vec::new();
    ping.extend_from_slice(&(-2i32).to_be_bytes());
    ping.extend_from_slice(&11i32.to_be_bytes());
    sock.write_all(&framed(&ping)).unwrap();
    let reply = read_framed(&mut sock).expect("the session was expired and its connection closed");
    assert_eq!(i32::from_be_bytes(reply[0..4].try_into().unwrap()), -2, "a ping reply");
    let mut exists = Vec::new();
    exists.extend_from_slice(&3i32.to_be_bytes()); // xid
    exists.extend_from_slice(&3i32.to_be_bytes()); // exists
    jute_string(&mut exists, "/held-while-paused");
    exists.push(0); // no watch
    sock.write_all(&framed(&exists)).unwrap();
    let found = read_framed(&mut sock).unwrap();
    assert_eq!(i32::from_be_bytes(found[12..16].try_into().unwrap()), 0, "the ephemeral node survived");
}

/// `distlock serve --data-dir` killed with SIGKILL at random moments while a client writes (and
/// snapshots taken every 7 transactions, so kills land on both sides of snapshot boundaries):
/// after each restart every acknowledged write is there, and the ephemeral nodes of the killed
/// clients' sessions expire once those sessions time out.
#[test]
fn killed_at_random_the_server_keeps_every_acknowledged_write() {
    let scratch = Scratch::new();
    let data = scratch.0.join("data");
    let data = data.to_str().unwrap();
    let args = ["--listen", "127.0.0.1:0", "--tick", "200ms", "--data-dir", data, "--snapshot-every", "7"];
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    println!("kill timing seed {seed}");
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let open = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let eph = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
    let connect = |addr: SocketAddr| async move {
        zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_millis(1000))
            .connect(&addr.to_string())
            .await
            .unwrap()
    };
    for cycle in 0..6 {
        let mut s = serve(&args, &scratch);
        let c = rt.block_on(async {
            let c = connect(s.addr).await;
            let written = acked.lock().unwrap().clone();
            for path in &written {
                assert!(c.check_stat(path).await.unwrap().is_some(), "cycle {cycle}: acknowledged {path} is gone");
            }
            if cycle == 0 {
                c.create("/crash", b"", &open).await.unwrap();
            }
            c.create(&format!("/crash/eph-{cycle}"), b"", &eph).await.unwrap();
            c
        });
        let acked_by_writer = acked.clone();
        let writer = rt.spawn(async move {
            let open = zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
            for i in 0.. {
                let path = format!("/crash/c{cycle}-{i}");
                if c.create(&path, format!("{i}").as_bytes(), &open).await.is_err() {
                    return;
                }
                acked_by_writer.lock().unwrap().push(path);
            }
        });
        // The fault: SIGKILL after 50 to 450 ms of writing.
        std::thread::sleep(Duration::from_millis(50 + next() % 400));
        s.child.kill().unwrap();
        s.child.wait().unwrap();
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), writer).await.unwrap().unwrap() });
    }
    let s = serve(&args, &scratch);
    rt.block_on(async {
        let c = connect(s.addr).await;
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() > 6, "writes were acknowledged ({})", acked.len());
        for path in &acked {
            assert!(c.check_stat(path).await.unwrap().is_some(), "acknowledged {path} is gone");
        }
        // The killed clients never come back: their sessions expire and take their ephemerals.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left: Vec<String> =
                c.list_children("/crash").await.unwrap().into_iter().filter(|n| n.starts_with("eph-")).collect();
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "ephemerals of dead sessions never expired: {left:?}");
            tokio::time::sleep(Duration::from_millis(50)).await; // polling the server: no event to wait on
        }
        println!("{} acknowledged writes survived 6 SIGKILLs", acked.len());
    });
}
