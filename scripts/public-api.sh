#!/usr/bin/env bash
# The public API of the published library crates, as text checked into the repository, so that
# an API change is a visible diff in review (CONTRIBUTING.md, "The public API listing").
#
#   scripts/public-api.sh           regenerate docs/public-api/distlock.txt (every feature) and
#                                   docs/public-api/distlock-server.txt
#   scripts/public-api.sh --check   regenerate into a temporary directory and compare with the
#                                   committed listings: a difference is printed as a unified diff
#                                   and fails (exit 1)
#
# How: rustdoc's JSON output (a nightly feature) of each crate, rendered one sorted line per public
# item by scripts/lib/public_api.py. The listings live under docs/ rather than in the crates:
# cargo package would ship them inside the crates, and they are for reviewers, beside the docs.
#
# Needs the nightly toolchain named in $toolchain below (PUBLIC_API_TOOLCHAIN overrides it).
# rustdoc's JSON format changes between nightlies: the renderer reads one format_version
# (FORMAT_VERSION in scripts/lib/public_api.py) and refuses another, naming both. The nightly
# builds in its own target directory, target/nightly (PUBLIC_API_TARGET_DIR overrides it), so the
# stable build's stays untouched; CARGO (default cargo) is the cargo to run.
set -euo pipefail
cd "$(dirname "$0")/.."

# Written against nightly 2026-05-19 (rustc 1.97.0-nightly e50aa6fba), rustdoc JSON format 57.
# Pinned by name only, as that is the nightly installed here; with a network, pin the date
# (nightly-2026-05-19) so that a new nightly cannot change the format under CI.
toolchain=${PUBLIC_API_TOOLCHAIN:-nightly}
target_dir=${PUBLIC_API_TARGET_DIR:-target/nightly}
cargo=${CARGO:-cargo}
out=docs/public-api
# Crate (package name) and the features its listing is made with.
crates=(distlock distlock-server)
declare -A features=([distlock]=--all-features [distlock-server]=)

check=no
case "${1:-}" in
    "") ;;
    --check) check=yes ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

log() { echo "public-api.sh: $*" >&2; }

if ! rustc +"$toolchain" -V > /dev/null 2>&1; then
    log "the $toolchain toolchain is missing: rustup toolchain install $toolchain --profile minimal"
    exit 2
fi
# shellcheck source=lib/protoc.sh
source scripts/lib/protoc.sh

dest=$out
if [[ $check == yes ]]; then
    dest=$(mktemp -d)
    trap 'rm -rf "$dest"' EXIT
fi
mkdir -p "$dest"

for crate in "${crates[@]}"; do
    # shellcheck disable=SC2086 # an empty feature flag is no argument
    "$cargo" +"$toolchain" rustdoc --quiet --locked -p "$crate" ${features[$crate]} --lib \
        --target-dir "$target_dir" -- -Z unstable-options --output-format json
    python3 scripts/lib/public_api.py "$target_dir/doc/${crate//-/_}.json" > "$dest/$crate.txt"
done

if [[ $check == no ]]; then
    for crate in "${crates[@]}"; do
        log "$out/$crate.txt: $(($(wc -l < "$out/$crate.txt") - 1)) items"
    done
    exit 0
fi

status=0
for crate in "${crates[@]}"; do
    committed=$out/$crate.txt
    [[ -f $committed ]] || committed=/dev/null
    diff -u --label "$out/$crate.txt (committed)" --label "$out/$crate.txt (this tree)" \
        "$committed" "$dest/$crate.txt" || status=1
done
if [[ $status -ne 0 ]]; then
    log "the public API changed: run scripts/public-api.sh and commit the listing"
    exit 1
fi
log "the public API listings match (${crates[*]})"
