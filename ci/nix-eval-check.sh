#!/usr/bin/env bash
# Evaluates the flake's own code, every output of every system, against the
# stand-ins of nixpkgs and rust-overlay under ci/nix-stubs (Debian's Nix 2.8
# cannot evaluate real nixpkgs, and nothing can be fetched here). Run by
# ci/packaging-checks.sh, offline, in a few seconds.
#
# What it proves and what it cannot: docs/NIX.md, "What has been verified".
#
#   1. The stand-ins behave as nixpkgs does where the flake relies on it
#      (negative controls: callPackage fills a defaulted formal from the set,
#      an unfree package is refused without the predicate).
#   2. `drvPath` of every package, image, check, GPU check and dev shell,
#      and the program of every app, for x86_64-linux and aarch64-linux,
#      through `nix eval --override-input` on the flake itself.
#   3. No file called through callPackage declares a defaulted formal: such a
#      default is silently replaced by any nixpkgs attribute of that name
#      (the stand-in has only some of nixpkgs' names; this rule covers the
#      rest).
#   4. The derivation graphs: CUDA-only combinations (the default among them)
#      have no NCCL in their closure; each NCCL combination has exactly one,
#      of the matrix's release, compiled for exactly the matrix's runner
#      capabilities; each combination has its own CUDA set's NVRTC; the
#      binary is built with the pinned toolchain and holds no git revision;
#      image licence labels name the CUDA EULA where NVRTC is inside.
#
# Needs nix (2.8 or newer) and python3; writes .drv files to /nix/store.
set -euo pipefail
cd "$(dirname "$0")/.."

export NIX_CONFIG=${NIX_CONFIG:-'experimental-features = nix-command flakes
build-users-group =
warn-dirty = false'}
stubs=$PWD/ci/nix-stubs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
systems=(x86_64-linux aarch64-linux)

step() { echo "   $*"; }
# Nix's own warnings about the overridden inputs and the flake's nixConfig
# are expected here; errors are not filtered.
quiet() { grep -v -e "^warning: \(ignoring untrusted flake configuration\|not writing modified lock file\|Git tree .* is dirty\)" -e "^• Updated input" -e "^    '" -e "^  → " >&2 || true; }

# --- 1. the stand-ins follow nixpkgs where it matters --------------------------
step "stand-ins: callPackage fills a defaulted formal; unfree is refused without the predicate"
nix-instantiate --eval --strict --json --expr "
  let
    pkgs = import $stubs/nixpkgs { system = \"x86_64-linux\"; };
    got = pkgs.callPackage ({ clippy ? false }: clippy) { };
    explicit = pkgs.callPackage ({ clippy ? false }: clippy) { clippy = true; };
    refused = builtins.tryEval pkgs.cudaPackages_12_9.cuda_nvrtc.drvPath;
    allowed = (import $stubs/nixpkgs {
      system = \"x86_64-linux\";
      config.allowUnfreePredicate = p: true;
    }).cudaPackages_12_9.cuda_nvrtc.drvPath;
  in
  assert builtins.isAttrs got && got.pname == \"clippy\";
  assert explicit == true;
  assert !refused.success;
  builtins.isString allowed
" 2> >(quiet) >"$tmp/self-test"
[ "$(cat "$tmp/self-test")" = true ]

# --- 2. every output of every system, through the flake -------------------------
override=(--offline --no-write-lock-file
    --override-input nixpkgs "path:$stubs/nixpkgs"
    --override-input rust-overlay "path:$stubs/rust-overlay")
# shellcheck disable=SC2016 # Nix's ${...}, not the shell's
drvs='ps: builtins.mapAttrs (system: builtins.mapAttrs (name: p:
    if (p.type or null) == "derivation" then p.drvPath
    else throw "${system}.${name} is not a derivation")) ps'
# shellcheck disable=SC2016
apps='as: builtins.mapAttrs (system: builtins.mapAttrs (name: a:
    if a.type or null != "app" then throw "${system}.${name}: type is not app"
    else if !(builtins.hasContext a.program) then throw "${system}.${name}: program refers to no store path"
    else builtins.unsafeDiscardStringContext a.program)) as'
for out in packages checks gpuChecks devShells apps; do
    apply=$drvs
    [ "$out" = apps ] && apply=$apps
    if ! nix eval "${override[@]}" --json ".#$out" --apply "$apply" >"$tmp/$out.json" 2> >(quiet); then
        echo "nix-eval-check: evaluating .#$out failed (above)" >&2
        exit 1
    fi
done
nix eval "${override[@]}" --json ".#lib.matrix" >"$tmp/matrix.json" 2> >(quiet)

