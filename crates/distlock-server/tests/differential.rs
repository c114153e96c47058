//! The differential test: one scripted client sequence run against Apache ZooKeeper and against
//! the embedded server, every observable compared.
//!
//! Runs in the Apache ZooKeeper pass of `scripts/test.sh` (`DISTLOCK_TEST_ZK_DIR` set: the server at
//! `DISTLOCK_TEST_ZK` is Apache ZooKeeper); the embedded server is started here. In other passes
//! there is no Apache ZooKeeper to compare with and the test says so and returns.
//!
//! Observables are normalized only where they must differ (zxids and times are compared as
//! relations, session ids by who owns them). Every remaining difference must be listed in
//! [`KNOWN`] with its reason, and in `docs/embedded-server.md`.

use distlock_server::{Config, EmbeddedServer};
use std::time::Duration;
use zookeeper_client as zk;

use crate::common;
use common::{attach, create_body, jute, multi_create_cases, multi_with_one_create, one_create_result, request, BOUND};

/// Differences allowed, by step name, each with why.
const KNOWN: &[(&str, &str)] = &[];

fn open() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// A stat as relations that hold on any server: versions, lengths, counts, and who owns it.
fn stat(s: &zk::Stat, a: i64, b: i64) -> String {
    let owner = match s.ephemeral_owner {
        0 => "none".to_string(),
        o if o == a => "A".to_string(),
        o if o == b => "B".to_string(),
        i64::MIN => "container".to_string(),
        o if (o as u64) >> 56 == 0xff => "ttl".to_string(),
        o => format!("other {o:#x}"),
    };
    format!(
        "v={} cv={} av={} len={} nc={} owner={} created_is_modified={} times={}",
        s.version,
        s.cversion,
        s.aversion,
        s.data_length,
        s.num_children,
        owner,
        s.czxid == s.mzxid,
        // An unmodified node's mtime is its ctime. A modified one's is not earlier; whether it
        // is later depends on the clock (same millisecond or not), so only that is compared.
        match (s.czxid == s.mzxid, s.mtime.cmp(&s.ctime)) {
            (true, std::cmp::Ordering::Equal) => "mtime=ctime",
            (true, _) => "unmodified-but-mtime!=ctime",
            (false, std::cmp::Ordering::Less) => "mtime<ctime",
            (false, _) => "mtime>=ctime",
        }
    )
}

fn err<T: std::fmt::Debug>(r: Result<T, zk::Error>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => format!("error {e:?}"),
    }
}

