# CPU hogs for stress runs: busy loops beside the tests, so that a test which hopes for a timing
# (instead of waiting on an event) fails here rather than on a busy CI machine.

hog_pids=()

# start_hogs N: N busy loops at normal priority (they share the cores with the tests).
start_hogs() {
    local n=$1 i
    for ((i = 0; i < n; i++)); do
        yes > /dev/null &
        hog_pids+=("$!")
    done
    echo "hogs: $n CPU hogs running (pids ${hog_pids[*]})" >&2
}

# stop_hogs: stops the hogs this shell started, and only those.
stop_hogs() {
    local pid
    for pid in "${hog_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${hog_pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    hog_pids=()
}
