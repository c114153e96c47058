//! The embedded server against a real ZooKeeper client (zookeeper-client) and raw frames.

use distlock_server::{Config, EmbeddedServer, Fsync};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client as zk;

use crate::common;
use common::{
    attach, connect_frame, create_body, create_frame, frame, jute_string, multi_create_cases, multi_with_one_create,
    one_create_result, raw, request, BOUND,
};

async fn server() -> EmbeddedServer {
    EmbeddedServer::start_with(Config { tick: Duration::from_millis(500), ..Default::default() }).await.unwrap()
}

async fn client(s: &EmbeddedServer) -> zk::Client {
    zk::Client::connector().with_session_timeout(Duration::from_secs(4)).connect(&s.addr().to_string()).await.unwrap()
}

fn open() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

fn persistent_with(acl: &[zk::Acl]) -> zk::CreateOptions<'_> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::new(acl))
}

#[tokio::test]
async fn create_modes_stats_and_sequences() {
    let s = server().await;
    let c = client(&s).await;
    let (stat, _) = c.create("/a", b"hello", &open()).await.unwrap();
    assert_eq!((stat.version, stat.data_length, stat.num_children, stat.ephemeral_owner), (0, 5, 0, 0));
    assert_eq!(stat.czxid, stat.mzxid);
    assert_eq!(c.create("/a", b"", &open()).await.unwrap_err(), zk::Error::NodeExists);
    assert_eq!(c.create("/x/y", b"", &open()).await.unwrap_err(), zk::Error::NoNode);
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    let (_, s1) = c.create("/a/n-", b"", &seq).await.unwrap();
    let (_, s2) = c.create("/a/n-", b"", &seq).await.unwrap();
    assert_eq!((s1.to_string(), s2.to_string()), ("0000000000".into(), "0000000001".into()));
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    let (estat, _) = c.create("/a/e", b"", &eph).await.unwrap();
    assert_eq!(estat.ephemeral_owner, c.session_id().0);
    assert_eq!(c.create("/a/e/x", b"", &open()).await.unwrap_err(), zk::Error::NoChildrenForEphemerals);
    let (data, st) = c.get_data("/a").await.unwrap();
    assert_eq!(data, b"hello");
    assert_eq!((st.num_children, st.cversion), (3, 3));
    let (children, st2) = c.get_children("/a").await.unwrap();
    assert_eq!(children.len(), 3);
    assert_eq!(st2.pzxid, estat.czxid);
    // setData / delete with versions.
    assert_eq!(c.set_data("/a", b"v2", Some(7)).await.unwrap_err(), zk::Error::BadVersion);
    let st3 = c.set_data("/a", b"v2", Some(0)).await.unwrap();
    assert_eq!(st3.version, 1);
    assert!(st3.mzxid > st3.czxid);
    assert_eq!(c.delete("/a", None).await.unwrap_err(), zk::Error::NotEmpty);
    assert_eq!(c.delete("/a/n-0000000000", Some(3)).await.unwrap_err(), zk::Error::BadVersion);
    c.delete("/a/n-0000000000", Some(0)).await.unwrap();
    assert_eq!(c.count_descendants_number("/a").await.unwrap(), 2);
    assert_eq!(c.list_ephemerals("/").await.unwrap(), vec!["/a/e"]);
    c.sync("/a").await.unwrap();
    assert!(c.check_stat("/nope").await.unwrap().is_none());
}

#[tokio::test]
async fn ephemerals_go_when_the_session_closes_and_watches_fire() {
    let s = server().await;
    let a = client(&s).await;
    let b = client(&s).await;
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    a.create("/e", b"", &eph).await.unwrap();
    let (_, _, w) = b.get_and_watch_data("/e").await.unwrap();
    drop(a); // closes the session
    let ev = tokio::time::timeout(BOUND, w.changed()).await.unwrap();
    assert_eq!(ev.event_type, zk::EventType::NodeDeleted);
    assert!(b.check_stat("/e").await.unwrap().is_none());
}

#[tokio::test]
async fn silent_sessions_expire() {
    let s = server().await;
    let b = client(&s).await;
    // A raw client: handshake asking for 1 s, one ephemeral create, then silence (no pings).
    let (mut sock, _, _, _) = attach(s.addr(), 0, &[0; 16], 1000).await;
    sock.write_all(&create_frame("/silent", 1)).await.unwrap();
    let (stat, w) = b.check_and_watch_stat("/silent").await.unwrap();
    let w = match stat {
        Some(_) => w,
        None => {
            // The create is not applied yet: wait for it, then watch for the deletion.
            assert_eq!(tokio::time::timeout(BOUND, w.changed()).await.unwrap().event_type, zk::EventType::NodeCreated);
            b.check_and_watch_stat("/silent").await.unwrap().1
        }
    };
    let ev = tokio::time::timeout(BOUND, w.changed()).await.expect("silent session expired");
    assert_eq!(ev.event_type, zk::EventType::NodeDeleted);
    // Its connection was closed by the server.
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, sock.read_to_end(&mut rest)).await.unwrap().ok();
}

#[tokio::test]
async fn one_shot_watches_fire_in_order_with_reads() {
    let s = server().await;
    let a = client(&s).await;
    let b = client(&s).await;
    a.create("/w", b"0", &open()).await.unwrap();
    let (_, _, data_w) = b.get_and_watch_data("/w").await.unwrap();
    let (_, child_w) = b.list_and_watch_children("/w").await.unwrap();
    let (_, exist_w) = b.check_and_watch_stat("/w/new").await.unwrap();
    a.set_data("/w", b"1", None).await.unwrap();
    a.create("/w/new", b"", &open()).await.unwrap();
    assert_eq!(tokio::time::timeout(BOUND, data_w.changed()).await.unwrap().event_type, zk::EventType::NodeDataChanged);
    assert_eq!(
        tokio::time::timeout(BOUND, child_w.changed()).await.unwrap().event_type,
        zk::EventType::NodeChildrenChanged
    );
    let ev = tokio::time::timeout(BOUND, exist_w.changed()).await.unwrap();
    assert_eq!((ev.event_type, ev.path.as_str()), (zk::EventType::NodeCreated, "/w/new"));
}