/// Runs the script against `addr`; returns (step, observable) pairs.
async fn script(addr: &str) -> Vec<(String, String)> {
    let connect =
        || async { zk::Client::connector().with_session_timeout(Duration::from_secs(10)).connect(addr).await.unwrap() };
    let (a, b) = (connect().await, connect().await);
    let (sa, sb) = (a.session_id().0, b.session_id().0);
    let mut out: Vec<(String, String)> = Vec::new();
    let mut log = |step: &str, what: String| out.push((step.to_string(), what));
    let base = format!("/diff-{}", uuid::Uuid::new_v4().simple());

    let (st, _) = a.create(&base, b"x", &open()).await.unwrap();
    log("create", stat(&st, sa, sb));
    log("create-again", err(a.create(&base, b"", &open()).await.map(|_| ())));
    log("create-no-parent", err(a.create(&format!("{base}/missing/child"), b"", &open()).await.map(|_| ())));
    let seq = zk::CreateMode::PersistentSequential.with_acls(zk::Acls::anyone_all());
    a.create(&format!("{base}/seq"), b"", &open()).await.unwrap();
    let mut seqs = Vec::new();
    for _ in 0..3 {
        seqs.push(a.create(&format!("{base}/seq/n-"), b"", &seq).await.unwrap().1);
    }
    a.delete(&format!("{base}/seq/n-{}", seqs[2]), None).await.unwrap();
    seqs.push(a.create(&format!("{base}/seq/n-"), b"", &seq).await.unwrap().1);
    log("sequence-numbers", format!("{:?}", seqs.iter().map(|s| s.into_i64()).collect::<Vec<_>>()));
    let (data, st) = a.get_data(&base).await.unwrap();
    log("get-data", format!("{:?} {}", data, stat(&st, sa, sb)));
    log("set-data", err(a.set_data(&base, b"yy", Some(0)).await.map(|s| stat(&s, sa, sb))));
    log("set-data-bad-version", err(a.set_data(&base, b"z", Some(7)).await.map(|_| ())));
    log("delete-bad-version", err(a.delete(&format!("{base}/seq"), Some(9)).await));
    log("delete-not-empty", err(a.delete(&format!("{base}/seq"), None).await));
    log("delete-missing", err(a.delete(&format!("{base}/nothing"), None).await));
    let (mut children, st) = a.get_children(&format!("{base}/seq")).await.unwrap();
    children.sort();
    log("get-children", format!("{} children {}", children.len(), stat(&st, sa, sb)));

    let eph = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    a.create(&format!("{base}/eph"), b"", &eph).await.unwrap();
    log(
        "ephemeral-owner",
        b.check_stat(&format!("{base}/eph")).await.unwrap().map(|s| stat(&s, sa, sb)).unwrap_or_default(),
    );
    log("child-of-ephemeral", err(a.create(&format!("{base}/eph/child"), b"", &open()).await.map(|_| ())));
    log(
        "ephemerals",
        err(a.list_ephemerals(&base).await.map(|v| {
            let mut v: Vec<String> = v.iter().map(|p| p.trim_start_matches(&base).to_string()).collect();
            v.sort();
            v
        })),
    );
    log("descendants", err(a.count_descendants_number(&base).await));

    // Multi: a failing check undoes the create before it; a good one applies all.
    let mut m = a.new_multi_writer();
    m.add_create(&format!("{base}/m1"), b"", &open()).unwrap();
    m.add_check_version(&base, 42).unwrap();
    log(
        "multi-failing",
        match m.commit().await {
            Ok(r) => format!("ok {}", r.len()),
            Err(e) => format!("error {e:?}"),
        },
    );
    log("multi-undone", err(a.check_stat(&format!("{base}/m1")).await.map(|s| s.is_some())));
    let mut m = a.new_multi_writer();
    m.add_create(&format!("{base}/m2"), b"d", &open()).unwrap();
    m.add_set_data(&format!("{base}/m2"), b"e", Some(0)).unwrap();
    m.add_delete(&format!("{base}/m2"), Some(1)).unwrap();
    log(
        "multi-ok",
        match m.commit().await {
            Ok(r) => format!("ok {}", r.len()),
            Err(e) => format!("error {e:?}"),
        },
    );

    // Watches: events and their order relative to replies.
    let (none, w) = b.check_and_watch_stat(&format!("{base}/w")).await.unwrap();
    a.create(&format!("{base}/w"), b"", &open()).await.unwrap();
    let ev = tokio::time::timeout(BOUND, w.changed()).await.unwrap();
    log("exists-watch", format!("{} {:?} {}", none.is_none(), ev.event_type, ev.path.trim_start_matches(&base)));
    let (_, cw) = b.list_and_watch_children(&format!("{base}/w")).await.unwrap();
    a.create(&format!("{base}/w/c"), b"", &open()).await.unwrap();
    let ev = tokio::time::timeout(BOUND, cw.changed()).await.unwrap();
    log("child-watch", format!("{:?} {}", ev.event_type, ev.path.trim_start_matches(&base)));
    let mut rec = b.watch(&format!("{base}/r"), zk::AddWatchMode::PersistentRecursive).await.unwrap();
    a.create(&format!("{base}/r"), b"", &open()).await.unwrap();
    a.create(&format!("{base}/r/a"), b"", &open()).await.unwrap();
    a.set_data(&format!("{base}/r/a"), b"1", None).await.unwrap();
    a.delete(&format!("{base}/r/a"), None).await.unwrap();
    let mut events = Vec::new();
    for _ in 0..4 {
        let ev = tokio::time::timeout(BOUND, rec.changed()).await.unwrap();
        events.push(format!("{:?} {}", ev.event_type, ev.path.trim_start_matches(&base)));
    }
    log("recursive-watch", events.join(", "));

    // Containers and TTL nodes.
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    log(
        "container-create",
        err(a.create(&format!("{base}/ctr"), b"", &container).await.map(|(s, _)| stat(&s, sa, sb))),
    );
    let ttl = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()).with_ttl(Duration::from_secs(60));
    log("ttl-create", err(a.create(&format!("{base}/ttl"), b"", &ttl).await.map(|(s, _)| stat(&s, sa, sb))));
    log("container-stat", err(a.check_stat(&format!("{base}/ctr")).await.map(|s| s.map(|s| stat(&s, sa, sb)))));
    log("ttl-stat", err(a.check_stat(&format!("{base}/ttl")).await.map(|s| s.map(|s| stat(&s, sa, sb)))));

    // ACLs and digest auth, in every check order.
    a.auth("digest", b"alice:secret").await.unwrap();
    let private = [zk::Acl::new(zk::Permission::READ | zk::Permission::ADMIN, zk::AuthId::new("auth", ""))];
    let private = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&private));
    a.create(&format!("{base}/private"), b"p", &private).await.unwrap();
    let (acl, _) = a.get_acl(&format!("{base}/private")).await.unwrap();
    log("get-acl", format!("{:?}", acl.iter().map(|x| (x.scheme().to_string(), x.permission())).collect::<Vec<_>>()));
    log("read-without-auth", err(b.get_data(&format!("{base}/private")).await.map(|_| ())));
    log("write-with-auth-no-perm", err(a.set_data(&format!("{base}/private"), b"q", None).await.map(|_| ())));
    log("write-bad-version-no-perm", err(b.set_data(&format!("{base}/private"), b"q", Some(5)).await.map(|_| ())));
    log("create-under-no-create-perm", err(b.create(&format!("{base}/private/c"), b"", &open()).await.map(|_| ())));
    log("delete-missing-no-perm", err(b.delete(&format!("{base}/private/none"), None).await));
    let bad_acl = [zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("digest", "not-a-digest"))];
    log(
        "bad-acl-missing-parent",
        err(a
            .create(&format!("{base}/absent/x"), b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&bad_acl)))
            .await
            .map(|_| ())),
    );
    log(
        "set-acl-bad-version-no-perm",
        err(b.set_acl(&format!("{base}/private"), &zk::Acls::anyone_all(), Some(9)).await.map(|_| ())),
    );
    log("check-no-perm", {
        let mut m = b.new_multi_writer();
        m.add_check_version(&format!("{base}/private"), 9).unwrap();
        match m.commit().await {
            Ok(r) => format!("ok {}", r.len()),
            Err(e) => format!("error {e:?}"),
        }
    });
    log(
        "set-acl-bad-version",
        err(a.set_acl(&format!("{base}/private"), &zk::Acls::anyone_all(), Some(9)).await.map(|_| ())),
    );

    // Sync, and a chroot client.
    log("sync", err(a.sync(&base).await));
    let chrooted = zk::Client::connector().connect(&format!("{addr}{base}")).await.unwrap();
    chrooted.create("/in-chroot", b"", &open()).await.unwrap();
    log("chroot", err(a.check_stat(&format!("{base}/in-chroot")).await.map(|s| s.is_some())));

    // The nodes every server starts with, and what they allow.
    for p in ["/zookeeper", "/zookeeper/config", "/zookeeper/quota"] {
        log(
            "system-node",
            format!("{p} {}", err(a.get_data(p).await.map(|(d, s)| format!("{d:?} {}", stat(&s, sa, sb))))),
        );
        log("system-acl", format!("{p} {}", err(a.get_acl(p).await.map(|(acl, _)| acl_text(&acl)))));
    }
    log("root-acl", err(a.get_acl("/").await.map(|(acl, _)| acl_text(&acl))));
    log("write-config", err(b.set_data("/zookeeper/config", b"x", None).await.map(|_| ())));
    // (A wrong version: the permission is checked first, and nothing is changed.)
    log("write-quota", err(b.set_data("/zookeeper/quota", b"x", Some(999)).await.map(|_| ())));
    log("delete-quota", err(b.delete("/zookeeper/quota", None).await));
    log("delete-config", err(b.delete("/zookeeper/config", None).await));
    log("delete-zookeeper", err(b.delete("/zookeeper", None).await));
    // Whether a client may create under /zookeeper, without changing it: a multi whose second op
    // fails, so a permitted create is rolled back (and an forbidden one fails first).
    let mut m = b.new_multi_writer();
    m.add_create("/zookeeper/distlock-diff", b"", &open()).unwrap();
    m.add_check_version("/zookeeper", 999).unwrap();
    log(
        "create-under-zookeeper",
        m.commit().await.map(|r| format!("ok {}", r.len())).unwrap_or_else(|e| format!("{e:?}")),
    );

    // getACL without ADMIN: digest ids are shown as `user:x`.
    let mixed = [
        zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("auth", "")),
        zk::Acl::new(zk::Permission::READ, zk::AuthId::new("world", "anyone")),
    ];
    a.create(&format!("{base}/mixed"), b"", &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&mixed)))
        .await
        .unwrap();
    log("get-acl-admin", err(a.get_acl(&format!("{base}/mixed")).await.map(|(acl, _)| acl_text(&acl))));
    log("get-acl-no-admin", err(b.get_acl(&format!("{base}/mixed")).await.map(|(acl, _)| acl_text(&acl))));

    // Repeated ACL entries, kept once each in the order first given (A is alice by now).
    let all = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("world", "anyone"));
    let read = zk::Acl::new(zk::Permission::READ, zk::AuthId::new("world", "anyone"));
    let creator = zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("auth", ""));
    let dup = format!("{base}/dup");
    a.create(&dup, b"", &persistent_with(&[all.clone(), read.clone(), all.clone()])).await.unwrap();
    log("acl-repeats-create", err(a.get_acl(&dup).await.map(|(acl, _)| acl_in_order(&acl))));
    a.set_acl(&dup, &[read.clone(), all.clone(), read.clone(), all.clone()], None).await.unwrap();
    log("acl-repeats-set-acl", err(a.get_acl(&dup).await.map(|(acl, _)| acl_in_order(&acl))));
    let mut m = a.new_multi_writer();
    m.add_create(&format!("{dup}/m"), b"", &persistent_with(&[all.clone(), all.clone()])).unwrap();
    log("acl-repeats-multi", m.commit().await.map(|r| format!("ok {}", r.len())).unwrap_or_else(|e| format!("{e:?}")));
    log("acl-repeats-multi-acl", err(a.get_acl(&format!("{dup}/m")).await.map(|(acl, _)| acl_in_order(&acl))));
    // The auth scheme twice expands once; an entry that the expansion repeats is kept twice.
    a.create(&format!("{dup}/auth"), b"", &persistent_with(&[creator.clone(), creator.clone()])).await.unwrap();
    let (expanded, _) = a.get_acl(&format!("{dup}/auth")).await.unwrap();
    log("acl-repeats-auth", acl_in_order(&expanded));
    let mut both = expanded.clone();
    both.push(creator.clone());
    a.create(&format!("{dup}/auth-and-digest"), b"", &persistent_with(&both)).await.unwrap();
    log("acl-repeats-after-auth", err(a.get_acl(&format!("{dup}/auth-and-digest")).await.map(|(acl, _)| acl.len())));

    // On raw frames: what clients cannot send through zookeeper-client.
    let (mut raw, _, _, _) = attach(addr.parse().unwrap(), 0, &[0; 16], 10_000).await;
    for (name, data) in [("null", None), ("empty", Some(&b""[..])), ("one", Some(&b"1"[..]))] {
        let path = format!("{base}/data-{name}");
        let (e, _) = request(&mut raw, 1, 1, &create_body(&path, data, 0)).await;
        let (_, got) = request(&mut raw, 2, 4, &path_watch(&path, false)).await;
        log("data-create", format!("{name}: err {e}, data length field {}", be32(&got, 0)));
        let mut set = jute(&path);
        set.extend_from_slice(&(-1i32).to_be_bytes()); // null data
        set.extend_from_slice(&(-1i32).to_be_bytes()); // any version
        let (e, st) = request(&mut raw, 3, 5, &set).await;
        let (_, got) = request(&mut raw, 4, 4, &path_watch(&path, false)).await;
        log(
            "data-set-null",
            format!("{name}: err {e}, data length field {}, stat dataLength {}", be32(&got, 0), be32(&st, 36)),
        );
    }
    for path in ["noslash", "/trailing/", "/double//slash", "/dot/./x", "/dotdot/../x", "", "/nul\0x"] {
        let (e, _) = request(&mut raw, 5, 1, &create_body(path, Some(b""), 0)).await;
        let (g, _) = request(&mut raw, 6, 4, &path_watch(path, false)).await;
        let (d, _) = request(&mut raw, 7, 2, &[jute(path), (-1i32).to_be_bytes().to_vec()].concat()).await;
        log("malformed-path", format!("{path:?}: create {e}, getData {g}, delete {d}"));
    }
    for (opcode, flags) in [(1, 4), (15, 4), (19, 0), (1, 7), (1, -1)] {
        let path = format!("{base}/flags-{opcode}-{flags}");
        let (e, _) = request(&mut raw, 8, opcode, &create_body(&path, Some(b""), flags)).await;
        log("create-flags", format!("opcode {opcode} flags {flags}: {e}"));
    }
    // Each create opcode with each mode it may carry, alone in a multi: the result's type and
    // whether a stat follows the path.
    for (opcode, flags, ttl) in multi_create_cases() {
        let path = format!("{base}/in-a-multi-{opcode}-{flags}");
        let (e, body) = request(&mut raw, 11, 14, &multi_with_one_create(opcode, &path, flags, ttl)).await;
        log("multi-create-result", format!("opcode {opcode} flags {flags}: err {e}, {}", one_create_result(&body)));
    }
    // checkWatches (17) and removeWatches (18): 1 children, 2 data, 3 any.
    let (e, _) = request(&mut raw, 9, 4, &path_watch(&base, true)).await;
    let watch = |typ: i32| [jute(&base), typ.to_be_bytes().to_vec()].concat();
    let mut seen = vec![e];
    for (opcode, typ) in [(17, 2), (17, 1), (17, 3), (18, 1), (18, 2), (17, 2), (18, 2), (17, 9)] {
        seen.push(request(&mut raw, 10, opcode, &watch(typ)).await.0);
    }
    log("check-remove-watches", format!("{seen:?}"));
    drop(raw);

    // A client that has seen a later zxid than the server's is refused without a reply.
    let mut future = common::connect_frame();
    future[4 + 4..4 + 12].copy_from_slice(&(1i64 << 40).to_be_bytes());
    log(
        "last-zxid-from-the-future",
        format!("{} reply bytes", common::raw(addr.parse().unwrap(), &future).await.len()),
    );

    // Four-letter words: the same lines and keys (values differ).
    let words =
        |w: &'static [u8; 4]| async move { String::from_utf8(common::raw(addr.parse().unwrap(), w).await).unwrap() };
    let labels = |text: &str, sep: char| {
        text.lines().filter_map(|l| l.split_once(sep).map(|(k, _)| k.trim().to_string())).collect::<Vec<_>>()
    };
    log("srvr", format!("{:?}", labels(&words(b"srvr").await, ':')));
    log("ruok", words(b"ruok").await);
    log("isro", words(b"isro").await);
    let envi = words(b"envi").await;
    log(
        "envi",
        format!(
            "{:?}",
            envi.lines().take(2).map(|l| l.split('=').next().unwrap_or("").to_string()).collect::<Vec<_>>()
        ),
    );
    let mntr = labels(&words(b"mntr").await, '\t');
    let classic = CLASSIC_MNTR.iter().filter(|k| !mntr.iter().any(|m| m == *k)).collect::<Vec<_>>();
    log("mntr-classic-keys-missing", format!("{classic:?}"));
    MNTR_KEYS.with(|keys| keys.borrow_mut().push(mntr));
    let conf = labels(&words(b"conf").await, '=');
    CONF_KEYS.with(|keys| keys.borrow_mut().push(conf));

    // Clean up what is ours (the ephemeral goes with A's session).
    drop(chrooted);
    out
}

