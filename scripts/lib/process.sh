# Stopping the servers the scripts started, by the pid each recorded (never anything else).

# stop_recorded PIDFILE NAME: TERM (after CONT, in case a test paused it), KILL after 5 s.
stop_recorded() {
    local pidfile=$1 name=$2 pid
    [[ -f "$pidfile" ]] || { log "nothing recorded in $pidfile"; return; }
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        log "stopped $name pid $pid"
    fi
    rm -f "$pidfile"
}

# crash_recorded PIDFILE NAME: SIGKILL, and wait (bounded: 5 s) until it is gone.
crash_recorded() {
    local pidfile=$1 name=$2 pid
    [[ -f "$pidfile" ]] || { log "nothing recorded in $pidfile"; exit 1; }
    pid=$(cat "$pidfile")
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    log "killed $name pid $pid"
}
