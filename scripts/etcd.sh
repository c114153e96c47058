#!/usr/bin/env bash
# Start or stop etcd servers for distlock's tests and demos.
#
#   scripts/etcd.sh start DIR     install Debian's etcd-server and etcd-client if missing, start one
#                                 member on free 127.0.0.1 ports with its data under DIR, wait
#                                 until it is healthy, and print its client address (host:port).
#   scripts/etcd.sh start-tls DIR the same, set up as production is: TLS only, client
#                                 certificates required (--client-cert-auth), auth enabled;
#                                 user distlock (password in DIR/password, mode 600; or its
#                                 client certificate's name) may read and write every key; user
#                                 team-a (DIR/team-a.password) only team-a/ and
#                                 distlock/jobs/team-a/ (least privilege). The run's CA and
#                                 certificates are in DIR/certs.
#   scripts/etcd.sh cluster DIR   start a 3-member cluster in DIR/n1..n3 the same way, wait until
#                                 every member is healthy, and print the client addresses
#                                 (comma-separated). Each member DIR/nI can be stopped, killed,
#                                 restarted or leader-checked on its own.
#   scripts/etcd.sh stop DIR      stop the member(s) recorded under DIR (and only those).
#   scripts/etcd.sh kill DIR      SIGKILL the member recorded in DIR (a crash).
#   scripts/etcd.sh restart DIR   start that member again on the same ports and data.
#   scripts/etcd.sh leader DIR    print the n1..n3 directory of the cluster's leader.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "usage: $0 start|cluster|stop|kill|restart|leader DIR" >&2
    exit 2
fi
log() { echo "etcd.sh: $*" >&2; }

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"

# ctl MEMBER ARGS...: etcdctl to a member, over TLS with the client certificate when it has TLS
# (the certificate's name, distlock, is the etcd user once auth is on).
ctl() {
    local m=$1
    shift
    if [[ -f "$m/tls.enabled" ]]; then
        ETCDCTL_API=3 etcdctl --endpoints="https://127.0.0.1:$(cat "$m/client.port")" --cacert "$m/certs/ca.pem" \
            --cert "$m/certs/client.pem" --key "$m/certs/client.key" "$@"
    else
        ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$(cat "$m/client.port")" "$@"
    fi
}

install_etcd() {
    command -v etcd >/dev/null && command -v etcdctl >/dev/null && return
    log "installing etcd-server and etcd-client (Debian)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq etcd-server etcd-client >&2
}

# launch MEMBERDIR: start the member described by MEMBERDIR/{name,client.port,peer.port,cluster}.
launch() {
    local m=$1 pid scheme=http tls=()
    mkdir -p "$m/data"
    if [[ -f "$m/tls.enabled" ]]; then
        scheme=https
        tls=(--cert-file "$m/certs/server.pem" --key-file "$m/certs/server.key"
            --trusted-ca-file "$m/certs/ca.pem" --client-cert-auth)
    fi
    nohup etcd --name "$(cat "$m/name")" --data-dir "$m/data" "${tls[@]}" \
        --listen-client-urls "$scheme://127.0.0.1:$(cat "$m/client.port")" \
        --advertise-client-urls "$scheme://127.0.0.1:$(cat "$m/client.port")" \
        --listen-peer-urls "http://127.0.0.1:$(cat "$m/peer.port")" \
        --initial-advertise-peer-urls "http://127.0.0.1:$(cat "$m/peer.port")" \
        --initial-cluster "$(cat "$m/cluster")" --initial-cluster-state new \
        --initial-cluster-token "distlock-$(md5sum < "$m/cluster" | cut -c1-12)" \
        > "$m/etcd.log" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > "$m/etcd.pid"
}

# healthy MEMBERDIR...: wait (bounded: 30 s) until each answers a linearizable read; fails
# (status 1, the log's tail on stderr) if one exits or stays unhealthy.
healthy() {
    local m
    for m in "$@"; do
        for _ in $(seq 1 300); do
            if ctl "$m" --command-timeout=1s endpoint health > /dev/null 2>&1; then
                continue 2
            fi
            kill -0 "$(cat "$m/etcd.pid")" 2>/dev/null || { log "etcd in $m exited:"; tail -5 "$m/etcd.log" >&2; return 1; }
            sleep 0.1
        done
        log "etcd in $m not healthy within 30 s"; tail -5 "$m/etcd.log" >&2; return 1
    done
}

members() {
    if [[ -f "$dir/etcd.pid" || -f "$dir/name" ]]; then echo "$dir"; fi
    local m
    for m in "$dir"/n[0-9]; do [[ -d "$m" ]] && echo "$m"; done
    return 0
}

