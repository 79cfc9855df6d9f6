#!/usr/bin/env bash
# The crate's check phase as the Nix build sandbox sees it, without Nix
# (Debian's Nix 2.8 cannot evaluate nixpkgs). Run by ci/packaging-checks.sh.
#
# What the test derivation declares is read from the flake itself, evaluated
# against the stand-ins (ci/nix-stubs): `checks.<system>.tests`' `src` (the
# file set nix/source.nix selects, copied to the store as lib.fileset does),
# `doCheck`, `checkFlags` (the skip list, nix/sandbox-skips.txt) and
# `nativeCheckInputs`. Then, as root, in a new mount and network namespace:
#
#   - the source is a fresh copy of that store path: no .git, nothing else;
#   - no network but loopback; crates come from a `cargo vendor` directory
#     made beforehand, as buildRustPackage's vendored dependencies;
#   - /etc is an empty tmpfs with passwd, group and hosts only (no
#     ld.so.cache, no ld.so.conf, no alternatives);
#   - HOME=/homeless-shelter, which does not exist and cannot be created;
#   - PATH holds only the toolchain, stdenv's tools and the declared inputs;
#   - the build runs as an unprivileged user (nixbld is not root).
#
# It then runs what cargoCheckHook runs: cargo test --release --offline
# --frozen -- <checkFlags>. A derivation with doCheck off has nothing to run
# and passes. Every skip must name a test that exists (a renamed test would
# otherwise run unskipped here and fail only in Nix, or a stale entry hide
# nothing).
#
# Cost: one release build of the crate, its dependencies and its tests into
# target/nix-sandbox, kept between runs: then only what changed is rebuilt.
# (Seeding it with a copy of the main build's target/release did not help:
# cargo rebuilt every dependency from the vendored sources.)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${FOLDPRINT_SANDBOX_DIR:-$root/target/nix-sandbox}
system=x86_64-linux

export NIX_CONFIG=${NIX_CONFIG:-'experimental-features = nix-command flakes
build-users-group =
warn-dirty = false'}

[ "$(id -u)" -eq 0 ] || { echo "nix-sandbox-build: needs root (mount and network namespaces)" >&2; exit 1; }
for t in unshare setpriv ip cargo python3; do
    command -v "$t" >/dev/null || { echo "nix-sandbox-build: $t is missing" >&2; exit 1; }
done

# --- 1. what the derivation declares ------------------------------------------
stubs=$root/ci/nix-stubs
# shellcheck disable=SC2016 # Nix's ${...}
decl=$(nix eval --offline --no-write-lock-file \
    --override-input nixpkgs "path:$stubs/nixpkgs" \
    --override-input rust-overlay "path:$stubs/rust-overlay" \
    --json ".#checks.$system.tests" --apply 't: {
        src = "${t.src}";
        doCheck = t.doCheck or true;
        checkFlags = t.checkFlags or [ ];
        nativeCheckInputs = map (p: p.pname or p.name) (t.nativeCheckInputs or [ ]);
    }' 2> >(grep -v -e '^warning: \(ignoring untrusted\|not writing modified lock\|Git tree\)' \
        -e '^• Updated input' -e "^    '" -e '^  → ' >&2 || true))
get() { python3 -c 'import json, sys; v = json.loads(sys.argv[1])[sys.argv[2]]; print(v if isinstance(v, str) else json.dumps(v))' "$decl" "$1"; }
src=$(get src)
do_check=$(get doCheck)
list() { python3 -c 'import json, sys; [print(x) for x in json.loads(sys.argv[1])[sys.argv[2]]]' "$decl" "$1"; }
mapfile -t flags < <(list checkFlags)
mapfile -t inputs < <(list nativeCheckInputs)
echo "   checks.$system.tests: src $src ($(find "$src" -type f | wc -l) files), doCheck $do_check," \
    "${#flags[@]} check flag(s), nativeCheckInputs: ${inputs[*]:-none}"
if [ "$do_check" != true ]; then
    echo "nix-sandbox-build: checks.$system.tests does not run the test suite (doCheck is off)" >&2
    exit 1
fi

# --- 2. the sandbox's tools ----------------------------------------------------
rm -rf "${work:?}/bin" "$work/tmp" "$work/cargo-home"
mkdir -p "$work/bin" "$work/tmp" "$work/cargo-home" "$work/toolchain"
toolchain=$(rustup run "$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)" rustc --print sysroot)
link() { # link NAME...: each from the host, resolved (the sandbox has no /etc/alternatives)
    local n p
    for n in "$@"; do
        p=$(command -v "$n") || { echo "nix-sandbox-build: host lacks $n" >&2; exit 1; }
        ln -sf "$(readlink -f "$p")" "$work/bin/$n"
    done
}
# stdenv: coreutils, findutils, diffutils, sed, grep, awk, tar, gzip, bzip2,
# xz, make, bash, patch, file, and the C compiler and binutils (rustc links
# through cc).
mapfile -t coreutils < <(dpkg -L coreutils | sed -n 's|^/usr/bin/||p; s|^/bin/||p' | sort -u)
link "${coreutils[@]}" find xargs diff cmp sed grep awk tar gzip bzip2 xz make bash sh patch file \
    cc gcc as ld ar nm ranlib strip objcopy objdump readelf
# The declared check inputs, by package name.
for i in "${inputs[@]}"; do
    case $i in
        coreutils) ;;
        python3) ln -sf "$(readlink -f /usr/bin/python3)" "$work/bin/python3" ;;
        git) link git ;;
        *) echo "nix-sandbox-build: nativeCheckInputs has $i; teach this script its programs" >&2; exit 1 ;;
    esac