#[tokio::test]
async fn persistent_and_recursive_watches() {
    let s = server().await;
    let a = client(&s).await;
    let b = client(&s).await;
    a.create("/p", b"", &open()).await.unwrap();
    let mut pers = b.watch("/p", zk::AddWatchMode::Persistent).await.unwrap();
    let mut rec = b.watch("/p", zk::AddWatchMode::PersistentRecursive).await.unwrap();
    a.create("/p/c", b"", &open()).await.unwrap();
    a.set_data("/p/c", b"x", None).await.unwrap();
    a.set_data("/p", b"y", None).await.unwrap();
    let e1 = tokio::time::timeout(BOUND, pers.changed()).await.unwrap();
    assert_eq!((e1.event_type, e1.path.as_str()), (zk::EventType::NodeChildrenChanged, "/p"));
    let e2 = tokio::time::timeout(BOUND, pers.changed()).await.unwrap();
    assert_eq!((e2.event_type, e2.path.as_str()), (zk::EventType::NodeDataChanged, "/p"));
    let r1 = tokio::time::timeout(BOUND, rec.changed()).await.unwrap();
    assert_eq!((r1.event_type, r1.path.as_str()), (zk::EventType::NodeCreated, "/p/c"));
    let r2 = tokio::time::timeout(BOUND, rec.changed()).await.unwrap();
    assert_eq!((r2.event_type, r2.path.as_str()), (zk::EventType::NodeDataChanged, "/p/c"));
    let r3 = tokio::time::timeout(BOUND, rec.changed()).await.unwrap();
    assert_eq!((r3.event_type, r3.path.as_str()), (zk::EventType::NodeDataChanged, "/p"));
}

#[tokio::test]
async fn multi_is_atomic_with_per_op_results_and_multi_read() {
    let s = server().await;
    let c = client(&s).await;
    c.create("/m", b"", &open()).await.unwrap();
    let mut w = c.new_multi_writer();
    w.add_create("/m/a", b"1", &open()).unwrap();
    w.add_check_version("/m", 0).unwrap();
    w.add_create("/m/a/b", b"2", &open()).unwrap();
    w.add_set_data("/m/a", b"3", Some(0)).unwrap();
    let results = w.commit().await.unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(c.get_data("/m/a").await.unwrap().0, b"3");
    // A failing check undoes everything before it.
    let mut w = c.new_multi_writer();
    w.add_create("/m/x", b"", &open()).unwrap();
    w.add_delete("/m/a/b", None).unwrap();
    w.add_check_version("/m", 99).unwrap();
    w.add_create("/m/y", b"", &open()).unwrap();
    match w.commit().await {
        Err(zk::MultiWriteError::OperationFailed { index: 2, source: zk::Error::BadVersion }) => {}
        other => panic!("{other:?}"),
    }
    assert!(c.check_stat("/m/x").await.unwrap().is_none());
    assert!(c.check_stat("/m/a/b").await.unwrap().is_some());
    let (_, st) = c.get_data("/m").await.unwrap();
    assert_eq!(st.num_children, 1);
    let mut r = c.new_multi_reader();
    r.add_get_data("/m/a").unwrap();
    r.add_get_children("/m").unwrap();
    r.add_get_data("/missing").unwrap();
    let out = r.commit().await.unwrap();
    assert!(matches!(&out[0], zk::MultiReadResult::Data { data, .. } if data == b"3"));
    assert!(matches!(&out[1], zk::MultiReadResult::Children { children } if children == &vec!["a".to_string()]));
    assert!(matches!(&out[2], zk::MultiReadResult::Error { err: zk::Error::NoNode }));
}

#[tokio::test]
async fn containers_and_ttl_nodes_are_reaped() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        container_check: Duration::from_millis(100),
        ..Default::default()
    })
    .await
    .unwrap();
    let c = client(&s).await;
    c.create("/box", b"", &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all())).await.unwrap();
    c.create("/box/x", b"", &open()).await.unwrap();
    c.create("/ttl", b"", &open().with_ttl(Duration::from_millis(200))).await.unwrap();
    let (_, ttl_w) = c.check_and_watch_stat("/ttl").await.unwrap();
    assert_eq!(tokio::time::timeout(BOUND, ttl_w.changed()).await.unwrap().event_type, zk::EventType::NodeDeleted);
    assert!(c.check_stat("/box").await.unwrap().is_some(), "a container with children stays");
    let (_, box_w) = c.check_and_watch_stat("/box").await.unwrap();
    c.delete("/box/x", None).await.unwrap();
    assert_eq!(tokio::time::timeout(BOUND, box_w.changed()).await.unwrap().event_type, zk::EventType::NodeDeleted);
}

#[tokio::test]
async fn digest_acls_are_enforced_and_whoami_reports() {
    let s = server().await;
    let owner =
        zk::Client::connector().with_auth("digest", b"alice:secret").connect(&s.addr().to_string()).await.unwrap();
    let stranger = client(&s).await;
    owner.create("/private", b"x", &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())).await.unwrap();
    assert_eq!(stranger.get_data("/private").await.unwrap_err(), zk::Error::NoAuth);
    assert_eq!(stranger.set_data("/private", b"y", None).await.unwrap_err(), zk::Error::NoAuth);
    assert_eq!(owner.get_data("/private").await.unwrap().0, b"x");
    let (acl, _) = owner.get_acl("/private").await.unwrap();
    assert_eq!(acl[0].scheme(), "digest");
    assert!(acl[0].id().starts_with("alice:"));
    stranger.auth("digest", b"alice:secret").await.unwrap();
    assert_eq!(stranger.get_data("/private").await.unwrap().0, b"x");
    let users = stranger.list_auth_users().await.unwrap();
    assert!(users.iter().any(|u| u.scheme() == "digest" && u.user().starts_with("alice:")), "{users:?}");
    // Without credentials, the auth scheme has nothing to expand to.
    let anon = client(&s).await;
    assert_eq!(
        anon.create("/p2", b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all())).await.unwrap_err(),
        zk::Error::InvalidAcl
    );
    // setACL with versions.
    owner.set_acl("/private", &zk::Acls::anyone_all(), Some(0)).await.unwrap();
    assert_eq!(anon.get_data("/private").await.unwrap().0, b"x");
}

