#!/usr/bin/env bash
# The main job: the demos (order numbers, a killed holder passing the lock on, exec and inspect, optimistic locking), with nothing to install but the protobuf compiler the build
# needs (scripts/lib/protoc.sh, only if missing). With no backend given, the demos start
# distlock's embedded ZooKeeper-protocol server in-process; the `distlock exec`/`inspect` part
# runs against `distlock serve`. Set DISTLOCK_BACKEND=zk://host:port to use a real ZooKeeper.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib/protoc.sh
source scripts/lib/protoc.sh
cargo build --quiet --workspace --bins --examples
# Cargo's output directory ($CARGO_TARGET_DIR when set).
target=${CARGO_TARGET_DIR:-target}
bin=$target/debug/distlock

echo "== 1. Ten workers issue order numbers, without and with the lock"
"$target/debug/examples/order_numbers"
echo
echo "== 2. Three processes take turns; one is killed while it holds the lock"
"$target/debug/examples/takeover"
echo
echo "== 3. distlock exec and inspect"
flags=$(mktemp -d)
dir=
trap 'rm -rf "$flags"; if [[ -n "$dir" ]]; then scripts/embedded.sh stop "$dir"; fi' EXIT
if [[ -z "${DISTLOCK_BACKEND:-}" ]]; then
    dir=.tmp/demo-server
    addr=$(scripts/embedded.sh start "$dir")
    export DISTLOCK_BACKEND="zk://$addr"
fi
# The holder says when it holds (a file) and holds until told to let go (another file), so every
# step below happens in a known order.
$bin exec demo -- sh -c 'echo "   running under $DISTLOCK_KEY with fencing token $DISTLOCK_TOKEN"; touch "$0/held"
    for _ in $(seq 1 300); do [ -e "$0/release" ] && exit 0; sleep 0.1; done; exit 1' "$flags" &
holder=$!
for _ in $(seq 1 300); do [[ -e "$flags/held" ]] && break; sleep 0.1; done   # bounded: 30 s
[[ -e "$flags/held" ]] || { echo "   the holder did not get the lock"; exit 1; }
$bin exec -w 30s demo -- true & waiter=$!   # queues behind the holder
for _ in $(seq 1 300); do   # wait (bounded) until it is queued
    [[ $($bin inspect --json demo | grep -o '"holds"' | wc -l) -ge 2 ]] && break
    sleep 0.1
done
$bin inspect demo
if $bin exec -n demo -- true; then echo "   unexpected: -n acquired a held lock"; exit 1; else echo "   exec -n while held: exit $? (not acquired)"; fi
touch "$flags/release"
wait $holder $waiter
$bin inspect demo
echo
echo "== 4. Optimistic locking: an account row with a version column (SQLite, no server)"
# Its own SQLite file, whatever DISTLOCK_BACKEND says (a postgres:// URL as argument uses PostgreSQL).
DISTLOCK_BACKEND= "$target/debug/examples/optimistic_account"
