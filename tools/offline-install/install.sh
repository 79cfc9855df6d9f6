#!/usr/bin/env bash
# Offline source install of foldprint (`pip install .`) on a Linux x86-64
# host with python3 >= 3.9 and a C compiler but no Rust toolchain and no
# network, from the bundle tools/offline-install/make-bundle.sh makes (see
# README.md here). Run it from the repository root:
#
#     bash tools/offline-install/install.sh OUTDIR [--pieces DIR]...
#     bash BUNDLE_DIR/install.sh OUTDIR      (the copy beside the pieces)
#
# The pieces (foldprint-offline.tar.xz.part-NN and
# foldprint-offline.parts.sha256) are looked for in the --pieces folders, in
# that order; without --pieces, in the folders FOLDPRINT_OFFLINE_PIECES names
# (separated by ':'); without either, in this script's own folder. Each may
# be a glob, quoted so that this script expands it, for pieces spread over
# several folders: --pieces 'bundle-*'.
#
# What it does, each step logged to OUTDIR/source-install.log:
#   1. checks for python3 >= 3.9, a C compiler and an archiver (exit 3
#      without one: the build compiles assembly (psm) and rustc links through
#      `cc`);
#   2. checks the pieces' SHA-256 sums, joins them and unpacks them into
#      /tmp/foldprint-offline: a minimal Rust toolchain, the vendored crates
#      and the maturin wheel;
#   3. puts that toolchain first on PATH, makes a CARGO_HOME under /tmp whose
#      config.toml points crates-io at the vendored crates, offline;
#   4. makes a fresh venv /tmp/foldprint-offline-venv and runs
#      `pip install --no-index --find-links <wheels> .` (pip's isolated build
#      takes maturin from the same folder);
#   5. runs the installed `foldprint --version` and the Python package, and
#      compares the commit compiled into the binary with `git rev-parse HEAD`
#      where git and a checkout are there.
# The last line printed is `source-install: ok <seconds>s` or
# `source-install: FAILED at <step>`.
#
# Exit codes: 0 installed; 1 a step failed; 2 usage; 3 a prerequisite is
# missing on the host (python3 >= 3.9, C compiler, archiver, or a C or Rust
# link that does not work).
#
# Environment (all optional):
#   FOLDPRINT_OFFLINE_PIECES  where the pieces are (see above).
#   FOLDPRINT_GIT_REV  commit to stamp into the binary (reports' `foldprint.git`)
#                      where the tree is not a git checkout; otherwise build.rs
#                      asks git, and without git the binary says `unknown`.
#   FOLDPRINT_OFFLINE_TMP  where the bundle, venv and CARGO_HOME go (default /tmp).
#   FOLDPRINT_OFFLINE_VENV the venv to make (default $FOLDPRINT_OFFLINE_TMP/foldprint-offline-venv;
#                      an existing one there is replaced).
#   CARGO_BUILD_JOBS   cargo's parallelism (default: all cores).

set -u -o pipefail

START=$SECONDS
BUNDLE_NAME=foldprint-offline
TMPBASE=${FOLDPRINT_OFFLINE_TMP:-/tmp}
UNPACK="$TMPBASE/$BUNDLE_NAME"
VENV=${FOLDPRINT_OFFLINE_VENV:-$TMPBASE/foldprint-offline-venv}
CARGO_HOME_DIR="$TMPBASE/foldprint-cargo-home"
CHECK_DIR="$TMPBASE/foldprint-toolcheck"

usage() {
    echo "usage: bash tools/offline-install/install.sh OUTDIR [--pieces DIR]..." >&2
    echo "       run from the repository root; DIR (or a quoted glob of folders) holds" >&2
    echo "       the bundle pieces (default: \$FOLDPRINT_OFFLINE_PIECES, else this script's folder)" >&2
    exit 2
}

