#!/usr/bin/env bash
# Start or stop distlock's embedded ZooKeeper-protocol server (`distlock serve`) for tests.
#
#   scripts/embedded.sh start DIR   start on a free 127.0.0.1 port (tickTime 500 ms, in memory),
#                                   wait until it answers `ruok`, print host:port on stdout
#   scripts/embedded.sh start-tls DIR  the same, set up as production is: TLS only (client
#                                   certificates required), and every session must log in by
#                                   digest as `distlock`, whose password is in DIR/password
#                                   (DIR/users holds its digest; both mode 600). The run's own CA,
#                                   server and client certificates are in DIR/certs.
#   scripts/embedded.sh stop DIR    stop the server recorded in DIR/server.pid (only that one)
#
# Arguments after DIR go to `distlock serve` (limits, --four-letter-words ...).
#
# Needs target/debug/distlock (scripts/test.sh builds it first; $CARGO_TARGET_DIR if set).
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}; dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 start|start-tls|stop DIR [SERVE ARGS...]" >&2; exit 2; }
extra=("${@:3}")
bin=${DISTLOCK_BIN:-${CARGO_TARGET_DIR:-target}/debug/distlock}

log() { echo "embedded.sh: $*" >&2; }
# shellcheck source=lib/zookeeper.sh
source scripts/lib/zookeeper.sh
# shellcheck source=lib/certs.sh
source scripts/lib/certs.sh

case "$cmd" in
start|start-tls)
    mkdir -p "$dir"
    rm -f "$dir/addr"
    secure=()
    if [[ "$cmd" == start-tls ]]; then
        make_certs "$dir/certs"
        (umask 077; openssl rand -hex 16 > "$dir/password")
        # The users file holds ZooKeeper's digest of user:password, never the password.
        (umask 077; printf 'distlock:%s\n' "$(printf 'distlock:%s' "$(cat "$dir/password")" | openssl sha1 -binary | base64)" > "$dir/users")
        secure=(--tls-cert "$dir/certs/server.pem" --tls-key "$dir/certs/server.key"
            --tls-client-ca "$dir/certs/ca.pem" --users "$dir/users" --auth-required)
    fi
    nohup "$bin" serve --listen 127.0.0.1:0 --tick 500ms --addr-file "$dir/addr" "${secure[@]}" "${extra[@]}" \
        > "$dir/server.log" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$dir/server.pid"
    for _ in $(seq 1 100); do
        if [[ -s "$dir/addr" ]]; then
            addr=$(cat "$dir/addr")
            if [[ ${#secure[@]} -gt 0 ]]; then answer=$(four "${addr#*:}" ruok "$dir/certs"); else answer=$(four "${addr#*:}" ruok); fi
            if [[ "$answer" == imok ]]; then
                echo "embedded.sh: distlock serve pid $pid on $addr" >&2
                echo "$addr"
                exit 0
            fi
        fi
        kill -0 "$pid" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
        sleep 0.1
    done
    echo "embedded.sh: server did not answer within 10 s" >&2; kill "$pid"; exit 1
    ;;
stop)
    [[ -f "$dir/server.pid" ]] || exit 0
    pid=$(cat "$dir/server.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/server.pid"
    echo "embedded.sh: stopped pid $pid" >&2
    ;;
*) echo "usage: $0 start|start-tls|stop DIR" >&2; exit 2 ;;
esac
