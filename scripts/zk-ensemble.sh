#!/usr/bin/env bash
# A 3-member Apache ZooKeeper ensemble on 127.0.0.1 for distlock's fault tests (leader loss,
# member pauses and crashes). Companion of scripts/zk.sh, with the same conventions.
#
#   scripts/zk-ensemble.sh start DIR     install ZooKeeper (Debian package) if missing, start
#                                        members 1, 2, 3 on free ports with their data under
#                                        DIR/1, DIR/2, DIR/3, wait (at most 90 s) until each
#                                        answers `ruok` and the ensemble has a leader, and print
#                                        the connect string 127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
#   scripts/zk-ensemble.sh stop DIR      stop every member recorded under DIR
#   scripts/zk-ensemble.sh kill DIR N    SIGKILL member N (a crash)
#   scripts/zk-ensemble.sh pause DIR N   SIGSTOP member N
#   scripts/zk-ensemble.sh resume DIR N  SIGCONT member N
#   scripts/zk-ensemble.sh restart DIR N start member N again with its config and data (stopping
#                                        it first if it runs) and wait until it is a leader or a
#                                        follower
#   scripts/zk-ensemble.sh leader DIR    print N of the current leader (waits, at most 90 s,
#                                        while an election is under way)
#   scripts/zk-ensemble.sh addr DIR N    print member N's client address (also in DIR/N/client.addr)
#   scripts/zk-ensemble.sh pid DIR N     print member N's pid (also in DIR/N/zk.pid)
#
# Settings as in zk.sh (tickTime 500 ms so sessions may be as short as 1 s, admin server off,
# every four-letter word allowed, containers checked every second), plus initLimit 10 and
# syncLimit 5. Each member is a JVM with a 256 MiB heap. Only processes whose pid is recorded
# under DIR, and whose command line names DIR's config, are ever signalled.
set -euo pipefail

MEMBERS=(1 2 3)
WAIT_SECONDS=90

usage() {
    sed -n '5,20s/^# \{0,1\}//p' "$0" >&2
    exit 2
}

cmd=${1:-}
dir=${2:-}
[[ -n "$cmd" && -n "$dir" ]] || usage

