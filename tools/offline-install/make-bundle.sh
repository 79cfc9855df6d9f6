#!/usr/bin/env bash
# Makes the offline source-install bundle of foldprint: everything
# `pip install .` needs on a Linux x86-64 host that has python3 and a C
# compiler but no Rust toolchain and no network (see README.md here).
#
#     bash tools/offline-install/make-bundle.sh OUTDIR [PIECE_MIB]
#
# Run it on a machine WITH network access and rustup, in a checkout (it
# bundles the repository it is in). It writes into OUTDIR:
#
#   foldprint-offline.tar.xz.part-NN   the bundle, xz-compressed, split into
#                                      pieces of at most PIECE_MIB MiB (56);
#   foldprint-offline.parts.sha256     the pieces' SHA-256 sums;
#   install.sh                         a copy of this folder's install.sh;
#   pip-*.whl                          a pip wheel, used by install.sh only
#                                      where `python3 -m venv` has no pip.
#
# The bundle unpacks to foldprint-offline/ with
#   rust/     the minimal Rust toolchain for x86_64-unknown-linux-gnu of the
#             channel rust-toolchain.toml pins (bin/cargo, bin/rustc,
#             lib/*.so*, the std rlibs, rust-lld and gcc-ld/ld.lld), copied
#             from rustup's installation of that channel;
#   vendor/   `cargo vendor --locked` of Cargo.lock's crates;
#   wheels/   the maturin wheel (pyproject's build backend);
#   cargo-vendor-config.toml, CONTENTS.txt (versions, the commit).
#
# The maturin version is pyproject.toml's lower bound (`maturin>=X.Y` ->
# X.Y.0); MATURIN_VERSION overrides it. XZ_THREADS sets xz's threads (default
# 0: as many as cores and memory allow, at -9 about 0.7 GiB each; the
# output unpacks the same either way).
#
# Exit codes: 0 done, 1 a step failed, 2 usage, 3 a tool or toolchain is
# missing (named in the message).

set -euo pipefail

BUNDLE_NAME=foldprint-offline
TARGET=x86_64-unknown-linux-gnu

usage() {
    echo "usage: bash tools/offline-install/make-bundle.sh OUTDIR [PIECE_MIB]" >&2
    echo "       (PIECE_MIB: the largest piece in MiB, a positive integer; default 56)" >&2
    exit 2
}

die() {
    # die CODE MESSAGE...
    local code=$1
    shift
    echo "make-bundle: ERROR: $*" >&2
    exit "$code"
}

step() {
    echo "== [$(date -u +%H:%M:%S)] $*"
}

case "${1:-}" in
    -h|--help) usage ;;
esac
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
[ -n "$1" ] || usage
PIECE_MIB=${2:-56}
case "$PIECE_MIB" in
    ''|*[!0-9]*) usage ;;
esac
[ "$PIECE_MIB" -gt 0 ] || usage

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/../.." && pwd)
for f in Cargo.toml Cargo.lock pyproject.toml rust-toolchain.toml; do
    [ -f "$REPO/$f" ] || die 1 "$REPO/$f not found: run the script from its place in a foldprint checkout"
done
[ -f "$SCRIPT_DIR/install.sh" ] || die 1 "$SCRIPT_DIR/install.sh not found"

# ---------------------------------------------------------------- tools
missing=()
for t in rustup python3 tar xz split sha256sum; do
    command -v "$t" > /dev/null 2>&1 || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
    die 3 "missing on PATH: ${missing[*]} (this script needs network access, rustup, python3 with pip, tar, xz, split, sha256sum)"
fi
python3 -m pip --version > /dev/null 2>&1 || die 3 "python3 has no pip (python3 -m pip failed)"

CHANNEL=$(sed -n 's/^[[:space:]]*channel[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$REPO/rust-toolchain.toml" | head -n 1)
[ -n "$CHANNEL" ] || die 1 "no channel = \"...\" in $REPO/rust-toolchain.toml"

if [ -n "${MATURIN_VERSION:-}" ]; then
    MATURIN=$MATURIN_VERSION
else
    MATURIN=$(sed -n 's/.*"maturin[[:space:]]*>=[[:space:]]*\([0-9][0-9.]*\)[[:space:]]*[,"].*/\1/p' "$REPO/pyproject.toml" | head -n 1)
    [ -n "$MATURIN" ] || die 1 "no \"maturin>=X.Y\" requirement in $REPO/pyproject.toml; set MATURIN_VERSION"
    case "$MATURIN" in
        *.*.*) ;;
        *) MATURIN="$MATURIN.0" ;;
    esac
