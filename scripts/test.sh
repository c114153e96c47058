#!/usr/bin/env bash
# Runs distlock's whole test suite against a real ZooKeeper that this script starts (on a free
# loopback port, data under .tmp/) and stops again, whatever happens.
#
#   scripts/test.sh            build once, then unit, integration, CLI and doc tests, and the demos
#   scripts/test.sh -- ARGS    extra arguments for `cargo test` (e.g. a test name filter)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh

dir=.tmp/test-zk
rm -rf "$dir"
mkdir -p "$dir"
trap 'scripts/zk.sh stop "$dir"' EXIT
addr=$(scripts/zk.sh start "$dir")
export DISTLOCK_TEST_ZK="$addr"
echo "test.sh: ZooKeeper at $addr"

extra=()
if [[ "${1:-}" == "--" ]]; then shift; extra=("$@"); fi

cargo build --workspace --all-targets --examples
cargo test --workspace "${extra[@]}"

if [[ ${#extra[@]} -eq 0 ]]; then
    echo "test.sh: running the seed demos"
    target/debug/examples/order_numbers "zk://$addr"
    target/debug/examples/takeover "zk://$addr"
fi
echo "test.sh: all passed"
