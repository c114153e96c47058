#!/usr/bin/env bash
# Runs distlock's whole test suite against real servers that this script starts on free loopback
# ports (and stops again, whatever happens).
#
#   scripts/test.sh                       both servers: Apache ZooKeeper, then distlock's own
#   DISTLOCK_TEST_SERVER=zookeeper scripts/test.sh   only Apache ZooKeeper (Debian package)
#   DISTLOCK_TEST_SERVER=embedded scripts/test.sh    only the embedded server (`distlock serve`)
#   scripts/test.sh -- ARGS               extra arguments for `cargo test` (e.g. a name filter)
#
# Each pass runs every Rust test (unit, integration, CLI, Curator interop, doc tests), the seed
# demos, and the compatibility checks of Apache ZooKeeper's zkCli.sh and Python's kazoo.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

servers=${DISTLOCK_TEST_SERVER:-both}
[[ "$servers" == both ]] && servers="zookeeper embedded"
extra=()
if [[ "${1:-}" == "--" ]]; then shift; extra=("$@"); fi

cargo build --workspace --all-targets --examples

started=()
cleanup() {
    for s in "${started[@]}"; do
        if [[ "$s" == zookeeper ]]; then scripts/zk.sh stop .tmp/test-zookeeper; else scripts/embedded.sh stop .tmp/test-embedded; fi
    done
}
trap cleanup EXIT

for server in $servers; do
    dir=.tmp/test-$server
    rm -rf "$dir"; mkdir -p "$dir"
    case "$server" in
        zookeeper) addr=$(scripts/zk.sh start "$dir") ;;
        embedded) addr=$(scripts/embedded.sh start "$dir") ;;
        *) echo "test.sh: unknown server $server (zookeeper, embedded, both)" >&2; exit 2 ;;
    esac
    started+=("$server")
    export DISTLOCK_TEST_ZK="$addr"
    echo "test.sh: === $server at $addr ==="
    cargo test --workspace "${extra[@]}"
    if [[ ${#extra[@]} -eq 0 ]]; then
        target/debug/examples/order_numbers "zk://$addr"
        target/debug/examples/takeover "zk://$addr"
        tests/compat/zkcli.sh "$addr"
        python3 tests/compat/kazoo_locks.py "$addr"
    fi
done
echo "test.sh: all passed ($servers)"