/// Sends raw bytes as a client would; returns what the server sent back before closing.
#[tokio::test]
async fn malformed_frames_close_only_that_connection() {
    let s = server().await;
    let healthy = client(&s).await;
    healthy.create("/alive", b"", &open()).await.unwrap();
    // Oversized length prefix.
    raw(s.addr(), &(64i32 << 20).to_be_bytes()).await;
    // Negative length.
    raw(s.addr(), &(-5i32).to_be_bytes()).await;
    // Truncated connect request.
    raw(s.addr(), &[0, 0, 0, 10, 0, 0, 0]).await;
    // Garbage connect body.
    raw(s.addr(), &[0, 0, 0, 3, 1, 2, 3]).await;
    // A valid connect, then an unknown opcode: the connection is closed after the handshake.
    let mut bytes = connect_frame();
    let req = [0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0x7f, 0x7f];
    bytes.extend_from_slice(&req);
    let reply = raw(s.addr(), &bytes).await;
    assert!(reply.len() >= 4 + 36, "handshake answered before closing");
    // A valid connect, then a getData whose string length lies.
    let mut bytes = connect_frame();
    let body = [0, 0, 0, 1, 0, 0, 0, 4, 0x7f, 0xff, 0xff, 0xff, b'/'];
    bytes.extend_from_slice(&(body.len() as i32).to_be_bytes());
    bytes.extend_from_slice(&body);
    raw(s.addr(), &bytes).await;
    // Everyone else is still served.
    assert!(healthy.check_stat("/alive").await.unwrap().is_some());
    let fresh = client(&s).await;
    assert!(fresh.check_stat("/alive").await.unwrap().is_some());
}

#[tokio::test]
async fn four_letter_words() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        four_letter_words: distlock_server::FOUR_LETTER_WORDS.to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(raw(s.addr(), b"ruok").await, b"imok");
    let srvr = String::from_utf8(raw(s.addr(), b"srvr").await).unwrap();
    assert!(srvr.contains("Mode: standalone") && srvr.contains("Zxid:"), "{srvr}");
    let mntr = String::from_utf8(raw(s.addr(), b"mntr").await).unwrap();
    assert!(mntr.contains("zk_znode_count"), "{mntr}");
    let stat = String::from_utf8(raw(s.addr(), b"stat").await).unwrap();
    assert!(stat.contains("Clients:"), "{stat}");
    // Clients parse the version's leading x.y.z (kazoo's server_version() reads envi).
    let envi = String::from_utf8(raw(s.addr(), b"envi").await).unwrap();
    let version = envi.lines().find_map(|l| l.strip_prefix("zookeeper.version=")).expect("a version line");
    let digits: Vec<u32> = version.split(['-', ',']).next().unwrap().split('.').map(|d| d.parse().unwrap()).collect();
    assert!(digits.len() == 3 && digits[0] == 3, "{version}");
    assert!(srvr.contains(&format!("Zookeeper version: {version}")), "{srvr}");
    // Real counters: the requests above were counted and timed; cons lists the connection.
    let c = client(&s).await;
    c.create("/counted", b"", &open()).await.unwrap();
    let srvr = String::from_utf8(raw(s.addr(), b"srvr").await).unwrap();
    let received: u64 = srvr.lines().find_map(|l| l.strip_prefix("Received: ")).unwrap().parse().unwrap();
    assert!(received >= 1, "{srvr}");
    let latency = srvr.lines().find_map(|l| l.strip_prefix("Latency min/avg/max: ")).unwrap();
    assert_eq!(latency.split('/').filter(|x| x.parse::<f64>().is_ok()).count(), 3, "{srvr}");
    let cons = String::from_utf8(raw(s.addr(), b"cons").await).unwrap();
    assert!(cons.contains(&format!("sid={:#x}", c.session_id().0)), "{cons}");
}