OUT_ARG=""
PIECE_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage ;;
        --pieces)
            if [ $# -lt 2 ] || [ -z "$2" ]; then usage; fi
            PIECE_ARGS+=("$2")
            shift 2
            ;;
        --pieces=*)
            [ -n "${1#--pieces=}" ] || usage
            PIECE_ARGS+=("${1#--pieces=}")
            shift
            ;;
        -*) usage ;;
        *)
            [ -z "$OUT_ARG" ] || usage
            OUT_ARG=$1
            shift
            ;;
    esac
done
[ -n "$OUT_ARG" ] || usage

mkdir -p "$OUT_ARG" || { echo "source-install: FAILED at outdir (cannot create $OUT_ARG)"; exit 1; }
OUTDIR=$(cd "$OUT_ARG" && pwd) || exit 1
LOG="$OUTDIR/source-install.log"
: > "$LOG" || { echo "source-install: FAILED at outdir (cannot write $LOG)"; exit 1; }

REPO=$(pwd)
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if [ ${#PIECE_ARGS[@]} -eq 0 ]; then
    if [ -n "${FOLDPRINT_OFFLINE_PIECES:-}" ]; then
        IFS=: read -r -a PIECE_ARGS <<< "$FOLDPRINT_OFFLINE_PIECES"
    else
        PIECE_ARGS=("$SCRIPT_DIR")
    fi
fi
# The folders to search, globs expanded, in order.
PIECE_DIRS=()
for pat in "${PIECE_ARGS[@]}"; do
    [ -n "$pat" ] || continue
    matches=()
    mapfile -t matches < <({ compgen -G "$pat" || true; } | LC_ALL=C sort)
    [ ${#matches[@]} -gt 0 ] || matches=("$pat")
    for d in "${matches[@]}"; do
        if [ -d "$d" ]; then
            PIECE_DIRS+=("$(cd "$d" && pwd)")
        else
            echo "ERROR: --pieces $d: not a folder" | tee -a "$LOG"
            echo "source-install: FAILED at pieces"
            exit 2
        fi
    done
done
[ ${#PIECE_DIRS[@]} -gt 0 ] || usage

log() {
    printf '%s\n' "$*" >> "$LOG"
}

say() {
    printf '%s\n' "$*"
    log "$*"
}

fail() {
    # fail STEP [EXIT_CODE] [MESSAGE...]
    local step=$1 code=${2:-1}
    shift 2 || shift $#
    if [ $# -gt 0 ]; then
        say "ERROR: $*"
    fi
    log "== failed at step '$step' after $((SECONDS - START))s"
    echo "see $LOG"
    echo "source-install: FAILED at $step"
    exit "$code"
}

begin() {
    say "== [$(date -u +%H:%M:%S)] $1"
}

# run STEP CMD...: run a command, its output going to the log only.
run() {
    local step=$1
    shift
    log "\$ $*"
    if ! "$@" >> "$LOG" 2>&1; then
        fail "$step" 1 "'$*' failed (last lines of $LOG above this one)"
    fi
}

log "foldprint offline source install, $(date -u '+%Y-%m-%dT%H:%M:%SZ')"
log "repository root: $REPO"
log "pieces searched in: ${PIECE_DIRS[*]}"
log "host: $(uname -srm), $(nproc 2>/dev/null || echo '?') cores"
if [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    log "os: $(. /etc/os-release && echo "${PRETTY_NAME:-unknown}")"
fi

# ---------------------------------------------------------------- checks
begin "check: sources, python3, C compiler/linker"
if [ ! -f "$REPO/Cargo.toml" ] || [ ! -f "$REPO/pyproject.toml" ] || [ ! -f "$REPO/Cargo.lock" ]; then
    fail check-sources 1 "run this from the repository root (Cargo.toml, Cargo.lock, pyproject.toml not found in $REPO)"
fi
if [ "$(uname -m)" != x86_64 ] || [ "$(uname -s)" != Linux ]; then
    fail check-host 1 "the bundled toolchain is for Linux x86_64, this is $(uname -sm)"
fi

PYTHON=$(command -v python3 || true)
if [ -z "$PYTHON" ]; then
    fail check-python 3 "python3 not found on PATH"
fi
log "python3: $PYTHON ($("$PYTHON" -V 2>&1))"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
    fail check-python 3 "python3 >= 3.9 needed, found $("$PYTHON" -V 2>&1)"
fi

# The path of the first of the named programs on PATH, or nothing.
first_on_path() {
    local p
    for p in "$@"; do
        if command -v "$p" > /dev/null 2>&1; then
            command -v "$p"
            return
        fi
    done
}

CC_BIN=$(first_on_path cc gcc clang)
if [ -z "$CC_BIN" ]; then
    say "ERROR: no C compiler/linker found (looked for cc, gcc, clang on PATH)."
    say "       rustc links through the system C compiler driver and the crate psm"
    say "       assembles a .S file with it; install one (e.g. apt-get install gcc,"
    say "       which brings binutils and libc6-dev) and run this again."
    fail check-cc 3
fi
log "C compiler: $CC_BIN ($("$CC_BIN" --version 2>&1 | head -n 1))"
AR_BIN=$(first_on_path ar gcc-ar llvm-ar)
if [ -z "$AR_BIN" ]; then
    say "ERROR: C compiler $CC_BIN found but no archiver (ar, gcc-ar, llvm-ar): the"
    say "       crate psm's build script needs one (apt-get install binutils)."
    fail check-cc 3
fi
log "archiver: $AR_BIN"
log "system ld: $(command -v ld || echo 'none (not needed: rustc links with the bundled rust-lld)')"

rm -rf "$CHECK_DIR"
mkdir -p "$CHECK_DIR" || fail check-cc 1 "cannot create $CHECK_DIR"
printf 'int foldprint_probe(int x) { return x + 1; }\nint main(void) { return foldprint_probe(-1); }\n' > "$CHECK_DIR/probe.c"
log "\$ $CC_BIN -O2 probe.c -o probe && ./probe"
if ! "$CC_BIN" -O2 "$CHECK_DIR/probe.c" -o "$CHECK_DIR/probe" >> "$LOG" 2>&1 || ! "$CHECK_DIR/probe"; then
    say "ERROR: $CC_BIN cannot compile and link a C program (libc headers/crt files"
    say "       missing? e.g. apt-get install libc6-dev); see $LOG."
    fail check-cc 3
fi
export CC="$CC_BIN" AR="$AR_BIN"
if [ "$(basename "$CC_BIN")" != cc ]; then
    # rustc's default linker driver on this target is `cc`.
    export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER="$CC_BIN"
fi

# ---------------------------------------------------------------- unpack
begin "unpack: join and check the bundle pieces into $UNPACK"
PARTS_LIST=""
for d in "${PIECE_DIRS[@]}"; do
    if [ -f "$d/$BUNDLE_NAME.parts.sha256" ]; then
        PARTS_LIST="$d/$BUNDLE_NAME.parts.sha256"
        break
    fi
done
[ -n "$PARTS_LIST" ] || fail unpack 1 "$BUNDLE_NAME.parts.sha256 not found in: ${PIECE_DIRS[*]} (name the bundle's folder with --pieces DIR)"
log "piece list: $PARTS_LIST"
PARTS=()
while read -r sum name; do
    [ -n "$name" ] || continue
    found=""
    for d in "${PIECE_DIRS[@]}"; do
        if [ -f "$d/$name" ]; then
            found="$d/$name"
            break
        fi
    done
    [ -n "$found" ] || fail unpack 1 "bundle piece $name not found in: ${PIECE_DIRS[*]} (were all pieces copied?)"
    got=$(sha256sum "$found" | cut -d' ' -f1)
    [ "$got" = "$sum" ] || fail unpack 1 "bundle piece $found is damaged (sha256 $got, expected $sum)"
    log "piece ok: $found"
    PARTS+=("$found")
done < "$PARTS_LIST"
[ "${#PARTS[@]}" -gt 0 ] || fail unpack 1 "no pieces listed in $PARTS_LIST"

avail_kib=$(df -Pk "$TMPBASE" | awk 'NR == 2 { print $4 }')
log "free in $TMPBASE: ${avail_kib:-?} KiB (about 0.8 GiB needed)"
if [ -n "$avail_kib" ] && [ "$avail_kib" -lt 1200000 ]; then
    fail unpack 1 "less than 1.2 GiB free in $TMPBASE"
fi

rm -rf "$UNPACK"
if command -v xz > /dev/null 2>&1; then
    log "\$ cat pieces | xz -dc | tar -x -C $TMPBASE"
    cat "${PARTS[@]}" | xz -dc | tar -x -C "$TMPBASE" -f - >> "$LOG" 2>&1 \
        || fail unpack 1 "unpacking the bundle failed"
else
    log "xz not found: unpacking with python3's lzma and tarfile"
    cat "${PARTS[@]}" | "$PYTHON" -c '
import sys, tarfile
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|xz") as t:
    t.extractall(sys.argv[1], filter="tar") if hasattr(tarfile, "data_filter") else t.extractall(sys.argv[1])
' "$TMPBASE" >> "$LOG" 2>&1 || fail unpack 1 "unpacking the bundle (python3 lzma) failed"
fi
[ -x "$UNPACK/rust/bin/cargo" ] || fail unpack 1 "$UNPACK/rust/bin/cargo missing after unpacking"
log "$(cat "$UNPACK/CONTENTS.txt" 2>/dev/null)"

# ---------------------------------------------------------------- toolchain
begin "toolchain: Rust from the bundle, CARGO_HOME offline"
RUST="$UNPACK/rust"
export PATH="$RUST/bin:$PATH"
export RUSTC="$RUST/bin/rustc" CARGO="$RUST/bin/cargo"
unset RUSTUP_TOOLCHAIN RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER RUSTFLAGS CARGO_TARGET_DIR
export CARGO_HOME="$CARGO_HOME_DIR"
export CARGO_NET_OFFLINE=true
rm -rf "$CARGO_HOME"
mkdir -p "$CARGO_HOME" || fail toolchain 1 "cannot create $CARGO_HOME"
cat > "$CARGO_HOME/config.toml" <<EOF
# Written by foldprint's install.sh: crates come from the bundle, never the network.
[source.crates-io]
replace-with = "vendored-sources"

[source.vendored-sources]
directory = "$UNPACK/vendor"

[net]
offline = true
EOF
log "CARGO_HOME=$CARGO_HOME; config.toml:"
log "$(cat "$CARGO_HOME/config.toml")"
run toolchain rustc -vV
run toolchain cargo -V
[ "$(command -v cargo)" = "$RUST/bin/cargo" ] || fail toolchain 1 "cargo on PATH is $(command -v cargo), not the bundle's"

# rustc links through $CC with the bundled rust-lld: prove it on a tiny program.
printf 'fn main() { println!("rust link ok"); }\n' > "$CHECK_DIR/probe.rs"
log "\$ rustc -O probe.rs && ./probe-rs"
if ! rustc -O "$CHECK_DIR/probe.rs" -o "$CHECK_DIR/probe-rs" >> "$LOG" 2>&1 || ! "$CHECK_DIR/probe-rs" >> "$LOG" 2>&1; then
    say "ERROR: the bundled rustc cannot link a program through $CC_BIN; see $LOG."
    fail check-link 3
fi
# Cargo resolves the locked graph from the vendored crates (no network), and a
# plain toolchain ignores rust-toolchain.toml.
run cargo-metadata cargo metadata --locked --offline --format-version 1 --no-deps --manifest-path "$REPO/Cargo.toml"

# ---------------------------------------------------------------- venv
begin "venv: fresh $VENV"
rm -rf "$VENV"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_FIND_LINKS="$UNPACK/wheels"
export PIP_NO_INPUT=1
log "\$ $PYTHON -m venv $VENV"
if ! "$PYTHON" -m venv "$VENV" >> "$LOG" 2>&1; then
    # No ensurepip (Debian/Ubuntu without python3-venv): bootstrap pip from the wheel.
    log "python3 -m venv failed; trying --without-pip and the bundled pip wheel"
    rm -rf "$VENV"
    PIP_WHL=$(find "${PIECE_DIRS[@]}" "$SCRIPT_DIR" "$UNPACK/wheels" -maxdepth 1 -name 'pip-*.whl' 2>/dev/null | head -n 1)
    [ -n "$PIP_WHL" ] || fail venv 1 "python3 -m venv failed and no pip-*.whl beside the pieces (or install python3-venv)"
    run venv "$PYTHON" -m venv --without-pip "$VENV"
    run venv "$VENV/bin/python" "$PIP_WHL/pip" install --no-index "$PIP_WHL"
fi
[ -x "$VENV/bin/pip" ] || fail venv 1 "$VENV/bin/pip missing"
run venv "$VENV/bin/python" -V
run venv "$VENV/bin/pip" -V

# ---------------------------------------------------------------- build
begin "build: pip install . (cargo build --release through maturin; minutes)"
build_start=$SECONDS
log "\$ $VENV/bin/pip install -v --no-index --find-links $UNPACK/wheels ."
if ! "$VENV/bin/pip" install -v --no-index --find-links "$UNPACK/wheels" . >> "$LOG" 2>&1; then
    tail -n 30 "$LOG"
    fail build 1 "pip install . failed"
fi
say "build took $((SECONDS - build_start))s"

# ---------------------------------------------------------------- verify
begin "verify: installed binary and package"
FP="$VENV/bin/foldprint"
unset FOLDPRINT_BIN
[ -x "$FP" ] || fail verify 1 "$FP missing after install"
VERSION_LINE=$("$FP" --version 2>> "$LOG") || fail verify 1 "$FP --version failed"
say "foldprint --version: $VERSION_LINE"
PY_LINE=$(cd "$TMPBASE" && "$VENV/bin/python" -c 'import foldprint; print(foldprint.binary(), foldprint.version())' 2>> "$LOG") \
    || fail verify 1 "python -c 'import foldprint' failed"
say "python: $PY_LINE"
case "$PY_LINE" in
    "$FP "*) ;;
    *) fail verify 1 "foldprint.binary() is not the venv's $FP" ;;
esac

# `foldprint --version` prints the crate version only; the commit build.rs
# found is compiled in (FOLDPRINT_GIT_REV, the reports' `foldprint.git`).
if command -v git > /dev/null 2>&1 && HEAD_FULL=$(git -C "$REPO" rev-parse HEAD 2>/dev/null); then
    HEAD_SHORT=$(git -C "$REPO" rev-parse --short HEAD)
    dirty=""
    if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
        dirty=" (working tree has uncommitted changes to tracked files)"
    fi
    want=${FOLDPRINT_GIT_REV:-$HEAD_FULL}
    if grep -a -q -F "$want" "$FP"; then
        say "commit: binary carries $want; HEAD is $HEAD_SHORT$dirty"
        if [ "$want" != "$HEAD_FULL" ]; then
            say "WARNING: FOLDPRINT_GIT_REV=$want differs from HEAD $HEAD_FULL"
        fi
    else
        fail verify 1 "binary does not carry commit $want (HEAD $HEAD_SHORT)"
    fi
else
    if [ -n "${FOLDPRINT_GIT_REV:-}" ]; then
        if grep -a -q -F "$FOLDPRINT_GIT_REV" "$FP"; then
            say "commit: no git checkout here; binary carries FOLDPRINT_GIT_REV=$FOLDPRINT_GIT_REV"
        else
            fail verify 1 "binary does not carry FOLDPRINT_GIT_REV=$FOLDPRINT_GIT_REV"
        fi
    else
        say "commit: no git checkout here (or no git): the binary's reports say git \"unknown\"; version only: $VERSION_LINE"
    fi
fi

rm -rf "$CHECK_DIR"
log "toolchain and vendored crates stay in $UNPACK"
say "installed into the venv $VENV (foldprint: $FP)"
echo "log: $LOG"
say "source-install: ok $((SECONDS - START))s"
