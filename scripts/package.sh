#!/usr/bin/env bash
# Packages the published crates as crates.io would get them, then checks that they compile from
# the packages alone: their sources as packaged (a file left out of a package's `include` list,
# or a doc read from outside the crate, fails here), resolved against each other and crates.io,
# with nothing of the repository beside them.
#
#   scripts/package.sh     the .crate files land in target/package/
#   PACKAGE_CHECK_TOOLCHAIN=1.89 scripts/package.sh   checked with that toolchain (CI: the
#                          rust-version the manifests promise, so one check proves both)
#
# `cargo package`'s own verification builds each package apart, with its features alone: about
# ten minutes of CI for the same finding. Here the packages are unpacked into one workspace of
# their own and checked together (`cargo check`: what a missing file or module breaks; code
# generation adds nothing to that), in a target directory of its own so that nothing of the
# repository's build is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}

cargo package --workspace --exclude distlock-bench --exclude distlock-faults --no-verify

# The published packages and their versions (`publish = false` ones are not).
mapfile -t packages < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") != []:
        print(p["name"] + "-" + p["version"] + " " + p["name"])')

work=$target/package/check
rm -rf "$work"
mkdir -p "$work"
members=()
patches=()
for entry in "${packages[@]}"; do
    dir=${entry%% *}
    name=${entry#* }
    tar -xzf "$target/package/$dir.crate" -C "$work"
    members+=("\"$dir\"")
    patches+=("$name = { path = \"$dir\" }")
done
{
    echo "# Made by scripts/package.sh: the packaged crates, checked as a user gets them."
    echo "[workspace]"
    echo "resolver = \"2\""
    echo "members = [$(IFS=,; echo "${members[*]}")]"
    echo "[patch.crates-io]"
    printf '%s\n' "${patches[@]}"
    # The repository's own patch of a test peer (a dev-dependency the packages still name).
    echo "distributed-lock-postgres = { path = \"$PWD/vendor/distributed-lock-postgres\" }"
} > "$work/Cargo.toml"
# The versions the repository is tested with.
cp Cargo.lock "$work/Cargo.lock"
toolchain=()
[[ -n "${PACKAGE_CHECK_TOOLCHAIN:-}" ]] && toolchain=("+$PACKAGE_CHECK_TOOLCHAIN")
(cd "$work" && CARGO_TARGET_DIR="$PWD/../check-target" cargo "${toolchain[@]}" check --workspace 2>&1) || {
    echo "package.sh: the packaged crates do not compile from their packages alone (above)" >&2
    exit 1
}
echo "package.sh: ${#packages[@]} packages made and checked from their .crate files alone${PACKAGE_CHECK_TOOLCHAIN:+ (Rust $PACKAGE_CHECK_TOOLCHAIN)}"