/// In a multi, each create is answered by its mode, whatever opcode carried it, as ZooKeeper 3.8.0
/// does: a container or TTL create as a create2 result (path and stat; the Java client disconnects
/// on "Invalid type 19 in MultiResponse"), any other as a create result (the path alone), even
/// when sent as create2 or createContainer. A create on its own still answers by its opcode.
#[tokio::test]
async fn a_multi_answers_each_create_by_its_mode() {
    let s = server().await;
    let (mut sock, _, session, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    for (xid, (opcode, flags, ttl)) in (1..).zip(multi_create_cases()) {
        let path = format!("/in-a-multi-{opcode}-{flags}");
        let (e, body) = request(&mut sock, xid, 14, &multi_with_one_create(opcode, &path, flags, ttl)).await;
        let expected = if (4..=6).contains(&flags) { "type 15 with stat" } else { "type 1 without stat" };
        assert_eq!((e, one_create_result(&body).as_str()), (0, expected), "opcode {opcode}, flags {flags}");
    }
    // The flags made the node, not the opcode: createContainer with the ephemeral flag.
    let c = client(&s).await;
    let made = c.check_stat("/in-a-multi-19-1").await.unwrap().expect("created by the multi");
    assert_eq!(made.ephemeral_owner, session);
    // On its own: create2 answers with the stat even for a plain node, create without it even
    // for a container (their replies are the path, 4 + length bytes, and the stat, 68).
    let (e, body) = request(&mut sock, 100, 15, &create_body("/alone-create2", Some(b""), 0)).await;
    assert_eq!((e, body.len()), (0, 4 + "/alone-create2".len() + 68));
    let (e, body) = request(&mut sock, 101, 1, &create_body("/alone-container", Some(b""), 4)).await;
    assert_eq!((e, body.len()), (0, 4 + "/alone-container".len()));
}

/// An ACL list given to create (on its own or in a multi) or setACL keeps one of each repeated
/// entry (same perms, scheme and id), in the order first given, as ZooKeeper's fixupACL does
/// (kazoo's test_create_acl_duplicate).
#[tokio::test]
async fn repeated_acl_entries_are_kept_once() {
    let s = server().await;
    let c = zk::Client::connector().with_auth("digest", b"alice:secret").connect(&s.addr().to_string()).await.unwrap();
    let all = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("world", "anyone"));
    let read = zk::Acl::new(zk::Permission::READ, zk::AuthId::new("world", "anyone"));
    let digest = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", "bob:aGFzaA=="));
    let creator = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("auth", ""));
    // kazoo's case: one entry given twice.
    c.create("/dup", b"", &persistent_with(&[all.clone(), all.clone()])).await.unwrap();
    assert_eq!(c.get_acl("/dup").await.unwrap().0, vec![all.clone()]);
    // Repeats anywhere in the list; each kept where it first appears.
    let mixed = [all.clone(), read.clone(), all.clone(), digest.clone(), read.clone(), digest.clone()];
    c.create("/dup/mixed", b"", &persistent_with(&mixed)).await.unwrap();
    assert_eq!(c.get_acl("/dup/mixed").await.unwrap().0, vec![all.clone(), read.clone(), digest.clone()]);
    // Same scheme and id with other perms is another entry.
    c.set_acl("/dup", &[read.clone(), all.clone(), read.clone(), all.clone()], None).await.unwrap();
    assert_eq!(c.get_acl("/dup").await.unwrap().0, vec![read.clone(), all.clone()]);
    // A create inside a multi.
    let mut w = c.new_multi_writer();
    w.add_create("/dup/in-a-multi", b"", &persistent_with(&[digest.clone(), digest.clone(), all.clone()])).unwrap();
    w.commit().await.unwrap();
    assert_eq!(c.get_acl("/dup/in-a-multi").await.unwrap().0, vec![digest.clone(), all.clone()]);
    // The auth scheme given twice expands once, to the session's digest id.
    c.create("/dup/creator", b"", &persistent_with(&[creator.clone(), creator.clone()])).await.unwrap();
    let (acl, _) = c.get_acl("/dup/creator").await.unwrap();
    assert_eq!(acl.len(), 1, "{acl:?}");
    assert_eq!((acl[0].scheme(), acl[0].permission()), ("digest", zk::Permission::ALL));
    assert!(acl[0].id().starts_with("alice:"), "{acl:?}");
    // Only the list as sent is rid of repeats: an entry the auth expansion repeats stays twice,
    // as in ZooKeeper.
    let alice = acl[0].clone();
    c.create("/dup/expanded", b"", &persistent_with(&[alice.clone(), creator.clone()])).await.unwrap();
    assert_eq!(c.get_acl("/dup/expanded").await.unwrap().0, vec![alice.clone(), alice.clone()]);
}

#[tokio::test]
async fn connection_limit_is_enforced() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_connections: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let first = client(&s).await;
    let addr = s.addr().to_string();
    let refused = zk::Client::connector()
        .with_connection_timeout(Duration::from_millis(500))
        .with_session_timeout(Duration::from_secs(1))
        .connect(&addr);
    assert!(tokio::time::timeout(Duration::from_secs(10), refused).await.map(|r| r.is_err()).unwrap_or(true));
    assert!(first.check_stat("/").await.unwrap().is_some());
}

#[tokio::test]
async fn watch_limit_is_enforced() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_watches_per_session: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let c = client(&s).await;
    let _w1 = c.check_and_watch_stat("/a").await.unwrap();
    let _w2 = c.check_and_watch_stat("/b").await.unwrap();
    assert_eq!(c.check_and_watch_stat("/c").await.unwrap_err(), zk::Error::Throttled);
}

#[tokio::test]
async fn nodes_and_sessions_survive_a_restart_with_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config {
        tick: Duration::from_millis(500),
        data_dir: Some(dir.path().to_path_buf()),
        fsync: Fsync::Always,
        snapshot_every: 5,
        ..Default::default()
    };
    let s = EmbeddedServer::start_with(cfg.clone()).await.unwrap();
    let addr = s.addr();
    // The client reaches the server through a proxy we can cut, so after the "crash" it cannot
    // come back and compete for its session with the client that takes it over.
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let forwarding = tokio::spawn(async move {
        let mut conns = Vec::new();
        loop {
            let Ok((mut inbound, _)) = proxy.accept().await else { return };
            conns.push(tokio::spawn(async move {
                if let Ok(mut out) = TcpStream::connect(addr).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            }));
        }
    });
    let c = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&proxy_addr.to_string())
        .await
        .unwrap();
    for i in 0..8 {
        c.create(&format!("/n{i}"), format!("{i}").as_bytes(), &open()).await.unwrap();
    }
    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    c.create("/mine", b"", &eph).await.unwrap();
    let session = c.session().clone();
    let czxid = c.check_stat("/n7").await.unwrap().unwrap().czxid;
    forwarding.abort(); // the process "crashes": no close, and it never comes back
    s.stop().await;
    let s2 = EmbeddedServer::bind(addr, cfg).await.unwrap();
    let c2 = zk::Client::connector().with_session(session).connect(&addr.to_string()).await.unwrap();
    assert_eq!(c2.get_data("/n3").await.unwrap().0, b"3");
    assert_eq!(c2.check_stat("/n7").await.unwrap().unwrap().czxid, czxid);
    let mine = c2.check_stat("/mine").await.unwrap().expect("the session survived, so did its ephemeral");
    assert_eq!(mine.ephemeral_owner, c2.session_id().0);
    let (_, seq) =
        c2.create("/s-", b"", &zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all())).await.unwrap();
    assert!(
        c2.check_stat("/n0").await.unwrap().unwrap().czxid
            < c2.check_stat(&format!("/s-{seq}")).await.unwrap().unwrap().czxid
    );
    drop(s2);
    std::mem::forget(c);
}

