# Test certificates, made with the machine's openssl: a CA of the run's own, a server certificate
# for 127.0.0.1 and localhost, a client certificate, and a second CA that signed nothing of these
# (for "wrong CA" checks). Nothing here is fit for production: the keys are not protected.

# make_certs DIR [CLIENT_CN]: writes DIR/{ca,server,client,other-ca}.{pem,key} (keys mode 600),
# and two server certificates of the same CA that must be refused: misnamed.pem (for
# elsewhere.invalid only) and expired.pem (valid for a month that ended a year ago: signed with
# libfaketime preloaded into openssl, when the machine has it); and selfsigned.pem, a certificate
# for 127.0.0.1 and localhost that is its own CA (CA:TRUE, as `openssl req -x509` makes), which
# distlock refuses as a server's certificate even when given as cacert. openssl's messages go to
# DIR/openssl.log; when a step fails, the step and that log are printed and the script exits.
#
# Not the `faketime` wrapper: it names a shared-memory segment and a semaphore after its own pid,
# leaves them behind when it is interrupted, and refuses to run (silently here) when a later
# process gets the same pid: a start-tls failed that way once in CI, with nothing on stderr.
make_certs() {
    local dir=$1 client_cn=${2:-distlock} days=30
    local faketime_lib
    faketime_lib=$(find /usr/lib -path '*/faketime/libfaketime.so.1' 2>/dev/null | head -n 1)
    mkdir -p "$dir"
    (
        cd "$dir"
        umask 077
        : > openssl.log
        step() {
            "$@" >> openssl.log 2>&1 && return
            echo "certs.sh: making the test certificates in $dir failed at: $*" >&2
            cat openssl.log >&2
            exit 1
        }
        step openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days $days \
            -subj "/CN=distlock test CA"
        step openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days $days \
            -subj "/CN=another CA"
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
        step openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
        step openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
            -days $days -extfile server.ext
        printf 'extendedKeyUsage=clientAuth\n' > client.ext
        step openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=$client_cn"
        step openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem \
            -days $days -extfile client.ext
        printf 'subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n' > misnamed.ext
        step openssl req -newkey rsa:2048 -nodes -keyout misnamed.key -out misnamed.csr -subj "/CN=elsewhere.invalid"
        step openssl x509 -req -in misnamed.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out misnamed.pem \
            -days $days -extfile misnamed.ext
        step openssl req -x509 -newkey rsa:2048 -nodes -keyout selfsigned.key -out selfsigned.pem -days $days \
            -subj "/CN=localhost" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost"
        if [[ -n "$faketime_lib" && -f "$faketime_lib" ]]; then
            step openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost"
            step env LD_PRELOAD="$faketime_lib" FAKETIME=-400d openssl x509 -req -in expired.csr -CA ca.pem \
                -CAkey ca.key -CAcreateserial -out expired.pem -days $days -extfile server.ext
        fi
        rm -f ./*.csr ./*.ext ./*.srl
        chmod 644 ./*.pem
    )
}