fi

# ---------------------------------------------------------------- toolchain
step "toolchain: Rust $CHANNEL from rustup"
RUSTC_PATH=$(rustup which --toolchain "$CHANNEL" rustc 2> /dev/null) \
    || die 3 "rustup has no toolchain $CHANNEL (rust-toolchain.toml's channel): rustup toolchain install $CHANNEL --profile minimal"
TC=$(cd "$(dirname "$RUSTC_PATH")/.." && pwd)
RUSTC_V=$("$TC/bin/rustc" -V) || die 3 "$TC/bin/rustc -V failed"
case "$CHANNEL" in
    [0-9]*)
        case "$RUSTC_V" in
            "rustc $CHANNEL "*|"rustc $CHANNEL") ;;
            *) die 1 "$TC/bin/rustc says '$RUSTC_V', not rustc $CHANNEL" ;;
        esac
        ;;
esac
HOST=$("$TC/bin/rustc" -vV | sed -n 's/^host: //p')
[ "$HOST" = "$TARGET" ] || die 1 "toolchain $TC is for $HOST; the bundle is for $TARGET (run this on Linux x86-64)"
[ -x "$TC/bin/cargo" ] || die 3 "$TC/bin/cargo missing (rustup component add cargo --toolchain $CHANNEL)"
CARGO_V=$("$TC/bin/cargo" -V)
RLIB="$TC/lib/rustlib/$TARGET"
for p in "$RLIB/lib" "$RLIB/bin/rust-lld" "$RLIB/bin/gcc-ld/ld.lld"; do
    [ -e "$p" ] || die 3 "$p missing from toolchain $TC"
done
echo "$RUSTC_V; $CARGO_V ($TC)"

if command -v git > /dev/null 2>&1 && COMMIT=$(git -C "$REPO" rev-parse HEAD 2> /dev/null); then
    if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
        COMMIT="$COMMIT (with uncommitted changes to tracked files)"
        echo "WARNING: the checkout has uncommitted changes; the crates follow its Cargo.lock"
    fi
else
    COMMIT="${FOLDPRINT_GIT_REV:-unknown (not a git checkout)}"
fi

