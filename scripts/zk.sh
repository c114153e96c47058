#!/usr/bin/env bash
# Start or stop a standalone ZooKeeper for distlock's tests and demos.
#
#   scripts/zk.sh start DIR   install ZooKeeper (Debian package) if missing, start a server on a
#                             free 127.0.0.1 port with its data under DIR, wait until it answers
#                             `ruok`, and print its address (host:port) on stdout.
#   scripts/zk.sh stop DIR    stop the server recorded in DIR/zk.pid (and only that one).
#   scripts/zk.sh kill DIR    SIGKILL that server (a crash; its data stays in DIR).
#   scripts/zk.sh restart DIR start it again on the same port with the same data (after a kill
#                             or stop), and wait until it answers `ruok`.
#   scripts/zk.sh start-tls DIR  the same as start, set up as production is: only a secure
#                             client port (Netty, TLS, client certificates required), and every
#                             session must log in by SASL DIGEST-MD5 before anything else (a
#                             digest `addauth` is no login: any user:password is accepted). One
#                             SASL user, `distlock`, whose password is in DIR/password (and in
#                             DIR/jaas.conf; both mode 600). The run's own CA, server and client
#                             certificates are in DIR/certs (scripts/lib/certs.sh).
#
# Settings chosen for tests: tickTime 500 ms (so sessions may be as short as 1 s), the admin
# HTTP server off (it would take port 8080), every four-letter word allowed, containers checked
# every second so emptied lock directories are reaped quickly.
#
# ZK_FORCE_SYNC=no (environment, at start) turns off the fsync of the transaction log
# (ZooKeeper's forceSync), for benchmarks of the server with and without it; default yes.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop DIR" >&2
    exit 2
fi

log() { echo "zk.sh: $*" >&2; }

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"
ruok() {
    if [[ -f "$dir/tls.enabled" ]]; then four "$1" ruok "$dir/certs"; else four "$1" ruok; fi
}

start() {
    install_zookeeper
    mkdir -p "$dir/data"
    dir=$(cd "$dir" && pwd)
    if [[ -f "$dir/zk.pid" ]] && kill -0 "$(cat "$dir/zk.pid")" 2>/dev/null; then
        log "already running (pid $(cat "$dir/zk.pid"))"
        cat "$dir/zk.addr"
        return
    fi
    local port port_key=clientPort
    port=$(free_ports 1)
    # With TLS, the one port is the secure one: no plaintext port.
    [[ -f "$dir/tls.enabled" ]] && port_key=secureClientPort
    cat > "$dir/zoo.cfg" <<CFG
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$dir/data
${port_key}=$port
${port_key}Address=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
forceSync=${ZK_FORCE_SYNC:-yes}
CFG
    write_log4j "$dir/log4j.properties"
    echo "127.0.0.1:$port" > "$dir/zk.addr"
    launch
}

start_tls() {
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    make_certs "$dir/certs"
    # The server's PEM key store holds its key and certificate in one file.
    (umask 077; cat "$dir/certs/server.key" "$dir/certs/server.pem" > "$dir/certs/server-store.pem")
    (umask 077; openssl rand -hex 16 > "$dir/password")
    local password
    password=$(cat "$dir/password")
    (umask 077; cat > "$dir/jaas.conf" <<JAAS
Server {
    org.apache.zookeeper.server.auth.DigestLoginModule required
    user_distlock="$password";
};
JAAS
)
    touch "$dir/tls.enabled"
    start
}

launch() {
    local cp="$dir:/usr/share/java/zookeeper.jar" port secure=()
    port=$(sed -n 's/^\(secureC\|c\)lientPort=//p' "$dir/zoo.cfg")
    if [[ -f "$dir/tls.enabled" ]]; then
        local jar
        for jar in buffer codec common handler resolver transport transport-native-unix-common transport-native-epoll; do
            cp="$cp:/usr/share/java/netty-$jar.jar"
        done
        secure=(
            -Dzookeeper.serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
            -Dzookeeper.ssl.keyStore.location="$dir/certs/server-store.pem" -Dzookeeper.ssl.keyStore.type=PEM
            -Dzookeeper.ssl.trustStore.location="$dir/certs/ca.pem" -Dzookeeper.ssl.trustStore.type=PEM
            -Dzookeeper.ssl.clientAuth=need
            -Djava.security.auth.login.config="$dir/jaas.conf"
            -Dzookeeper.authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider
            -Dzookeeper.enforce.auth.enabled=true -Dzookeeper.enforce.auth.schemes=sasl
        )
    fi
    nohup java -Xmx512m -Dzk.logfile="$dir/zk.log" -Dlog4j.configuration="file:$dir/log4j.properties" \
        -Dznode.container.checkIntervalMs=1000 -Dzookeeper.jmx.log4j.disable=true "${secure[@]}" \
        -cp "$cp" org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" \
        > "$dir/zk.out" 2>&1 < /dev/null &
    local pid=$!
    echo "$pid" > "$dir/zk.pid"
    # Wait (bounded: 60 s) for the server to answer ruok.
    for _ in $(seq 1 300); do
        if [[ "$(ruok "$port")" == "imok" ]]; then
            log "ZooKeeper pid $pid serving on 127.0.0.1:$port"
            echo "127.0.0.1:$port"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "ZooKeeper exited; its output:"; cat "$dir/zk.out" >&2 || true
            exit 1
        fi
        sleep 0.2
    done
    log "ZooKeeper did not answer within 60 s"; kill "$pid" || true
    exit 1
}

stop() { stop_recorded "$dir/zk.pid" ZooKeeper; }
crash() { crash_recorded "$dir/zk.pid" ZooKeeper; }

case "$cmd" in
    start) start ;;
    start-tls) start_tls ;;
    stop) stop ;;
    kill) dir=$(cd "$dir" && pwd); crash ;;
    restart) dir=$(cd "$dir" && pwd); stop; launch ;;
    *) echo "usage: $0 start|stop|kill|restart DIR" >&2; exit 2 ;;
esac