log() { echo "zk-ensemble.sh: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=lib/zookeeper.sh
source "$(dirname "$0")/lib/zookeeper.sh"

member_arg() {
    local n=${1:-}
    [[ "$n" =~ ^[123]$ ]] || die "member must be 1, 2 or 3 (got '${n}')"
    echo "$n"
}

client_port() { local a; a=$(cat "$dir/$1/client.addr"); echo "${a##*:}"; }

# Prints leader, follower, or nothing when member $1 is not serving as part of a quorum.
mode() {
    four "$(client_port "$1")" srvr | sed -n 's/^Mode: //p'
}

recorded_pid() { [[ -f "$dir/$1/zk.pid" ]] && cat "$dir/$1/zk.pid" || true; }

# True when member $1's recorded pid is a live (not zombie) process started with its config.
alive() {
    local pid
    pid=$(recorded_pid "$1")
    [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$dir/$1/zoo.cfg" || return 1
    [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}

launch() {
    local n=$1 d="$dir/$1"
    local cp="$d:/usr/share/java/zookeeper.jar"
    # Log to DIR/N/zk.log when the log4j binding is installed (otherwise slf4j drops the logs).
    if [[ -f /usr/share/java/slf4j-log4j12.jar && -f /usr/share/java/log4j-1.2.jar ]]; then
        cp="$cp:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"
    fi
    nohup java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
        -Dzk.logfile="$d/zk.log" -Dlog4j.configuration="file:$d/log4j.properties" \
        -Dznode.container.checkIntervalMs=1000 -Dzookeeper.jmx.log4j.disable=true \
        -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" \
        > "$d/zk.out" 2>&1 < /dev/null &
    local pid=$!
    echo "$pid" > "$d/zk.pid"
    # Until the forked shell has exec'd java its command line is this script's, and alive() would
    # call the member gone (a restart on a loaded machine once failed so): wait, at most 10 s, for
    # the exec or the child's end.
    for _ in $(seq 1 100); do
        alive "$n" && return 0
        [[ -d "/proc/$pid" && "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] || return 0
        sleep 0.1
    done
}

# Waits until member $1 answers ruok and is a leader or a follower. Returns 1 on timeout or exit.
wait_serving() {
    local n=$1 deadline=$((SECONDS + WAIT_SECONDS)) port
    port=$(client_port "$n")
    while ((SECONDS < deadline)); do
        if ! alive "$n"; then
            log "member $n exited; its output:"; tail -n 30 "$dir/$n/zk.out" >&2 || true
            return 1
        fi
        if [[ "$(four "$port" ruok)" == imok ]]; then
            case "$(mode "$n")" in leader | follower) return 0 ;; esac
        fi
        sleep 0.2
    done
    log "member $n did not join a quorum within ${WAIT_SECONDS} s"
    return 1
}

# Prints N of the leader, waiting while an election is under way; returns 1 on timeout.
find_leader() {
    local deadline=$((SECONDS + WAIT_SECONDS)) n
    while ((SECONDS < deadline)); do
        for n in "${MEMBERS[@]}"; do
            if alive "$n" && [[ "$(mode "$n")" == leader ]]; then
                echo "$n"
                return 0
            fi
        done
        sleep 0.2
    done
    return 1
}

connect_string() {
    local n out=()
    for n in "${MEMBERS[@]}"; do out+=("$(cat "$dir/$n/client.addr")"); done
    (IFS=,; echo "${out[*]}")
}

signal_member() {
    local sig=$1 n=$2
    alive "$n" || die "member $n is not running (pid file $dir/$n/zk.pid)"
    kill "-$sig" "$(recorded_pid "$n")"
}

# Stops member $1 (TERM, then KILL after 5 s) if it runs, and forgets its pid.
stop_member() {
    local n=$1 pid
    pid=$(recorded_pid "$n")
    if alive "$n"; then
        kill -TERM "$pid" 2>/dev/null || true
        kill -CONT "$pid" 2>/dev/null || true # a paused member must run to exit
        for _ in $(seq 1 50); do alive "$n" || break; sleep 0.1; done
        if alive "$n"; then kill -KILL "$pid" 2>/dev/null || true; fi
        for _ in $(seq 1 50); do alive "$n" || break; sleep 0.1; done
        log "stopped member $n (pid $pid)"
    fi
    rm -f "$dir/$n/zk.pid"
}

write_config() {
    local ports n servers=""
    read -r -a ports <<< "$(free_ports 9)"
    for n in "${MEMBERS[@]}"; do
        # Per member: client port, quorum port, election port.
        servers+="server.$n=127.0.0.1:${ports[$((3 * n - 2))]}:${ports[$((3 * n - 1))]}"$'\n'
    done
    for n in "${MEMBERS[@]}"; do
        local d="$dir/$n" client=${ports[$((3 * n - 3))]}
        mkdir -p "$d/data"
        echo "$n" > "$d/data/myid"
        echo "$n" > "$d/myid"
        cat > "$d/zoo.cfg" <<CFG
tickTime=500
initLimit=10
syncLimit=5
minSessionTimeout=1000
maxSessionTimeout=60000
dataDir=$d/data
clientPort=$client
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=*
extendedTypesEnabled=true
$servers
CFG
        write_log4j "$d/log4j.properties"
        echo "127.0.0.1:$client" > "$d/client.addr"
    done
}

start() {
    install_zookeeper
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local n running=0
    for n in "${MEMBERS[@]}"; do if alive "$n"; then running=$((running + 1)); fi; done
    if ((running == ${#MEMBERS[@]})); then
        log "already running"
        connect_string
        return
    fi
    ((running == 0)) || die "the ensemble in $dir is partly running; use restart N, or stop it first"

    write_config
    for n in "${MEMBERS[@]}"; do launch "$n"; done
    for n in "${MEMBERS[@]}"; do
        if ! wait_serving "$n"; then
            for m in "${MEMBERS[@]}"; do stop_member "$m"; done
            exit 1
        fi
    done
    local leader
    leader=$(find_leader) || { for n in "${MEMBERS[@]}"; do stop_member "$n"; done; die "no leader elected"; }
    connect_string > "$dir/ensemble.addr"
    log "ensemble serving; pids $(for n in "${MEMBERS[@]}"; do printf '%s ' "$(recorded_pid "$n")"; done)leader $leader"
    connect_string
}

restart() {
    local n=$1
    [[ -f "$dir/$n/zoo.cfg" ]] || die "no member $n configured under $dir (run start first)"
    stop_member "$n"
    launch "$n"
    wait_serving "$n" || { stop_member "$n"; exit 1; }
    log "member $n (pid $(recorded_pid "$n")) is $(mode "$n")"
}

if [[ "$cmd" != start ]]; then
    [[ -d "$dir" ]] || die "no such directory: $dir"
    dir=$(cd "$dir" && pwd)
fi

case "$cmd" in
    kill | pause | resume | restart | addr | pid) n=$(member_arg "${3:-}") ;;
esac

case "$cmd" in
    start) start ;;
    stop) for n in "${MEMBERS[@]}"; do stop_member "$n"; done ;;
    kill)
        signal_member KILL "$n"
        for _ in $(seq 1 50); do alive "$n" || break; sleep 0.1; done
        if alive "$n"; then die "member $n survived SIGKILL"; fi
        rm -f "$dir/$n/zk.pid"
        log "killed member $n"
        ;;
    pause) signal_member STOP "$n" ;;
    resume) signal_member CONT "$n" ;;
    restart) restart "$n" ;;
    leader) find_leader || die "no leader within ${WAIT_SECONDS} s" ;;
    addr) cat "$dir/$n/client.addr" 2>/dev/null || die "no member $n configured under $dir" ;;
    pid)
        alive "$n" || die "member $n is not running"
        recorded_pid "$n"
        ;;
    *) usage ;;
esac
