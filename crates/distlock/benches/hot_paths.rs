//! Hot paths of `distlock bench`, runnable with plain `cargo bench` (an embedded server is
//! started in-process, so nothing needs to be installed).

use criterion::{criterion_group, criterion_main, Criterion};
use distlock::zookeeper::{Client, ZkUrl};
use std::time::Duration;

fn locks(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let cfg = distlock_server::Config { fsync: distlock_server::Fsync::Never, ..Default::default() };
    let server = rt.block_on(distlock_server::EmbeddedServer::start_with(cfg)).unwrap();
    let client = rt.block_on(Client::connect(&server.url())).unwrap();
    let lock = client.mutex("/bench/hot").unwrap();
    rt.block_on(async { lock.lock().await.unwrap().release().await.unwrap() });
    let zk = client.zookeeper().clone();
    rt.block_on(async {
        zk.mkdir(
            "/bench/raw",
            &zookeeper_client::CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap()
    });

    let mut g = c.benchmark_group("embedded server, one session");
    g.measurement_time(Duration::from_secs(5));
    g.bench_function("raw create+delete (the limit)", |b| {
        let eph = zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
        b.to_async(&rt).iter(|| async {
            zk.create("/bench/raw/n", b"", &eph).await.unwrap();
            zk.delete("/bench/raw/n", None).await.unwrap();
        })
    });
    g.bench_function("mutex lock + release", |b| {
        b.to_async(&rt).iter(|| async { lock.lock().await.unwrap().release().await.unwrap() })
    });
    g.bench_function("mutex lock + drop", |b| b.to_async(&rt).iter(|| async { drop(lock.lock().await.unwrap()) }));
    let holder = rt.block_on(lock.lock()).unwrap();
    g.bench_function("try_lock while held (busy)", |b| {
        b.to_async(&rt).iter(|| async { assert!(lock.try_lock().await.unwrap().is_none()) })
    });
    drop(holder);
    g.finish();
}

fn parsing(c: &mut Criterion) {
    c.bench_function("parse zk:// URL", |b| {
        b.iter(|| ZkUrl::parse("zk://10.0.0.1:2181,10.0.0.2:2181/apps?session_timeout=4s").unwrap())
    });
    let owner = distlock::Owner::current().encode();
    c.bench_function("parse owner record", |b| b.iter(|| distlock::Owner::parse(&owner).unwrap()));
    let frame: Vec<u8> = {
        let mut f = vec![0, 0, 0, 1, 0, 0, 0, 4];
        f.extend_from_slice(&12i32.to_be_bytes());
        f.extend_from_slice(b"/locks/order");
        f.push(1);
        f
    };
    c.bench_function("server: session + decode + getData", |b| b.iter(|| distlock_server::decode_for_fuzzing(&frame)));
}

criterion_group!(benches, locks, parsing);
criterion_main!(benches);
