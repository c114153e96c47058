#!/usr/bin/env bash
# Apache ZooKeeper's own command-line client (Debian's zookeeper package) creates, lists, reads,
# writes and deletes nodes on a ZooKeeper-protocol server.
#
#   tests/compat/zkcli.sh HOST:PORT
set -euo pipefail
addr=$1
cli=/usr/share/zookeeper/bin/zkCli.sh
node=/zkcli-compat-$$
run() { timeout 60 "$cli" -server "$addr" "$@" 2>&1 | grep -v -E '^(log4j|SLF4J|WATCHER|WatchedEvent|Connecting|$)' || true; }
expect() { # expect "what" "needle" output
    if ! grep -qF -- "$2" <<<"$3"; then echo "zkcli.sh: $1: expected '$2' in:"; echo "$3"; exit 1; fi
}
expect create "Created $node" "$(run create "$node" hello)"
expect ls "${node#/}" "$(run ls /)"
expect get hello "$(run get "$node")"
run set "$node" world >/dev/null
out=$(run get -s "$node")
expect set world "$out"
expect stat "dataVersion = 1" "$out"
expect child "Created $node/c-0000000000" "$(run create -s "$node/c-" x)"
expect ls-child "[c-0000000000]" "$(run ls "$node")"
run delete "$node/c-0000000000" >/dev/null
run delete "$node" >/dev/null
expect deleted "Node does not exist" "$(run get "$node")"
echo "zkcli.sh: create, ls, get, set, stat, sequential create and delete OK on $addr"