/// A bounded, deterministic stand-in for the fuzz target (which needs cargo-fuzz): random and
/// mutated frames through every decoder must never panic.
#[test]
fn random_frames_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    // Well-formed seeds: a getData, a create, a multi; then mutate them.
    let mut get = vec![0, 0, 0, 1, 0, 0, 0, 4];
    get.extend_from_slice(&2i32.to_be_bytes());
    get.extend_from_slice(b"/a");
    get.push(1);
    let seeds: Vec<Vec<u8>> = vec![get, connect_frame()[4..].to_vec(), vec![0, 0, 0, 2, 0, 0, 0, 14, 0, 0, 0, 1, 0]];
    for i in 0..20_000 {
        let mut f = if i % 2 == 0 {
            seeds[i % seeds.len()].clone()
        } else {
            (0..rng.random_range(0..64)).map(|_| rng.random::<u8>()).collect()
        };
        if !f.is_empty() {
            for _ in 0..rng.random_range(0..4) {
                let at = rng.random_range(0..f.len());
                f[at] = rng.random();
            }
        }
        let opcode: i32 =
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 21, 22, 100, 101, 103, 104, 105, 106, 107]
                [i % 26];
        if f.len() >= 8 && i % 3 == 0 {
            f[4..8].copy_from_slice(&opcode.to_be_bytes());
        }
        distlock_server::decode_for_fuzzing(&f);
    }
}

#[tokio::test]
async fn stopping_the_server_closes_its_connections() {
    let s = server().await;
    let c = client(&s).await;
    let mut states = c.state_watcher();
    assert_eq!(states.state(), zk::SessionState::SyncConnected);
    s.stop().await;
    let state = tokio::time::timeout(BOUND, states.changed()).await.expect("the client notices");
    assert_eq!(state, zk::SessionState::Disconnected);
}

/// Handshakes on a raw socket with `session`/`password` (0: a new session); returns the socket,
/// the negotiated timeout (0: refused as expired), the session id and the password.
/// Sessions that expire have their sockets closed for good: silent clients cannot hold every
/// connection slot (20 of them used to lock out even four-letter words).
#[tokio::test]
async fn expired_sessions_free_their_connection_slots() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_connections: 3,
        ..Default::default()
    })
    .await
    .unwrap();
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(attach(s.addr(), 0, &[0; 16], 1000).await.0);
    }
    // Each session expires and the server closes its socket (we keep ours open).
    for sock in &mut silent {
        let mut rest = Vec::new();
        tokio::time::timeout(BOUND, sock.read_to_end(&mut rest)).await.expect("closed by the server").unwrap();
    }
    // Their slots come free: a four-letter word is answered again.
    slots_come_free(&s, "the slots of expired sessions were never freed").await;
}

/// Waits (bounded) until `ruok` is answered again, then a client connects and reads.
async fn slots_come_free(s: &EmbeddedServer, otherwise: &str) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while raw(s.addr(), b"ruok").await != b"imok" {
        assert!(tokio::time::Instant::now() < deadline, "{otherwise}");
        tokio::time::sleep(Duration::from_millis(50)).await; // polling the server: no event to wait on
    }
    let c = client(s).await;
    assert!(c.check_stat("/").await.unwrap().is_some());
}

/// Once a session moves to a new connection, the old one is closed and nothing it sends is
/// applied (its creates used to be).
#[tokio::test]
async fn a_superseded_connection_executes_nothing() {
    let s = server().await;
    let (mut old, _, id, password) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let (_new, timeout, moved, _) = attach(s.addr(), id, &password, 4000).await;
    assert_eq!((moved, timeout > 0), (id, true));
    let _ = old.write_all(&create_frame("/from-the-old-connection", 0)).await;
    let mut rest = Vec::new();
    tokio::time::timeout(BOUND, old.read_to_end(&mut rest)).await.expect("the old connection is closed").ok();
    assert!(rest.is_empty(), "no reply on the old connection: {rest:?}");
    let c = client(&s).await;
    assert!(c.check_stat("/from-the-old-connection").await.unwrap().is_none());
}

