# Building distlock needs protoc (Debian's protobuf-compiler): the etcd-client crate compiles
# etcd's .proto files when it is built. Installs it only if missing.
if ! command -v protoc >/dev/null; then
    echo "installing protobuf-compiler (Debian): building the etcd client needs protoc" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq protobuf-compiler >&2
fi
