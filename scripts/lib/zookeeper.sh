# Shared by scripts/zk.sh and scripts/zk-ensemble.sh (sourced; each defines log() first).

install_zookeeper() {
    if [[ -f /usr/share/java/zookeeper.jar ]]; then return; fi
    log "installing the Debian zookeeper package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq zookeeper >&2
}

free_ports() {
    # $1 distinct free ports for servers, below the kernel's ephemeral range (so no bind to port 0,
    # proxy or outgoing connection is ever given one) and reserved for two hours in a registry
    # shared by every script on the machine: a server stopped to be restarted on its ports keeps
    # them, where a port the kernel handed out could go to another test's server in between (a
    # parallel matrix's TLS server once found a plaintext server on its port after a restart).
    python3 - "$1" <<'PY'
import fcntl, os, random, socket, sys, time
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
first, last = max(1024, low - 12000), low - 1
reg = os.environ.get("DISTLOCK_PORTS_DIR", "/tmp/distlock-ports")
os.makedirs(reg, exist_ok=True)
lock = open(os.path.join(reg, ".lock"), "w")
fcntl.flock(lock, fcntl.LOCK_EX)
now, picked = time.time(), []
for _ in range(20000):
    if len(picked) == int(sys.argv[1]):
        break
    port = random.randint(first, last)
    mark = os.path.join(reg, str(port))
    if port in picked or (os.path.exists(mark) and now - os.path.getmtime(mark) < 7200):
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    open(mark, "w").close()
    picked.append(port)
else:
    sys.exit("free_ports: no free port left in %d-%d (registry %s)" % (first, last, reg))
print(" ".join(map(str, picked)))
PY
}

four() {
    # Sends a four-letter word to 127.0.0.1:$1 and prints the answer (empty if none within 1 s);
    # over TLS with DIR=$3's client certificate (scripts/lib/certs.sh's names) when $3 is given.
    python3 - "$1" "$2" "${3:-}" <<'PY' 2>/dev/null || true
import socket, ssl, sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
    if sys.argv[3]:
        ctx = ssl.create_default_context(cafile=sys.argv[3] + "/ca.pem")
        ctx.load_cert_chain(sys.argv[3] + "/client.pem", sys.argv[3] + "/client.key")
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    s.sendall(sys.argv[2].encode())
    out = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        out += chunk
    print(out.decode(errors="replace"), end="")
except (OSError, ssl.SSLError):
    pass
PY
}

# Writes the log4j settings every server uses (WARN and above to ${zk.logfile}) to $1.
write_log4j() {
    cat > "$1" <<'L4J'
log4j.rootLogger=WARN, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=${zk.logfile}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{ISO8601} %-5p [%t] %c{1}: %m%n
L4J
}