/// A client that has seen a newer zxid than the server's is refused without a reply (how clients
/// notice a server that went back in time).
#[tokio::test]
async fn a_client_from_the_future_is_refused() {
    let s = server().await;
    let mut hello = connect_frame();
    hello[4 + 4..4 + 12].copy_from_slice(&(1i64 << 40).to_be_bytes());
    assert!(raw(s.addr(), &hello).await.is_empty(), "no session for a client that saw zxid 2^40");
    assert_eq!(raw(s.addr(), &connect_frame()).await.len(), 4 + 36, "an ordinary client is answered");
    // The readOnly byte is answered when asked (3.4+ clients), as ZooKeeper does.
    let mut asks = connect_frame();
    asks.push(0);
    let len = asks.len() as i32 - 4;
    asks[..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(raw(s.addr(), &asks).await.len(), 4 + 37, "readOnly answered");
}

/// A failing multi under a parent with many children puts every node, child set and stat back as
/// it was, including nodes it deleted and re-created (its undo no longer copies the parent's
/// children once per op).
#[tokio::test]
async fn a_failed_multi_under_a_large_parent_is_undone_exactly() {
    let s = server().await;
    let c = client(&s).await;
    c.create("/big", b"before", &open()).await.unwrap();
    let mut w = c.new_multi_writer();
    for i in 0..2000 {
        w.add_create(&format!("/big/c{i:05}"), b"", &open()).unwrap();
    }
    w.commit().await.unwrap();
    let (children_before, parent_before) = c.get_children("/big").await.unwrap();
    let mut w = c.new_multi_writer();
    for i in 0..300 {
        w.add_create(&format!("/big/new{i:03}"), b"", &open()).unwrap();
    }
    w.add_delete("/big/c00007", None).unwrap();
    w.add_create("/big/c00007", b"re-created", &open()).unwrap();
    w.add_create("/big/c00007/inner", b"", &open()).unwrap();
    w.add_delete("/big/c00008", None).unwrap();
    w.add_set_data("/big", b"after", None).unwrap();
    w.add_check_version("/big", 99).unwrap();
    assert!(matches!(
        w.commit().await,
        Err(zk::MultiWriteError::OperationFailed { source: zk::Error::BadVersion, .. })
    ));
    let (children_after, parent_after) = c.get_children("/big").await.unwrap();
    assert_eq!(children_after.len(), children_before.len());
    assert_eq!(
        children_after.iter().collect::<std::collections::BTreeSet<_>>(),
        children_before.iter().collect::<std::collections::BTreeSet<_>>()
    );
    assert_eq!(parent_after, parent_before, "the parent's stat is as before");
    assert_eq!(c.get_data("/big").await.unwrap().0, b"before");
    assert_eq!(c.get_data("/big/c00007").await.unwrap().0, b"");
    assert!(c.check_stat("/big/c00007/inner").await.unwrap().is_none());
    assert!(c.check_stat("/big/new000").await.unwrap().is_none());
}

/// A client that sends requests but never reads the replies is disconnected once its queued
/// replies pass the bound (they used to pile up in memory, 400 MB and more), and everyone else is
/// served on.
#[tokio::test]
async fn a_client_that_does_not_read_is_disconnected() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_queued_output: 4 << 20,
        ..Default::default()
    })
    .await
    .unwrap();
    let healthy = client(&s).await;
    healthy.create("/big", &vec![7u8; 512 << 10], &open()).await.unwrap();
    let (mut sock, _, _, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let mut get = Vec::new();
    get.extend_from_slice(&2i32.to_be_bytes()); // xid
    get.extend_from_slice(&4i32.to_be_bytes()); // getData
    jute_string(&mut get, "/big");
    get.push(0); // no watch
    let get = frame(&get);
    // 200 replies of 512 KiB = 100 MiB, never read while sending (the server's writes block).
    let mut sent = 0;
    for _ in 0..200 {
        match tokio::time::timeout(BOUND, sock.write_all(&get)).await.expect("write blocked past the bound") {
            Ok(()) => sent += 1,
            Err(_) => break, // the server has closed the connection already
        }
    }
    let mut received = Vec::new();
    let _ =
        tokio::time::timeout(BOUND, sock.read_to_end(&mut received)).await.expect("the server closed the connection");
    assert!(received.len() < 200 * (512 << 10), "all {sent} replies were queued and delivered");
    assert_eq!(healthy.get_data("/big").await.unwrap().0.len(), 512 << 10);
}

/// The tree starts as ZooKeeper's does: the root's child version is -1 (one child, /zookeeper,
/// that no create made), and deletes count in a child version but not in sequence numbers.
#[tokio::test]
async fn child_versions_and_sequence_numbers_count_as_zookeeper_does() {
    let s = server().await;
    let c = client(&s).await;
    assert_eq!(c.check_stat("/").await.unwrap().unwrap().cversion, -1);
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    c.create("/q", b"", &open()).await.unwrap();
    let first = c.create("/q/n-", b"", &seq).await.unwrap().1;
    c.delete(&format!("/q/n-{first}"), None).await.unwrap();
    let second = c.create("/q/n-", b"", &seq).await.unwrap().1;
    assert_eq!((first.into_i64(), second.into_i64()), (0, 1), "a delete does not advance the sequence");
    let st = c.check_stat("/q").await.unwrap().unwrap();
    assert_eq!((st.cversion, st.num_children), (3, 1), "two creates and a delete are three changes");
}

/// By default only `srvr`, `ruok` and `envi` (the version alone, which kazoo needs) answer; the
/// others, some of which list client addresses and session ids, say they are not allowed.
#[tokio::test]
async fn four_letter_words_are_off_except_srvr_ruok_and_envi() {
    let s = server().await;
    let c = client(&s).await; // a session for cons, stat and dump to name, were they answered
    assert_eq!(raw(s.addr(), b"ruok").await, b"imok");
    let srvr = String::from_utf8(raw(s.addr(), b"srvr").await).unwrap();
    assert!(srvr.contains("Mode: standalone"), "{srvr}");
    let envi = String::from_utf8(raw(s.addr(), b"envi").await).unwrap();
    assert_eq!(envi.lines().count(), 2, "envi carries the version alone: {envi}");
    let sid = format!("{:#x}", c.session_id().0);
    for word in distlock_server::FOUR_LETTER_WORDS.iter().filter(|w| !matches!(*w, b"ruok" | b"srvr" | b"envi")) {
        let name = String::from_utf8_lossy(word);
        let out = String::from_utf8(raw(s.addr(), word).await).unwrap();
        assert_eq!(out, format!("{name} is not executed because it is not in the whitelist.\n"));
        assert!(!out.contains(&sid) && !out.contains("127.0.0.1"), "{name}: {out}");
    }
}

