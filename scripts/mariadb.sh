#!/usr/bin/env bash
# Start or stop a throwaway MariaDB server for distlock's tests and benchmarks.
#
#   scripts/mariadb.sh start DIR     create a data directory (under /tmp, recorded in
#                                    DIR/data.path), start mariadbd on a free 127.0.0.1 port,
#                                    wait until it accepts a query, create user `distlock`
#                                    (no password, all privileges) and database `distlock`, and
#                                    print `mysql://distlock@127.0.0.1:PORT/distlock` on stdout.
#   scripts/mariadb.sh stop DIR      stop the server recorded in DIR/mariadb.pid (only that one)
#                                    and remove its data directory.
#   scripts/mariadb.sh kill DIR      SIGKILL it (a crash).
#   scripts/mariadb.sh restart DIR   start it again on the same port and data (after kill or stop).
#   scripts/mariadb.sh start-tls DIR the same, set up as production is: require_secure_transport
#                                    = ON (TLS only), user `distlock` with a password (in
#                                    DIR/password, mode 600) and user `x509user` by client
#                                    certificate (REQUIRE X509); the run's CA and client
#                                    certificate in DIR/certs. User `team_a` (password in
#                                    DIR/team-a.password) has no grants: a test gives it the least
#                                    a lock user needs (docs/security.md).
#   scripts/mariadb.sh use-cert DIR NAME  (start-tls) present certs/NAME.pem from now on (misnamed,
#                                    expired or server, of lib/certs.sh), reloaded by FLUSH SSL.
#   scripts/mariadb.sh start-galera DIR  the same as start, as a one-node Galera cluster
#                                    (wsrep_on = ON; Debian's galera-4, installed if missing).
#
# Needs Debian's `mariadb-server` (10.11), installed if missing.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop|kill|restart DIR" >&2
    exit 2
fi
log() { echo "mariadb.sh: $*" >&2; }

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"

install_mariadb() {
    command -v mariadbd >/dev/null || [[ -x /usr/sbin/mariadbd ]] && return
    log "installing mariadb-server (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq mariadb-server >&2
}

install_galera() {
    [[ -f /usr/lib/galera/libgalera_smm.so ]] && return
    log "installing galera-4 (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq galera-4 >&2
}

mariadbd_bin() { command -v mariadbd || echo /usr/sbin/mariadbd; }

# serve_cert NAME: the certificate and key the server presents become certs/NAME.{pem,key}.
serve_cert() {
    cp "$dir/certs/$1.pem" "$dir/certs/serving.pem"
    (umask 077; cp "$dir/certs/$1.key" "$dir/certs/serving.key")
}

