#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL cluster for distlock's tests and benchmarks.
#
#   scripts/postgres.sh start DIR     initdb a cluster (as the `postgres` user, which initdb
#                                     requires when we are root; in a directory of its own under
#                                     /tmp, recorded in DIR/data.path, since the postgres user may
#                                     not reach DIR's parents), start it on a free
#                                     127.0.0.1 port, wait until it accepts a query, and print
#                                     `postgres://postgres@127.0.0.1:PORT/postgres` on stdout.
#   scripts/postgres.sh stop DIR      stop the server recorded in DIR/postgres.pid (only that one).
#   scripts/postgres.sh kill DIR      SIGKILL its postmaster (a crash).
#   scripts/postgres.sh restart DIR   start it again on the same port (after kill or stop).
#
# Trust authentication on loopback only; fsync on (durability is part of what is tested).
# Needs Debian's PostgreSQL 15 server (`postgresql-15`), installed if missing.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop|kill|restart DIR" >&2
    exit 2
fi
log() { echo "postgres.sh: $*" >&2; }

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"

bin() {
    local b
    b=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [[ -n "$b" ]] && echo "$b"
}

install_postgres() {
    [[ -n "$(bin)" ]] && command -v psql >/dev/null && return
    log "installing postgresql (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
}

# Runs a command as the postgres user when we are root (initdb and postgres refuse root).
as_owner() {
    if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

launch() {
    local port pid b data
    b=$(bin)
    port=$(cat "$dir/postgres.port")
    data=$(cat "$dir/data.path")
    # The postmaster itself, in the background, so its pid is ours to record.
    as_owner nohup "$b/postgres" -D "$data/data" -c listen_addresses=127.0.0.1 -p "$port" -k "$data" \
        -c max_connections=300 -c shared_buffers=32MB > "$dir/postgres.log" 2>&1 < /dev/null &
    # runuser execs postgres in its place only after a fork: read the postmaster's pid file.
    for _ in $(seq 1 300); do
        if [[ -f "$data/data/postmaster.pid" ]] &&
            psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atqc 'select 1' > /dev/null 2>&1; then
            pid=$(head -n 1 "$data/data/postmaster.pid")
            echo "$pid" > "$dir/postgres.pid"
            log "postgres pid $pid serving on 127.0.0.1:$port"
            echo "postgres://postgres@127.0.0.1:$port/postgres"
            return
        fi
        sleep 0.1
    done
    log "postgres did not answer within 30 s; its log:"; cat "$dir/postgres.log" >&2 || true
    exit 1
}

start() {
    install_postgres
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f "$dir/postgres.pid" ]] && kill -0 "$(cat "$dir/postgres.pid")" 2>/dev/null; then
        log "already running (pid $(cat "$dir/postgres.pid"))"
        echo "postgres://postgres@127.0.0.1:$(cat "$dir/postgres.port")/postgres"
        return
    fi
    if [[ ! -f "$dir/data.path" ]]; then
        local data
        data=$(mktemp -d /tmp/distlock-postgres.XXXXXX)
        chmod 755 "$data"
        if [[ $(id -u) == 0 ]]; then chown postgres:postgres "$data"; fi
        echo "$data" > "$dir/data.path"
        as_owner "$(bin)/initdb" -D "$data/data" -U postgres -A trust -E UTF8 --no-sync > "$dir/initdb.log" 2>&1 ||
            { log "initdb failed:"; cat "$dir/initdb.log" >&2; exit 1; }
    fi
    free_ports 1 > "$dir/postgres.port"
    launch
}

case "$cmd" in
    start) start ;;
    stop)
        # SIGINT is PostgreSQL's fast shutdown (SIGTERM would wait for every client to leave).
        if [[ -f "$dir/postgres.pid" ]] && kill -0 "$(cat "$dir/postgres.pid")" 2>/dev/null; then
            pid=$(cat "$dir/postgres.pid")
            kill -CONT "$pid" 2>/dev/null || true
            kill -INT "$pid"
            for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        fi
        stop_recorded "$dir/postgres.pid" postgres
        # The cluster was throwaway: remove it (only the directory this script made).
        if [[ -f "$dir/data.path" ]] && [[ "$(cat "$dir/data.path")" == /tmp/distlock-postgres.* ]]; then
            rm -rf "$(cat "$dir/data.path")" "$dir/data.path"
        fi ;;
    kill) crash_recorded "$dir/postgres.pid" postgres ;;
    restart)
        dir=$(cd "$dir" && pwd)
        # A killed postmaster leaves its pid file; postgres removes a stale one itself.
        launch ;;
    *) echo "usage: $0 start|stop|kill|restart DIR" >&2; exit 2 ;;
esac