/// A connection that does not finish its connect request (or four-letter word) within the
/// handshake deadline, counted from accept, is closed: silent sockets and half-sent frames cannot
/// hold the connection slots (they used to, for ever).
#[tokio::test]
async fn silent_and_half_sent_connections_are_closed_at_the_deadline() {
    let deadline = Duration::from_secs(1);
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_connections: 4,
        handshake_timeout: deadline,
        ..Default::default()
    })
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    let hello = connect_frame();
    let partial: [&[u8]; 4] = [b"", &[0, 0], &hello[..20], b"mnt"];
    let mut held = Vec::new();
    for bytes in partial {
        let mut sock = TcpStream::connect(s.addr()).await.unwrap();
        sock.write_all(bytes).await.unwrap();
        held.push(sock);
    }
    // Every slot is taken: a fifth connection is told so, and closed.
    let refusal = b"distlock-server: too many connections (at most 4 in all)\n";
    assert_eq!(raw(s.addr(), b"ruok").await, refusal, "a fifth connection was served past the limit");
    for (sock, bytes) in held.iter_mut().zip(partial) {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(BOUND, sock.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "a connection that sent {bytes:?} was still open after {BOUND:?}");
        assert!(rest.is_empty(), "{rest:?}");
        assert!(started.elapsed() >= deadline, "closed before its deadline: {:?}", started.elapsed());
    }
    // Their slots come free (the server counts a connection out just after closing it).
    slots_come_free(&s, "the slots were never freed").await;
}