# --- 3. no defaulted formal in a file called through callPackage ---------------
called=$(grep -oh 'callPackage \./[a-z-]*\.nix' nix/*.nix | sed 's|callPackage \./||' | sort -u)
step "callPackage targets without defaulted formals: $(echo "$called" | tr '\n' ' ')"
for f in $called; do
    defaults=$(nix-instantiate --eval --strict --json --expr \
        "let a = builtins.functionArgs (import ./nix/$f); in builtins.filter (n: a.\${n}) (builtins.attrNames a)" 2> >(quiet))
    if [ "$defaults" != "[]" ]; then
        echo "nix/$f: formal(s) with a default, called through callPackage: $defaults" >&2
        echo "  callPackage passes the nixpkgs attribute of the same name instead of the default;" >&2
        echo "  drop the default and pass the value explicitly from nix/default.nix" >&2
        exit 1
    fi
done

# --- 4. the derivation graphs ----------------------------------------------------
python3 - "$tmp" "${systems[@]}" <<'PY'
import json, re, subprocess, sys

tmp, systems = sys.argv[1], sys.argv[2:]
toolchain = re.search(r'^channel = "(.*)"', open("rust-toolchain.toml").read(), re.M).group(1)
load = lambda n: json.load(open(f"{tmp}/{n}.json"))
matrix = load("matrix")
combos = {c["name"]: c for c in matrix["combinations"]}
outs = {o: load(o) for o in ("packages", "checks", "gpuChecks", "devShells", "apps")}

def show(drv):
    r = subprocess.run(["nix", "show-derivation", "-r", drv], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"nix show-derivation {drv}: {r.stderr}")
    return json.loads(r.stdout)

def fail(msg):
    sys.exit(f"nix-eval-check: {msg}")

total = 0
for s in systems:
    pk = outs["packages"].get(s) or fail(f"no packages for {s}")
    want = set(combos) | {f"foldprint-{n}" for n in combos} | {f"image-{n}" for n in combos} \
        | {"default", "foldprint-cpu", "foldprint-unwrapped", "image", "image-cpu"}
    if set(pk) != want:
        fail(f"{s}: packages {sorted(set(pk) ^ want)} differ from the matrix")
    if set(outs["gpuChecks"][s]) != set(combos):
        fail(f"{s}: gpuChecks differ from the matrix")
    if set(outs["apps"][s]) != set(combos) | {"default", "foldprint-cpu"}:
        fail(f"{s}: apps differ from the matrix")
    if set(outs["checks"][s]) != {"tests", "clippy", "fmt", "combinations", "cpu-smoke"}:
        fail(f"{s}: unexpected checks {sorted(outs['checks'][s])}")
    if pk["default"] != pk[matrix["default"]]:
        fail(f"{s}: packages.default is not {matrix['default']}")
    total += sum(len(outs[o][s]) for o in outs)

    # The binary: no git revision in its derivation (provenance is the
    # wrappers' business), so it changes only with the source.
    ugraph = show(pk["foldprint-unwrapped"])
    unwrapped = ugraph[pk["foldprint-unwrapped"]]
    if any("GIT_REV" in k for k in unwrapped["env"]):
        fail(f"{s}: the binary's derivation carries a git revision")
    # Built with the pinned toolchain, not nixpkgs' own rustc (what an
    # argument left to callPackage would silently give).
    rust = sorted(p for p in ugraph if re.search(r"-(rust-\w+-[\d.]+|rustc-[^/]*)\.drv$", p))
    if len(rust) != 1 or not rust[0].endswith(f"-rust-minimal-{toolchain}.drv"):
        fail(f"{s}: the binary is built with {rust}, not the pinned {toolchain}")

    for name, c in combos.items():
        graph = show(pk[name])
        # NVRTC of the combination's own CUDA set and of no other.
        nvrtc = {re.sub(r".*-(cuda[\d.]+)-cuda_nvrtc-.*", r"\1", p) for p in graph if "-cuda_nvrtc-" in p}
        if nvrtc != {"cuda" + c["cudaVersion"]}:
            fail(f"{s}: {name} has the NVRTC of {sorted(nvrtc)}, not of CUDA {c['cudaVersion']}")
        ncclDrvs = {p: d for p, d in graph.items() if re.search(r"-nccl-\d", p)}
        if c["nccl"] is None:
            if ncclDrvs:
                fail(f"{s}: CUDA-only {name} has NCCL in its closure: {sorted(ncclDrvs)}")
            continue
        if len(ncclDrvs) != 1:
            fail(f"{s}: {name} has {len(ncclDrvs)} NCCL derivations: {sorted(ncclDrvs)}")
        (path, d), = ncclDrvs.items()
        if not path.endswith(f"-nccl-{c['nccl']['version']}.drv"):
            fail(f"{s}: {name} builds {path}, not NCCL {c['nccl']['version']}")
        sm = re.findall(r"code=sm_(\d+)", d["env"].get("makeFlags", ""))
        want_sm = [cap.replace(".", "") for cap in c["nccl"]["cudaCapabilities"]]
        if sm != want_sm:
            fail(f"{s}: {name} compiles NCCL for sm_{sm}, the matrix says {want_sm}")
        src = [p for p in d["inputDrvs"] if p.endswith("-source.drv")]
        if len(src) != 1 or graph[src[0]]["outputs"]["out"].get("hash") is None:
            fail(f"{s}: {name}: NCCL source is not one fixed-output fetch")

    # Image labels: NVRTC inside means the CUDA EULA is named.
    for name in combos:
        conf = show(pk[f"image-{name}"])[pk[f"image-{name}"]]["env"].get("conf", "")
        lic = json.loads(conf)["Labels"]["org.opencontainers.image.licenses"]
        if "LicenseRef-CUDA-EULA" not in lic:
            fail(f"{s}: image-{name} licence label {lic!r} does not name the CUDA EULA")
        if (combos[name]["nccl"] is not None) != ("BSD-3-Clause" in lic):
            fail(f"{s}: image-{name} licence label {lic!r} and its NCCL disagree")
    conf = show(pk["image-cpu"])[pk["image-cpu"]]["env"]["conf"]
    if json.loads(conf)["Labels"]["org.opencontainers.image.licenses"] != "(MIT OR Apache-2.0)":
        fail(f"{s}: image-cpu has a licence label other than foldprint's")

n_nccl = sum(1 for c in combos.values() if c["nccl"])
print(f"   {total} outputs evaluated over {len(systems)} systems; "
      f"{len(combos) - n_nccl} CUDA-only combinations without NCCL, "
      f"{n_nccl} with one NCCL each for their runner capabilities")
PY