/// mntr's keys monitoring tools read (those of ZooKeeper 3.4, still printed by 3.8).
const CLASSIC_MNTR: &[&str] = &[
    "zk_version",
    "zk_avg_latency",
    "zk_max_latency",
    "zk_min_latency",
    "zk_packets_received",
    "zk_packets_sent",
    "zk_num_alive_connections",
    "zk_outstanding_requests",
    "zk_server_state",
    "zk_znode_count",
    "zk_watch_count",
    "zk_ephemerals_count",
    "zk_approximate_data_size",
    "zk_open_file_descriptor_count",
    "zk_max_file_descriptor_count",
];

thread_local! {
    /// mntr's and conf's keys per server, compared after both runs: every key of ours is one of
    /// ZooKeeper's (no invented names).
    static MNTR_KEYS: std::cell::RefCell<Vec<Vec<String>>> = const { std::cell::RefCell::new(Vec::new()) };
    static CONF_KEYS: std::cell::RefCell<Vec<Vec<String>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A create of a persistent node with `acl`.
fn persistent_with(acl: &[zk::Acl]) -> zk::CreateOptions<'_> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::new(acl))
}

/// An ACL list as the server returned it, order kept.
fn acl_in_order(acl: &[zk::Acl]) -> String {
    acl.iter().map(|x| format!("{}:{}={:?}", x.scheme(), x.id(), x.permission())).collect::<Vec<_>>().join(",")
}

