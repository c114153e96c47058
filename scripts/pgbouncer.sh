#!/usr/bin/env bash
# Start or stop a PgBouncer in front of a PostgreSQL server, for distlock's tests.
#
#   scripts/pgbouncer.sh start DIR UPSTREAM MODE [POOL]   install Debian's pgbouncer if missing,
#                                 start one on a free 127.0.0.1 port pooling every database of
#                                 UPSTREAM (host:port; trust authentication, as scripts/postgres.sh
#                                 start sets up) in pool_mode MODE (session, transaction or
#                                 statement) with POOL server connections per database and user
#                                 (default 2), wait until it answers, and print its address.
#   scripts/pgbouncer.sh stop DIR stop the PgBouncer recorded in DIR (and only that one).
#
# PgBouncer refuses to run as root: when we are root it runs as the postgres user, with its
# files in a directory of its own under /tmp (recorded in DIR/data.path).
set -euo pipefail
cmd=${1:-}; dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || { echo "usage: $0 start DIR UPSTREAM MODE [POOL] | stop DIR" >&2; exit 2; }
log() { echo "pgbouncer.sh: $*" >&2; }
# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"

case "$cmd" in
start)
    upstream=${3:?UPSTREAM host:port}; mode=${4:?MODE}; pool=${5:-2}
    command -v pgbouncer >/dev/null || {
        log "installing pgbouncer (Debian)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq pgbouncer >&2
    }
    mkdir -p "$dir"
    data=$(mktemp -d /tmp/distlock-pgbouncer.XXXXXX)
    echo "$data" > "$dir/data.path"
    port=$(free_ports 1)
    cat > "$data/pgbouncer.ini" <<INI
[databases]
* = host=${upstream%:*} port=${upstream##*:}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $data/userlist.txt
pool_mode = $mode
default_pool_size = $pool
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
logfile = $data/pgbouncer.log
INI
    printf '"postgres" ""\n' > "$data/userlist.txt"
    if [[ $(id -u) == 0 ]]; then chown -R postgres:postgres "$data"; fi
    # setpriv execs pgbouncer itself, so the pid recorded is pgbouncer's.
    as=(); if [[ $(id -u) == 0 ]]; then as=(setpriv --reuid=postgres --regid=postgres --clear-groups); fi
    nohup "${as[@]}" pgbouncer "$data/pgbouncer.ini" > "$dir/pgbouncer.out" 2>&1 < /dev/null &
    echo $! > "$dir/pgbouncer.pid"
    for _ in $(seq 1 100); do
        if psql "host=127.0.0.1 port=$port user=postgres dbname=postgres" -Atqc 'select 1' > /dev/null 2>&1; then
            log "pgbouncer ($mode, pool $pool) pid $(cat "$dir/pgbouncer.pid") on 127.0.0.1:$port in front of $upstream"
            echo "127.0.0.1:$port"
            exit 0
        fi
        kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || { cat "$dir/pgbouncer.out" "$data/pgbouncer.log" >&2; exit 1; }
        sleep 0.1
    done
    log "pgbouncer did not answer within 10 s"; cat "$data/pgbouncer.log" >&2; exit 1
    ;;
stop)
    stop_recorded "$dir/pgbouncer.pid" pgbouncer
    if [[ -f "$dir/data.path" ]] && [[ "$(cat "$dir/data.path")" == /tmp/distlock-pgbouncer.* ]]; then
        rm -rf "$(cat "$dir/data.path")" "$dir/data.path"
    fi
    ;;
*) echo "usage: $0 start DIR UPSTREAM MODE [POOL] | stop DIR" >&2; exit 2 ;;
esac
