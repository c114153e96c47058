#!/usr/bin/env bash
# Start or stop a PgBouncer in front of a PostgreSQL server, for distlock's tests.
#
#   scripts/pgbouncer.sh start DIR UPSTREAM MODE [POOL]   install Debian's pgbouncer if missing,
#                                 start one on a free 127.0.0.1 port pooling every database of
#                                 UPSTREAM (host:port; trust authentication, as scripts/postgres.sh
#                                 start sets up) in pool_mode MODE (session, transaction or
#                                 statement) with POOL server connections per database and user
#                                 (default 2), wait until it answers, and print its address.
#   scripts/pgbouncer.sh start-tls DIR UPSTREAM_DIR MODE [POOL]  the same, in front of a server
#                                 of `scripts/postgres.sh start-tls UPSTREAM_DIR`, set up as
#                                 production is: TLS only toward clients (the upstream's
#                                 certificate, which names 127.0.0.1 and localhost; client
#                                 certificates checked against the run's CA when sent), TLS
#                                 toward the server verified as libpq's verify-full, SCRAM for
#                                 user `distlock` (the upstream's password) on database `locks`.
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

# launch DATA PORT CHECK...: run pgbouncer on DATA/pgbouncer.ini and wait until CHECK (a psql
# command line) succeeds; print the address.
launch() {
    local data=$1 port=$2; shift 2
    if [[ $(id -u) == 0 ]]; then chown -R postgres:postgres "$data"; fi
    # setpriv execs pgbouncer itself, so the pid recorded is pgbouncer's.
    local as=(); if [[ $(id -u) == 0 ]]; then as=(setpriv --reuid=postgres --regid=postgres --clear-groups); fi
    nohup "${as[@]}" pgbouncer "$data/pgbouncer.ini" > "$dir/pgbouncer.out" 2>&1 < /dev/null &
    echo $! > "$dir/pgbouncer.pid"
    for _ in $(seq 1 100); do
        if "$@" > /dev/null 2>&1; then
            log "pgbouncer ($mode, pool $pool) pid $(cat "$dir/pgbouncer.pid") on 127.0.0.1:$port in front of $upstream"
            echo "127.0.0.1:$port"
            exit 0
        fi
        kill -0 "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || { cat "$dir/pgbouncer.out" "$data/pgbouncer.log" >&2; exit 1; }
        sleep 0.1
    done
    log "pgbouncer did not answer within 10 s"; cat "$data/pgbouncer.log" >&2; exit 1
}

# The settings both modes share (after [pgbouncer]).
common_settings() {
    cat <<INI
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_file = $data/userlist.txt
pool_mode = $mode
default_pool_size = $pool
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
logfile = $data/pgbouncer.log
INI
}

install() {
    command -v pgbouncer >/dev/null && return
    log "installing pgbouncer (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq pgbouncer >&2
}

case "$cmd" in
start)
    upstream=${3:?UPSTREAM host:port}; mode=${4:?MODE}; pool=${5:-2}
    install
    mkdir -p "$dir"
    data=$(mktemp -d /tmp/distlock-pgbouncer.XXXXXX)
    echo "$data" > "$dir/data.path"
    port=$(free_ports 1)
    {
        printf '[databases]\n* = host=%s port=%s\n[pgbouncer]\nauth_type = trust\n' "${upstream%:*}" "${upstream##*:}"
        common_settings
    } > "$data/pgbouncer.ini"
    printf '"postgres" ""\n' > "$data/userlist.txt"
    launch "$data" "$port" psql "host=127.0.0.1 port=$port user=postgres dbname=postgres" -Atqc 'select 1'
    ;;
start-tls)
    updir=${3:?UPSTREAM_DIR}; mode=${4:?MODE}; pool=${5:-2}
    install
    upstream=$(cat "$updir/postgres.port" 2>/dev/null) || { log "$updir has no server of postgres.sh start-tls"; exit 2; }
    upstream=127.0.0.1:$upstream
    [[ -f "$updir/tls.enabled" ]] || { log "$updir is not a server of postgres.sh start-tls"; exit 2; }
    mkdir -p "$dir"
    data=$(mktemp -d /tmp/distlock-pgbouncer.XXXXXX)
    echo "$data" > "$dir/data.path"
    port=$(free_ports 1)
    (umask 077; cp "$updir/certs/server.pem" "$updir/certs/server.key" "$updir/certs/ca.pem" "$data/")
    {
        printf '[databases]\nlocks = host=127.0.0.1 port=%s dbname=locks\n[pgbouncer]\n' "${upstream##*:}"
        printf 'auth_type = scram-sha-256\n'
        printf 'client_tls_sslmode = require\nclient_tls_cert_file = %s\nclient_tls_key_file = %s\nclient_tls_ca_file = %s\n' \
            "$data/server.pem" "$data/server.key" "$data/ca.pem"
        printf 'server_tls_sslmode = verify-full\nserver_tls_ca_file = %s\n' "$data/ca.pem"
        common_settings
    } > "$data/pgbouncer.ini"
    (umask 077; printf '"distlock" "%s"\n' "$(cat "$updir/password")" > "$data/userlist.txt")
    # The password reaches the readiness probe only (a passfile of mode 600), not pgbouncer's
    # environment or any command line.
    (umask 077; printf '127.0.0.1:%s:locks:distlock:%s\n' "$port" "$(cat "$updir/password")" > "$dir/probe.pgpass")
    launch "$data" "$port" env PGPASSFILE="$dir/probe.pgpass" \
        psql "host=127.0.0.1 port=$port user=distlock dbname=locks sslmode=require" -Atqc 'select 1'
    ;;
stop)
    stop_recorded "$dir/pgbouncer.pid" pgbouncer
    if [[ -f "$dir/data.path" ]] && [[ "$(cat "$dir/data.path")" == /tmp/distlock-pgbouncer.* ]]; then
        rm -rf "$(cat "$dir/data.path")" "$dir/data.path"
    fi
    ;;
*) echo "usage: $0 start DIR UPSTREAM MODE [POOL] | start-tls DIR UPSTREAM_DIR MODE [POOL] | stop DIR" >&2; exit 2 ;;
esac
