#!/usr/bin/env bash
# Installs what the test suite needs from Debian's packages, only if missing:
# ZooKeeper (server and jars) and Apache Curator (for the Java interoperability tests).
set -euo pipefail
need=()
[[ -f /usr/share/java/zookeeper.jar ]] || need+=(zookeeper)
[[ -f /usr/share/java/curator-recipes.jar ]] || need+=(libcurator-recipes-java libcurator-framework-java libcurator-client-java)
command -v javac >/dev/null || need+=(openjdk-17-jdk-headless)
if [[ ${#need[@]} -gt 0 ]]; then
    echo "deps.sh: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >&2
fi
# kazoo (Python ZooKeeper client) for the compatibility check.
if ! python3 -c 'import kazoo' 2>/dev/null; then
    echo "deps.sh: installing kazoo from PyPI" >&2
    python3 -m pip install --quiet kazoo >&2
fi
