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
#   scripts/postgres.sh start-tls DIR the same, set up as production is: ssl = on and only
#                                     `hostssl` lines in pg_hba.conf: user `distlock` with a
#                                     SCRAM password (in DIR/password, mode 600; database
#                                     `locks`) and user `certuser` by client certificate (database
#                                     `locks_cert`); the run's CA and client certificate (CN
#                                     certuser) in DIR/certs. Role `team_a` (password in
#                                     DIR/team-a.password) has no grants: a test gives it the
#                                     least a lock user needs (docs/security.md). Prints
#                                     `postgres://distlock@127.0.0.1:PORT/locks`.
#   scripts/postgres.sh use-cert DIR NAME  (start-tls) present certs/NAME.pem from now on
#                                     (misnamed, expired or server, of lib/certs.sh): reloaded,
#                                     and waited for until the port presents it.
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
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"

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

# ready PORT DATA: the server answers a query (with TLS only, over its Unix socket, as its
# loopback port takes no query without TLS and a password; and the port accepts connections).
ready() {
    if [[ -f "$dir/tls.enabled" ]]; then
        psql -h "$2" -p "$1" -U postgres -d postgres -Atqc 'select 1' > /dev/null 2>&1 &&
            "$(bin)/pg_isready" -q -h 127.0.0.1 -p "$1"
    else
        psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atqc 'select 1' > /dev/null 2>&1
    fi
}

# The TLS set-up of a new cluster (see start-tls above).
setup_tls() {
    local data=$1 port=$2 pw
    make_certs "$dir/certs" certuser
    mkdir -p "$data/certs"
    cp "$dir/certs/server.pem" "$dir/certs/server.key" "$dir/certs/ca.pem" "$data/certs/"
    if [[ $(id -u) == 0 ]]; then chown -R postgres:postgres "$data/certs"; fi
    chmod 600 "$data/certs/server.key"
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/password")
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/team-a.password")
    cat >> "$data/data/postgresql.conf" <<CONF
ssl = on
ssl_cert_file = '$data/certs/server.pem'
ssl_key_file = '$data/certs/server.key'
ssl_ca_file = '$data/certs/ca.pem'
password_encryption = 'scram-sha-256'
CONF
    # Only TLS on the network: a SCRAM password user and a certificate user. The local socket
    # (the script's own checks and set-up) trusts the postgres user alone.
    cat > "$data/data/pg_hba.conf" <<HBA
local all postgres trust
hostssl all distlock 127.0.0.1/32 scram-sha-256
hostssl all certuser 127.0.0.1/32 cert
hostssl all team_a 127.0.0.1/32 scram-sha-256
HBA
    pw=$(cat "$dir/password")
    touch "$dir/tls.enabled"
    launch > /dev/null
    psql -h "$data" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -q > /dev/null <<SQL
CREATE ROLE distlock LOGIN PASSWORD '$pw';
CREATE ROLE certuser LOGIN;
CREATE ROLE team_a LOGIN PASSWORD '$(cat "$dir/team-a.password")';
CREATE DATABASE locks OWNER distlock;
CREATE DATABASE locks_cert OWNER certuser;
SQL
}

launch() {
    local port pid b data
    b=$(bin)
    port=$(cat "$dir/postgres.port")
    data=$(cat "$dir/data.path")
    # The postmaster itself, in the background, so its pid is ours to record. An external
    # command, not a function: a function run in the background is a copy of this shell that
    # would live as long as the server, holding this script's output open.
    local run_as=()
    if [[ $(id -u) == 0 ]]; then run_as=(runuser -u postgres --); fi
    nohup "${run_as[@]}" "$b/postgres" -D "$data/data" -c listen_addresses=127.0.0.1 -p "$port" -k "$data" \
        -c max_connections=300 -c shared_buffers=32MB > "$dir/postgres.log" 2>&1 < /dev/null &
    # runuser execs postgres in its place only after a fork: read the postmaster's pid file.
    for _ in $(seq 1 300); do
        if [[ -f "$data/data/postmaster.pid" ]] && ready "$port" "$data"; then
            pid=$(head -n 1 "$data/data/postmaster.pid")
            echo "$pid" > "$dir/postgres.pid"
            log "postgres pid $pid serving on 127.0.0.1:$port"
            if [[ -f "$dir/tls.enabled" ]]; then
                echo "postgres://distlock@127.0.0.1:$port/locks"
            else
                echo "postgres://postgres@127.0.0.1:$port/postgres"
            fi
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
    if [[ -n "${tls:-}" ]]; then
        # Started once to be set up, and running from then on.
        setup_tls "$(cat "$dir/data.path")" "$(cat "$dir/postgres.port")"
        echo "postgres://distlock@127.0.0.1:$(cat "$dir/postgres.port")/locks"
        return
    fi
    launch
}

case "$cmd" in
    start) start ;;
    start-tls) tls=1 start ;;
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
    use-cert)
        name=${3:?usage: $0 use-cert DIR NAME}
        dir=$(cd "$dir" && pwd)
        data=$(cat "$dir/data.path")
        port=$(cat "$dir/postgres.port")
        # Written into the served files: their owner and mode (600 for the key) stay.
        cat "$dir/certs/$name.pem" > "$data/certs/server.pem"
        cat "$dir/certs/$name.key" > "$data/certs/server.key"
        psql -h "$data" -p "$port" -U postgres -d postgres -Atqc 'select pg_reload_conf()' > /dev/null
        # The reload is asynchronous: wait until the port presents the new certificate.
        want=$(openssl x509 -in "$dir/certs/$name.pem" -noout -fingerprint)
        for _ in $(seq 1 100); do
            got=$(openssl s_client -starttls postgres -connect "127.0.0.1:$port" < /dev/null 2>/dev/null |
                openssl x509 -noout -fingerprint 2>/dev/null || true)
            [[ "$got" == "$want" ]] && exit 0
            sleep 0.1
        done
        log "127.0.0.1:$port still presents another certificate 10 s after the reload"
        exit 1 ;;
    kill) crash_recorded "$dir/postgres.pid" postgres ;;
    restart)
        dir=$(cd "$dir" && pwd)
        # A killed postmaster leaves its pid file; postgres removes a stale one itself.
        launch ;;
    *) echo "usage: $0 start|start-tls|stop|kill|restart DIR | use-cert DIR NAME" >&2; exit 2 ;;
esac
