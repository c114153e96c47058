#!/usr/bin/env bash
# The main job: the seeds' demos, with nothing to install. With no backend given, the demos start
# distlock's embedded ZooKeeper-protocol server in-process; the `distlock exec`/`inspect` part
# runs against `distlock serve`. Set DISTLOCK_BACKEND=zk://host:port to use a real ZooKeeper.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --workspace --bins --examples
bin=target/debug/distlock

echo "== 1. Ten workers issue order numbers, without and with the lock"
target/debug/examples/order_numbers
echo
echo "== 2. Three processes take turns; one is killed while it holds the lock"
target/debug/examples/takeover
echo
echo "== 3. distlock exec and inspect"
if [[ -z "${DISTLOCK_BACKEND:-}" ]]; then
    dir=.tmp/demo-server
    trap 'scripts/embedded.sh stop "$dir"' EXIT
    addr=$(scripts/embedded.sh start "$dir")
    export DISTLOCK_BACKEND="zk://$addr"
fi
$bin exec demo -- sh -c 'echo "   running under $DISTLOCK_KEY with fencing token $DISTLOCK_TOKEN"; sleep 1' &
holder=$!
$bin exec -w 5s demo -- true & waiter=$!   # queues behind the holder
for _ in $(seq 1 50); do   # wait (bounded) until both are queued
    [[ $($bin inspect --json demo | grep -o '"holds"' | wc -l) -ge 2 ]] && break
    sleep 0.1
done
$bin inspect demo
if $bin exec -n demo -- true; then echo "   unexpected: -n acquired a held lock"; exit 1; else echo "   exec -n while held: exit $? (not acquired)"; fi
wait $holder $waiter
$bin inspect demo