case "$cmd" in
start|start-tls)
    install_etcd
    mkdir -p "$dir"
    if [[ "$cmd" == start-tls ]]; then
        make_certs "$dir/certs" distlock
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/password")
        touch "$dir/tls.enabled"
    fi
    # A free port can be taken between free_ports and etcd's bind (by any process's outgoing
    # connection): then new ports, at most three tries.
    for try in 1 2 3; do
        read -r cport pport < <(free_ports 2)
        echo "$cport" > "$dir/client.port"
        echo "$pport" > "$dir/peer.port"
        echo "t1" > "$dir/name"
        echo "t1=http://127.0.0.1:$pport" > "$dir/cluster"
        rm -rf "$dir/data"
        launch "$dir"
        healthy "$dir" && break
        grep -q "address already in use" "$dir/etcd.log" && [[ $try -lt 3 ]] || exit 1
        log "a port was taken before etcd bound it: trying new ports"
    done
    if [[ "$cmd" == start-tls ]]; then
        # Authentication on: root; user distlock (its password, or its certificate's name) with
        # read and write on every key; and user team-a (password in DIR/team-a.password) with
        # the least a lock user needs: read and write on its own prefixes, locks and elections
        # under team-a/ and jobs under distlock/jobs/team-a/. Passwords go on stdin, not argv.
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$dir/team-a.password")
        {
            printf '%s-root\n' "$(cat "$dir/password")" | ctl "$dir" user add root --interactive=false
            ctl "$dir" user grant-role root root
            ctl "$dir" user add distlock --interactive=false < "$dir/password"
            ctl "$dir" role add locks
            ctl "$dir" role grant-permission locks --from-key readwrite ''
            ctl "$dir" user grant-role distlock locks
            ctl "$dir" user add team-a --interactive=false < "$dir/team-a.password"
            ctl "$dir" role add team-a
            ctl "$dir" role grant-permission team-a --prefix readwrite team-a/
            ctl "$dir" role grant-permission team-a --prefix readwrite distlock/jobs/team-a/
            ctl "$dir" user grant-role team-a team-a
            ctl "$dir" auth enable
        } > "$dir/auth.log" 2>&1 || { log "auth set-up failed:"; cat "$dir/auth.log" >&2; exit 1; }
    fi
    log "etcd pid $(cat "$dir/etcd.pid") on 127.0.0.1:$cport"
    echo "127.0.0.1:$cport"
    ;;
cluster)
    install_etcd
    mkdir -p "$dir"
    read -r c1 c2 c3 p1 p2 p3 < <(free_ports 6)
    cports=("$c1" "$c2" "$c3"); pports=("$p1" "$p2" "$p3")
    initial="n1=http://127.0.0.1:$p1,n2=http://127.0.0.1:$p2,n3=http://127.0.0.1:$p3"
    for i in 1 2 3; do
        m="$dir/n$i"
        mkdir -p "$m"
        echo "${cports[$((i-1))]}" > "$m/client.port"
        echo "${pports[$((i-1))]}" > "$m/peer.port"
        echo "n$i" > "$m/name"
        echo "$initial" > "$m/cluster"
        launch "$m"
    done
    healthy "$dir/n1" "$dir/n2" "$dir/n3" || exit 1
    log "etcd cluster on 127.0.0.1:$c1,$c2,$c3"
    echo "127.0.0.1:$c1,127.0.0.1:$c2,127.0.0.1:$c3"
    ;;
stop)
    while read -r m; do stop_recorded "$m/etcd.pid" "etcd ($m)"; done < <(members)
    ;;
kill)
    crash_recorded "$dir/etcd.pid" "etcd ($dir)"
    ;;
restart)
    [[ -f "$dir/name" ]] || { log "no member recorded in $dir"; exit 1; }
    launch "$dir"
    healthy "$dir" || exit 1
    log "etcd restarted, pid $(cat "$dir/etcd.pid")"
    echo "127.0.0.1:$(cat "$dir/client.port")"
    ;;
leader)
    for m in "$dir"/n[0-9]; do
        if ctl "$m" --command-timeout=1s endpoint status 2>/dev/null | awk -F', ' '{print $5}' | grep -q true; then
            echo "$m"; exit 0
        fi
    done
    log "no leader found"; exit 1
    ;;
*)
    echo "usage: $0 start|start-tls|cluster|stop|kill|restart|leader DIR" >&2
    exit 2
    ;;
esac