launch() {
    local port data pid tls=() users
    port=$(cat "$dir/mariadb.port")
    data=$(cat "$dir/data.path")
    users="CREATE USER IF NOT EXISTS distlock@'%'; GRANT ALL ON *.* TO distlock@'%'"
    if [[ -f "$dir/tls.enabled" ]]; then
        # The served pair is a copy, which use-cert replaces.
        [[ -f "$dir/certs/serving.pem" ]] || serve_cert server
        tls=(--ssl-cert="$dir/certs/serving.pem" --ssl-key="$dir/certs/serving.key" --ssl-ca="$dir/certs/ca.pem"
            --require-secure-transport=ON)
        users="CREATE USER IF NOT EXISTS distlock@'%' IDENTIFIED BY '$(cat "$dir/password")' REQUIRE SSL;
            GRANT ALL ON *.* TO distlock@'%'; CREATE USER IF NOT EXISTS x509user@'%' REQUIRE X509;
            GRANT ALL ON *.* TO x509user@'%';
            CREATE USER IF NOT EXISTS team_a@'%' IDENTIFIED BY '$(cat "$dir/team-a.password")' REQUIRE SSL"
    fi
    if [[ -f "$dir/galera.enabled" ]]; then
        # A one-node Galera cluster (it bootstraps itself): enough for a client to see wsrep_on.
        tls+=(--wsrep-on=ON --wsrep-provider=/usr/lib/galera/libgalera_smm.so --wsrep-cluster-address=gcomm://
            --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:$(cat "$dir/galera.port")"
            --binlog-format=ROW --innodb-autoinc-lock-mode=2 --wsrep-node-address=127.0.0.1)
    fi
    mkdir -p "$data/tmp"
    nohup "$(mariadbd_bin)" --no-defaults --user="$(id -un)" --datadir="$data/data" --socket="$data/sock" "${tls[@]}" \
        --tmpdir="$data/tmp" --pid-file="$data/mariadb.pid" --port="$port" --bind-address=127.0.0.1 --skip-name-resolve \
        --log-error="$dir/mariadb.log" --innodb-buffer-pool-size=32M --max-connections=300 \
        > "$dir/mariadb.out" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$dir/mariadb.pid"
    for _ in $(seq 1 300); do
        if mariadb --no-defaults -S "$data/sock" -u root -e 'select 1' > /dev/null 2>&1; then
            # On stdin, not argv: the passwords in it stay out of `ps`.
            printf '%s;\n' "$users; CREATE DATABASE IF NOT EXISTS distlock" | mariadb --no-defaults -S "$data/sock" -u root
            log "mariadbd pid $pid serving on 127.0.0.1:$port"
            echo "mysql://distlock@127.0.0.1:$port/distlock"
            return
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    log "mariadbd did not answer within 30 s; its log:"; cat "$dir/mariadb.log" "$dir/mariadb.out" >&2 || true
    exit 1
}

start() {
    install_mariadb
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f "$dir/mariadb.pid" ]] && kill -0 "$(cat "$dir/mariadb.pid")" 2>/dev/null; then
        log "already running (pid $(cat "$dir/mariadb.pid"))"
        echo "mysql://distlock@127.0.0.1:$(cat "$dir/mariadb.port")/distlock"
        return
    fi
    if [[ ! -f "$dir/data.path" ]]; then
        local data
        data=$(mktemp -d /tmp/distlock-mariadb.XXXXXX)
        echo "$data" > "$dir/data.path"
        # Each server its own tmpdir: a mariadbd starting deletes every `#sql*` file in its
        # tmpdir, which in a shared one (the run's $TMPDIR) were another server's bootstrap
        # tables (a parallel test's install failed so: "Error on delete of '…/#sql-temptable…'").
        mkdir -p "$data/tmp"
        TMPDIR="$data/tmp" mariadb-install-db --no-defaults --user="$(id -un)" --datadir="$data/data" --auth-root-authentication-method=socket \
            --skip-test-db > "$dir/install.log" 2>&1 || { log "mariadb-install-db failed:"; cat "$dir/install.log" >&2; exit 1; }
    fi
    free_ports 1 > "$dir/mariadb.port"
    launch
}

case "$cmd" in
    start) start ;;
    start-galera)
        install_galera
        mkdir -p "$dir"
        free_ports 1 > "$dir/galera.port"
        touch "$dir/galera.enabled"
        start ;;
    start-tls)
        mkdir -p "$dir"
        make_certs "$dir/certs" x509user
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/password")
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/team-a.password")
        touch "$dir/tls.enabled"
        start ;;
    stop)
        stop_recorded "$dir/mariadb.pid" mariadb
        if [[ -f "$dir/data.path" ]] && [[ "$(cat "$dir/data.path")" == /tmp/distlock-mariadb.* ]]; then
            rm -rf "$(cat "$dir/data.path")" "$dir/data.path"
        fi ;;
    use-cert)
        name=${3:?usage: $0 use-cert DIR NAME}
        dir=$(cd "$dir" && pwd)
        serve_cert "$name"
        mariadb --no-defaults -S "$(cat "$dir/data.path")/sock" -u root -e 'FLUSH SSL' ;;
    kill) crash_recorded "$dir/mariadb.pid" mariadb ;;
    restart)
        dir=$(cd "$dir" && pwd)
        launch ;;
    *) echo "usage: $0 start|start-tls|start-galera|stop|kill|restart DIR | use-cert DIR NAME" >&2; exit 2 ;;
esac
