# Test certificates, made with the machine's openssl: a CA of the run's own, a server certificate
# for 127.0.0.1 and localhost, a client certificate, and a second CA that signed nothing of these
# (for "wrong CA" checks). Nothing here is fit for production: the keys are not protected.

# make_certs DIR [CLIENT_CN]: writes DIR/{ca,server,client,other-ca}.{pem,key} (keys mode 600),
# and two server certificates of the same CA that must be refused: misnamed.pem (for
# elsewhere.invalid only) and expired.pem (valid for a month that ended a year ago; made under
# faketime when the machine has it).
make_certs() {
    local dir=$1 client_cn=${2:-distlock} days=30
    mkdir -p "$dir"
    (
        cd "$dir"
        umask 077
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days $days \
            -subj "/CN=distlock test CA" 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days $days \
            -subj "/CN=another CA" 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > server.ext
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days $days \
            -extfile server.ext 2>/dev/null
        printf 'extendedKeyUsage=clientAuth\n' > client.ext
        openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=$client_cn" 2>/dev/null
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days $days \
            -extfile client.ext 2>/dev/null
        printf 'subjectAltName=DNS:elsewhere.invalid\nextendedKeyUsage=serverAuth\n' > misnamed.ext
        openssl req -newkey rsa:2048 -nodes -keyout misnamed.key -out misnamed.csr -subj "/CN=elsewhere.invalid" 2>/dev/null
        openssl x509 -req -in misnamed.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out misnamed.pem -days $days \
            -extfile misnamed.ext 2>/dev/null
        if command -v faketime > /dev/null; then
            openssl req -newkey rsa:2048 -nodes -keyout expired.key -out expired.csr -subj "/CN=localhost" 2>/dev/null
            faketime -f '-400d' openssl x509 -req -in expired.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
                -out expired.pem -days $days -extfile server.ext 2>/dev/null
        fi
        rm -f ./*.csr ./*.ext ./*.srl
        chmod 644 ./*.pem
    )
}