done

# --- 3. the source, the vendored crates -----------------------------------------
# The source becomes exactly the store path's files. Files whose bytes are
# unchanged keep their old mtime, so cargo rebuilds only what changed
# (store files all have mtime 1, which would hide changes if copied as is).
python3 - "$src" "$work/src" <<'PY'
import filecmp, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
want = set()
for d, _, files in os.walk(src):
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), src)
        want.add(rel)
        a, b = os.path.join(src, rel), os.path.join(dst, rel)
        if not (os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)):
            os.makedirs(os.path.dirname(b), exist_ok=True)
            if os.path.lexists(b):
                os.remove(b)
            shutil.copyfile(a, b)
            os.chmod(b, 0o644 | (os.stat(a).st_mode & 0o111))
for d, dirs, files in os.walk(dst, topdown=False):
    for f in files:
        p = os.path.join(d, f)
        if os.path.relpath(p, dst) not in want:
            os.remove(p)
    if d != dst and not os.listdir(d):
        os.rmdir(d)
PY
mkdir -p "$work/target"
if ! [ -f "$work/vendor.lock" ] || ! cmp -s "$work/vendor.lock" "$work/src/Cargo.lock"; then
    rm -rf "$work/vendor"
    cargo vendor --locked --manifest-path "$work/src/Cargo.toml" "$work/vendor" >/dev/null
    cp "$work/src/Cargo.lock" "$work/vendor.lock"
fi
cat >"$work/cargo-home/config.toml" <<EOF
[source.crates-io]
replace-with = "vendored-sources"
[source.vendored-sources]
directory = "$work/vendor"
[net]
offline = true
EOF
chown -R nobody:nogroup "$work/src" "$work/tmp" "$work/cargo-home" "$work/target"
chmod -R a+rX "$work/vendor"

# --- 4. the namespace ----------------------------------------------------------
cat >"$work/inner.sh" <<'EOF'
set -euo pipefail
mount --make-rprivate /
mount -t tmpfs -o mode=0755 tmpfs /etc
printf 'root:x:0:0::/root:/noshell\nnixbld:x:65534:65534::/homeless-shelter:/noshell\n' >/etc/passwd
printf 'root:x:0:\nnixbld:!:65534:\n' >/etc/group
printf '127.0.0.1 localhost\n::1 localhost\n' >/etc/hosts
ip link set lo up
# The toolchain lives under root's home, which the build user cannot enter.
mount --bind -o ro "$SB_TOOLCHAIN" "$SB_WORK/toolchain"
# / stays writable for root outside; the build user cannot create
# /homeless-shelter there either way.
exec setpriv --reuid 65534 --regid 65534 --clear-groups -- env -i \
    PATH="$SB_WORK/toolchain/bin:$SB_WORK/bin" HOME=/homeless-shelter TMPDIR="$SB_WORK/tmp" \
    CARGO_HOME="$SB_WORK/cargo-home" CARGO_TARGET_DIR="$SB_WORK/target" \
    NIX_BUILD_CORES="$SB_CORES" SB_WORK="$SB_WORK" SB_FLAGS="$SB_FLAGS" \
    bash -euo pipefail -c '
        cd "$SB_WORK/src"
        for p in .git /etc/ld.so.cache "$HOME"; do
            if [ -e "$p" ]; then echo "nix-sandbox-build: $p exists in the sandbox" >&2; exit 1; fi
        done
        if mkdir "$HOME" 2>/dev/null; then echo "nix-sandbox-build: HOME is writable" >&2; exit 1; fi
        flags=()
        while read -r f; do [ -z "$f" ] || flags+=("$f"); done <<<"$SB_FLAGS"
        # Every skip names an existing test.
        cargo test --release --frozen --offline -j "$NIX_BUILD_CORES" -- --list --format terse \
            | sed -n "s/: test\$//p" | sort -u >"$TMPDIR/tests.txt"
        for f in "${flags[@]}"; do
            case $f in --skip=*) grep -qxF "${f#--skip=}" "$TMPDIR/tests.txt" \
                || { echo "nix-sandbox-build: the skip list names no test: ${f#--skip=}" >&2; exit 1; } ;; esac
        done
        cargo test --release --frozen --offline -j "$NIX_BUILD_CORES" -- \
            --test-threads="$NIX_BUILD_CORES" "${flags[@]}"
    '
EOF
SB_WORK=$work SB_TOOLCHAIN=$toolchain SB_CORES=$(nproc) SB_FLAGS=$(printf '%s\n' "${flags[@]}") \
    unshare --mount --net --fork bash "$work/inner.sh"