mkdir -p "$1" || die 1 "cannot create $1"
OUTDIR=$(cd "$1" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/foldprint-bundle.XXXXXX") || die 1 "mktemp failed"
trap 'rm -rf "$WORK"' EXIT
STAGE="$WORK/$BUNDLE_NAME"
mkdir -p "$STAGE/rust/bin" "$STAGE/rust/lib/rustlib/$TARGET/bin/gcc-ld" "$STAGE/wheels"

cp -a "$TC/bin/cargo" "$TC/bin/rustc" "$STAGE/rust/bin/"
find "$TC/lib" -maxdepth 1 -name '*.so*' -exec cp -a {} "$STAGE/rust/lib/" \;
# The std rlibs and libstd.so; not the sanitizer runtimes (-Zsanitizer is
# nightly-only), 22 MB.
mkdir -p "$STAGE/rust/lib/rustlib/$TARGET/lib"
find "$RLIB/lib" -maxdepth 1 -type f ! -name 'librustc-*_rt.*.a' \
    -exec cp -a {} "$STAGE/rust/lib/rustlib/$TARGET/lib/" \;
cp -a "$RLIB/bin/rust-lld" "$STAGE/rust/lib/rustlib/$TARGET/bin/"
cp -a "$RLIB/bin/gcc-ld/ld.lld" "$STAGE/rust/lib/rustlib/$TARGET/bin/gcc-ld/"

# ---------------------------------------------------------------- crates
step "crates: cargo vendor --locked"
if ! (cd "$STAGE" && "$TC/bin/cargo" vendor --locked --manifest-path "$REPO/Cargo.toml" vendor) \
    > "$WORK/vendor-config.toml" 2> "$WORK/vendor.log"; then
    tail -n 20 "$WORK/vendor.log" >&2
    die 1 "cargo vendor --locked failed (network? an up-to-date Cargo.lock?)"
fi
[ -n "$(ls -A "$STAGE/vendor")" ] || die 1 "cargo vendor wrote no crates"
grep -q '^directory = ' "$WORK/vendor-config.toml" || die 1 "cargo vendor printed no source replacement"
sed 's|^directory = .*|directory = "vendor"  # install.sh writes the absolute path of the unpacked vendor/|' \
    "$WORK/vendor-config.toml" > "$STAGE/cargo-vendor-config.toml"
CRATES=$(find "$STAGE/vendor" -mindepth 1 -maxdepth 1 -type d | wc -l)
echo "$CRATES crates"

# ---------------------------------------------------------------- wheels
# The wheels are pure-Python/static (py3-none); --python-version 3.9, the
# floor install.sh accepts, makes pip pick releases that still run there.
step "wheels: maturin $MATURIN (and pip, for hosts whose venv has none)"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.9 --platform manylinux2014_x86_64 \
    -d "$STAGE/wheels" "maturin==$MATURIN" || die 1 "pip download maturin==$MATURIN failed"
MATURIN_WHL=$(cd "$STAGE/wheels" && ls maturin-*.whl) || die 1 "pip download wrote no maturin wheel"
[ "$(printf '%s\n' "$MATURIN_WHL" | wc -l)" -eq 1 ] || die 1 "expected one maturin wheel, got: $MATURIN_WHL"
rm -f "$OUTDIR"/pip-*.whl
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.9 -d "$OUTDIR" pip || die 1 "pip download pip failed"
PIP_WHL=$(cd "$OUTDIR" && ls pip-*.whl) || die 1 "pip download wrote no pip wheel"

cat > "$STAGE/CONTENTS.txt" <<EOF
Offline source-install bundle for foldprint (unpacked by tools/offline-install/install.sh)
rust/     minimal Rust toolchain, $TARGET (cargo, rustc, librustc_driver,
          libLLVM, std rlibs, rust-lld + gcc-ld/ld.lld)
vendor/   \`cargo vendor --locked\` of the crate's dependencies (Cargo.lock), $CRATES crates
wheels/   $MATURIN_WHL
          (build backend for pip's isolated build)
cargo-vendor-config.toml  the source replacement \`cargo vendor\` printed
$CARGO_V
$RUSTC_V
source commit at bundling: $COMMIT
made: $(date -u '+%Y-%m-%dT%H:%M:%SZ')
EOF

# ---------------------------------------------------------------- pack
step "pack: tar | xz | split into pieces of at most $PIECE_MIB MiB (minutes)"
rm -f "$OUTDIR/$BUNDLE_NAME".tar.xz.part-* "$OUTDIR/$BUNDLE_NAME.parts.sha256"
tar -C "$WORK" --owner=0 --group=0 --numeric-owner --sort=name -cf - "$BUNDLE_NAME" \
    | xz -9 -T"${XZ_THREADS:-0}" -c \
    | split -b "${PIECE_MIB}M" -d -a 2 - "$OUTDIR/$BUNDLE_NAME.tar.xz.part-" \
    || die 1 "packing failed"
(cd "$OUTDIR" && sha256sum "$BUNDLE_NAME".tar.xz.part-*) > "$OUTDIR/$BUNDLE_NAME.parts.sha256"
cp "$SCRIPT_DIR/install.sh" "$OUTDIR/install.sh"
chmod +x "$OUTDIR/install.sh"

step "done: $OUTDIR"
(cd "$OUTDIR" && ls -l "$BUNDLE_NAME".tar.xz.part-* "$BUNDLE_NAME.parts.sha256" install.sh "$PIP_WHL")
total=$(cat "$OUTDIR/$BUNDLE_NAME".tar.xz.part-* | wc -c)
pieces=$(wc -l < "$OUTDIR/$BUNDLE_NAME.parts.sha256")
echo "bundle: $(awk -v b="$total" 'BEGIN { printf "%.1f", b / 1048576 }') MiB in $pieces piece(s); commit $COMMIT"
echo "on the host, from the repository root: bash <this folder>/install.sh OUTDIR"
echo "  (or: bash tools/offline-install/install.sh OUTDIR --pieces <this folder>)"