/// One session cannot fill the server: past its node count or data total, creates (alone or in a
/// multi) and sets fail with ZooKeeper's QuotaExceeded; its neighbours are unaffected, and a
/// deleted node gives its place back.
#[tokio::test]
async fn a_session_flooding_creates_meets_its_quota() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_nodes_per_session: 20,
        max_data_per_session: 4096,
        ..Default::default()
    })
    .await
    .unwrap();
    let flood = client(&s).await;
    flood.create("/flood", b"", &open()).await.unwrap();
    for i in 1..20 {
        let mode = if i % 2 == 0 { zk::CreateMode::Ephemeral } else { zk::CreateMode::Persistent };
        flood.create(&format!("/flood/n{i}"), b"", &mode.with_acls(zk::Acls::anyone_all())).await.unwrap();
    }
    assert_eq!(flood.create("/flood/n20", b"", &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    let seq = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    assert_eq!(flood.create("/flood/seq-", b"", &seq).await.unwrap_err(), zk::Error::QuotaExceeded);
    // A neighbour's creates are its own.
    let neighbour = client(&s).await;
    neighbour.create("/flood/neighbour", b"", &open()).await.unwrap();
    // A delete (by anyone) gives the place back.
    neighbour.delete("/flood/n1", None).await.unwrap();
    flood.create("/flood/n20", b"", &open()).await.unwrap();
    assert_eq!(flood.create("/flood/n21", b"", &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    // Data: 4096 bytes in all, counted over creates and sets.
    let data = client(&s).await;
    data.create("/big", &[7u8; 3000], &open()).await.unwrap();
    assert_eq!(data.create("/big2", &[7u8; 2000], &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    data.create("/small", b"x", &open()).await.unwrap();
    assert_eq!(data.set_data("/small", &[7u8; 1500], None).await.unwrap_err(), zk::Error::QuotaExceeded);
    data.set_data("/big", b"shrunk", None).await.unwrap();
    data.set_data("/small", &[7u8; 1500], None).await.unwrap();
    // A multi is counted whole: beside /big and /small, 18 more nodes fit and the 19th is refused;
    // a refused multi leaves nothing.
    let mut m = data.new_multi_writer();
    for i in 0..18 {
        m.add_create(&format!("/m{i}"), b"", &open()).unwrap();
    }
    m.add_create("/m-too-many", b"", &open()).unwrap();
    m.add_create("/m-one-more", b"", &open()).unwrap();
    let refused = m.commit().await.unwrap_err();
    assert!(
        matches!(refused, zk::MultiWriteError::OperationFailed { index: 18, source: zk::Error::QuotaExceeded }),
        "{refused:?}"
    );
    assert!(data.check_stat("/m0").await.unwrap().is_none(), "a refused multi left a node");
    // The session's ephemerals go with it, and so do their places (a new session starts at zero).
    drop(flood);
    let fresh = client(&s).await;
    for i in 0..20 {
        fresh.create(&format!("/fresh{i}"), b"", &open()).await.unwrap();
    }
}

/// A path of `len` bytes.
fn path_of(len: usize, first: char) -> String {
    format!("/{}", first.to_string().repeat(len - 1))
}

/// Watches cost their paths' bytes: past a session's byte limit, or the server's total of them,
/// a watch is refused with Throttled as past the count limit; a watch that fires gives its bytes
/// back.
#[tokio::test]
async fn watch_bytes_are_limited_per_session_and_in_all() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_watch_bytes_per_session: 100,
        max_watch_bytes: 150,
        ..Default::default()
    })
    .await
    .unwrap();
    let (a, b, c) = (client(&s).await, client(&s).await, client(&s).await);
    // A: 60 bytes watched, then 60 more would be 120 of its 100.
    let (_, fired) = a.check_and_watch_stat(&path_of(60, 'a')).await.unwrap();
    assert_eq!(a.check_and_watch_stat(&path_of(60, 'b')).await.unwrap_err(), zk::Error::Throttled);
    assert_eq!(a.get_and_watch_children("/").await.err(), None, "a short path still fits");
    // B: 60 of its own (120 in all), then 30 (150 in all, the server's total).
    let _b1 = b.check_and_watch_stat(&path_of(60, 'c')).await.unwrap();
    let _b2 = b.check_and_watch_stat(&path_of(29, 'd')).await.unwrap();
    // C has a session's whole allowance, but the server's total is used up.
    assert_eq!(c.check_and_watch_stat(&path_of(40, 'e')).await.unwrap_err(), zk::Error::Throttled);
    assert_eq!(
        c.watch(&path_of(40, 'e'), zk::AddWatchMode::Persistent).await.err(),
        Some(zk::Error::Throttled),
        "addWatch is limited too"
    );
    // A's first watch fires: its 60 bytes are free again.
    a.create(&path_of(60, 'a'), b"", &open()).await.unwrap();
    tokio::time::timeout(BOUND, fired.changed()).await.expect("the watch fired");
    let _c1 = c.check_and_watch_stat(&path_of(40, 'e')).await.unwrap();
}

/// Nodes and data have server-wide totals beside the per-session quotas: once the tree holds
/// `max_nodes` nodes or `max_data` bytes, every session's create or set past it is refused with
/// QuotaExceeded, a fresh session's too; a delete gives the place back.
#[tokio::test]
async fn the_servers_node_and_data_totals_bind_every_session() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_nodes: 10,
        max_data: 1000,
        four_letter_words: vec![*b"mntr"],
        ..Default::default()
    })
    .await
    .unwrap();
    let (a, b) = (client(&s).await, client(&s).await);
    // The tree starts with 4 nodes (/, /zookeeper and its two children).
    a.create("/d1", &[1u8; 600], &open()).await.unwrap();
    assert_eq!(b.create("/d2", &[2u8; 500], &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    b.create("/d2", &[2u8; 300], &open()).await.unwrap();
    assert_eq!(b.set_data("/d2", &[2u8; 500], None).await.unwrap_err(), zk::Error::QuotaExceeded);
    let mntr = String::from_utf8(raw(s.addr(), b"mntr").await).unwrap();
    assert!(mntr.contains("zk_approximate_data_size\t900\n"), "{mntr}");
    for i in 1..=4 {
        a.create(&format!("/n{i}"), b"", &open()).await.unwrap();
    }
    // 10 nodes: nobody may add one, not even a session that has made none.
    assert_eq!(a.create("/n5", b"", &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    assert_eq!(b.create("/n5", b"", &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    let fresh = client(&s).await;
    assert_eq!(fresh.create("/fresh", b"", &open()).await.unwrap_err(), zk::Error::QuotaExceeded);
    b.delete("/n1", None).await.unwrap();
    fresh.create("/fresh", b"", &open()).await.unwrap();
    a.delete("/d1", None).await.unwrap();
    b.set_data("/d2", &[2u8; 1000], None).await.unwrap();
}

/// One address cannot take every slot: past `max_connections_per_address` (and past
/// `max_connections`), a connection is told why in a line of plaintext, then closed; a slot given
/// back is usable again.
#[tokio::test]
async fn too_many_connections_are_refused_with_a_reason() {
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_connections_per_address: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let (first, _, _, _) = attach(s.addr(), 0, &[0; 16], 4000).await;
    let _second = attach(s.addr(), 0, &[0; 16], 4000).await;
    let line = "distlock-server: too many connections from 127.0.0.1 (at most 2 per address)\n";
    // A session's connect request, and a four-letter word, are refused alike.
    assert_eq!(String::from_utf8(raw(s.addr(), &connect_frame()).await).unwrap(), line);
    assert_eq!(String::from_utf8(raw(s.addr(), b"ruok").await).unwrap(), line);
    drop(first);
    slots_come_free(&s, "the slot of a closed connection was never given back").await;

    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        max_connections: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let _only = attach(s.addr(), 0, &[0; 16], 4000).await;
    let told = String::from_utf8(raw(s.addr(), b"ruok").await).unwrap();
    assert_eq!(told, "distlock-server: too many connections (at most 1 in all)\n");
}

/// Where a login is required, a session that has not logged in by the handshake deadline
/// (pinging meanwhile) is ended there: its client reads AuthFailed, its connection closes and its
/// session is gone, long before it would expire; a session that logged in is kept.
#[tokio::test]
async fn unauthenticated_sessions_end_at_the_handshake_deadline() {
    use base64::Engine;
    use sha1::Digest;
    let hash = base64::engine::general_purpose::STANDARD.encode(sha1::Sha1::digest(b"alice:secret"));
    let users = std::collections::HashMap::from([("alice".to_string(), format!("alice:{hash}"))]);
    let deadline = Duration::from_millis(300);
    let s = EmbeddedServer::start_with(Config {
        tick: Duration::from_millis(500),
        users: Some(std::sync::Arc::new(users)),
        auth_required: true,
        handshake_timeout: deadline,
        ..Default::default()
    })
    .await
    .unwrap();
    let alice = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(4))
        .with_auth("digest", b"alice:secret")
        .connect(&s.addr().to_string())
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    // A 10 s session (20 ticks) that never logs in, but pings.
    let (mut sock, timeout, id, password) = attach(s.addr(), 0, &[0; 16], 10_000).await;
    assert_eq!(timeout, 10_000);
    assert_eq!(request(&mut sock, -2, 11, &[]).await.0, 0, "a ping is answered before the deadline");
    // Then: an AuthFailed state event (xid -1, type -1, state 4), and the server closes.
    let mut events = Vec::new();
    let closed = tokio::time::timeout(BOUND, async {
        loop {
            let mut len = [0u8; 4];
            if sock.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
            if sock.read_exact(&mut body).await.is_err() {
                return;
            }
            events.push(body);
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection was still open after {BOUND:?}");
    let took = started.elapsed();
    assert!(took >= deadline, "closed before the deadline: {took:?}");
    assert!(took < Duration::from_secs(5), "closed only after {took:?}: at the session's expiry, not the deadline");
    let auth_failed = events.iter().any(|e| {
        let word = |at: usize| i32::from_be_bytes(e[at..at + 4].try_into().unwrap());
        e.len() >= 24 && word(0) == -1 && word(16) == -1 && word(20) == 4
    });
    assert!(auth_failed, "no AuthFailed event before the close: {events:?}");
    // The session is gone: re-attaching to it is refused as expired.
    let (_again, timeout, _, _) = attach(s.addr(), id, &password, 10_000).await;
    assert_eq!(timeout, 0, "the session outlived its connection");
    // The session that logged in is past its deadline too, and still served.
    assert!(alice.check_stat("/").await.unwrap().is_some());
}