fn acl_text(acl: &[zk::Acl]) -> String {
    let mut v: Vec<String> = acl.iter().map(|x| format!("{}:{}={:?}", x.scheme(), x.id(), x.permission())).collect();
    v.sort();
    v.join(",")
}

fn be32(b: &[u8], at: usize) -> i32 {
    b.get(at..at + 4).map_or(i32::MIN, |w| i32::from_be_bytes(w.try_into().unwrap()))
}

fn path_watch(path: &str, watch: bool) -> Vec<u8> {
    let mut out = jute(path);
    out.push(watch as u8);
    out
}

#[tokio::test]
async fn the_embedded_server_answers_as_apache_zookeeper_does() {
    if std::env::var_os("DISTLOCK_TEST_ZK_DIR").is_none() {
        eprintln!(
            "differential test: needs Apache ZooKeeper (the zookeeper pass of scripts/test.sh); nothing compared"
        );
        return;
    }
    let apache = std::env::var("DISTLOCK_TEST_ZK").unwrap();
    let embedded = EmbeddedServer::start_with(Config {
        four_letter_words: distlock_server::FOUR_LETTER_WORDS.to_vec(),
        ..Default::default()
    })
    .await
    .unwrap();
    let theirs = script(&apache).await;
    let ours = script(&embedded.addr().to_string()).await;
    assert_eq!(theirs.len(), ours.len());
    let mut unexpected = Vec::new();
    for ((step, t), (_, o)) in theirs.iter().zip(&ours) {
        let known = KNOWN.iter().any(|(s, _)| s == step);
        if std::env::var_os("DISTLOCK_DIFF_ALL").is_some() {
            println!("{step}: {t} / {o}");
        }
        if t != o {
            println!(
                "{step}:\n  Apache ZooKeeper: {t}\n  distlock serve:   {o}{}",
                if known { "  (known)" } else { "" }
            );
            if !known {
                unexpected.push(step.clone());
            }
        }
    }
    let (theirs_mntr, ours_mntr) = MNTR_KEYS.with(|k| (k.borrow()[0].clone(), k.borrow()[1].clone()));
    let invented: Vec<&String> = ours_mntr.iter().filter(|k| !theirs_mntr.contains(k)).collect();
    if !invented.is_empty() {
        println!("mntr keys ZooKeeper does not have: {invented:?}");
        unexpected.push("mntr-keys".into());
    }
    let (theirs_conf, ours_conf) = CONF_KEYS.with(|k| (k.borrow()[0].clone(), k.borrow()[1].clone()));
    let invented: Vec<&String> = ours_conf.iter().filter(|k| !theirs_conf.contains(k)).collect();
    if !invented.is_empty() {
        println!("conf keys ZooKeeper does not have: {invented:?}");
        unexpected.push("conf-keys".into());
    }
    assert!(unexpected.is_empty(), "differences not listed in KNOWN: {unexpected:?}");
}
