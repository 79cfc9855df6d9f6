#!/usr/bin/env bash
# Evaluates the flake's own code, every output of every system, against the
# stand-ins of nixpkgs and rust-overlay under ci/nix-stubs (Debian's Nix 2.8
# cannot evaluate real nixpkgs, and nothing can be fetched here). Run by
# ci/packaging-checks.sh, offline, in a few seconds.
#
# What it proves and what it cannot: docs/NIX.md, "What has been verified".
#
#   1. The stand-ins behave as nixpkgs does where the flake relies on it
#      (negative controls: callPackage fills a defaulted formal from the set;
#      a CUDA redistributable is refused without the unfree predicate, or
#      without `cudaSupport` (broken); `meta.broken`, `meta.platforms` and
#      `meta.badPlatforms` are enforced at instantiation).
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
# With --real, only step 2, against the pinned inputs themselves (a current
# Nix with network: the nix-checks workflow's eval-and-build job).
#
# Needs nix (2.8 or newer) and python3; writes .drv files to /nix/store.
set -euo pipefail
cd "$(dirname "$0")/.."
real=false
[ "${1:-}" = --real ] && real=true

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
if ! $real; then
step "stand-ins: callPackage fills a defaulted formal; meta checks refuse unfree, broken, unsupported"
nix-instantiate --eval --strict --json --expr "
  let
    stubs = $stubs/nixpkgs;
    pkgs = import stubs { system = \"x86_64-linux\"; };
    got = pkgs.callPackage ({ clippy ? false }: clippy) { };
    explicit = pkgs.callPackage ({ clippy ? false }: clippy) { clippy = true; };
    nvrtc = config: (import stubs { system = \"x86_64-linux\"; inherit config; }).cudaPackages_12_9.cuda_nvrtc;
    fails = x: !(builtins.tryEval (builtins.seq x.drvPath true)).success;
    leaf = meta: pkgs.stdenv.mkDerivation { pname = \"x\"; version = \"1\"; inherit meta; };
  in
  assert builtins.isAttrs got && got.pname == \"clippy\";
  assert explicit == true;
  assert fails (nvrtc { cudaSupport = true; });
  assert fails (nvrtc { allowUnfreePredicate = p: true; });
  assert !fails (nvrtc { cudaSupport = true; allowUnfreePredicate = p: true; });
  assert fails (leaf { broken = true; });
  assert fails (leaf { platforms = [ \"aarch64-linux\" ]; });
  assert fails (leaf { badPlatforms = [ \"x86_64-linux\" ]; });
  assert !fails (leaf { platforms = [ \"x86_64-linux\" ]; });
  assert (nvrtc { cudaSupport = true; allowUnfreePredicate = p: true; }).drvAttrs.__structuredAttrs;
  true
" 2> >(quiet) >"$tmp/self-test"
[ "$(cat "$tmp/self-test")" = true ]
fi

# --- 2. every output of every system, through the flake -------------------------
override=(--offline --no-write-lock-file
    --override-input nixpkgs "path:$stubs/nixpkgs"
    --override-input rust-overlay "path:$stubs/rust-overlay")
$real && override=(--no-write-lock-file)
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
if $real; then
    python3 -c 'import json, sys; print("   %d outputs evaluated over 2 systems" % sum(len(v) for o in sys.argv[1:] for v in json.load(open(o)).values()))' "$tmp"/{packages,checks,gpuChecks,devShells,apps}.json
    exit 0
fi
nix eval "${override[@]}" --json ".#lib.matrix" >"$tmp/matrix.json" 2> >(quiet)
# shellcheck disable=SC2016
nix eval "${override[@]}" --json ".#packages" --apply 'ps: builtins.mapAttrs (s: p:
    let l = p.foldprint-unwrapped.meta.license; in
    map (x: x.spdxId or x.shortName) (if builtins.isList l then l else [ l ])) ps' >"$tmp/licenses.json" 2> >(quiet)
# shellcheck disable=SC2016
nix eval "${override[@]}" --json ".#packages" --apply 'ps: builtins.mapAttrs (s: builtins.mapAttrs (n: p:
    p.meta.mainProgram or null)) ps' >"$tmp/mainProgram.json" 2> >(quiet)

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
import base64, json, os, re, shlex, subprocess, sys

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

def attr(d, name):
    # With __structuredAttrs the attributes travel as one JSON document
    # (lists stay lists), as nixpkgs' NCCL and CUDA redistributables do.
    if "__json" in d["env"]:
        v = json.loads(d["env"]["__json"]).get(name)
    else:
        v = d["env"].get(name)
    return " ".join(v) if isinstance(v, list) else (v or "")

def sri_to_hex(h):
    return base64.b64decode(h.split("-", 1)[1]).hex()

# makeBinaryWrapper's flags and how many arguments each takes (nixpkgs'
# make-binary-wrapper.sh turns anything else into an #error at build time).
WRAPPER_FLAGS = {"--set": 2, "--set-default": 2, "--unset": 1, "--prefix": 3, "--suffix": 3,
                 "--chdir": 1, "--add-flag": 1, "--append-flag": 1, "--add-flags": 1,
                 "--append-flags": 1, "--argv0": 1, "--inherit-argv0": 0, "--resolve-argv0": 0}

def check_wrappers(s, name, graph, path):
    d = graph[path]
    script = attr(d, "buildCommand").replace("\\\n", " ")
    calls = [l.strip() for l in script.splitlines() if re.match(r"\s*makeWrapper\s", l)]
    if not calls:
        return
    hooks = [p for p in d["inputDrvs"] if "-make-binary-wrapper-hook" in p]
    if not hooks:
        fail(f"{s}: {name} calls makeWrapper without makeBinaryWrapper in nativeBuildInputs")
    for call in calls:
        args = shlex.split(call)[3:]
        i = 0
        while i < len(args):
            n = WRAPPER_FLAGS.get(args[i])
            if n is None:
                fail(f"{s}: {name}: makeWrapper flag {args[i]!r} is not one makeBinaryWrapper knows")
            if i + n > len(args) - 1:
                fail(f"{s}: {name}: makeWrapper {args[i]} takes {n} argument(s)")
            if args[i] in ("--prefix", "--suffix"):
                sep, val = args[i + 2], args[i + 3]
                if sep and f"{sep}{sep}" in f"{sep}{val}{sep}":
                    fail(f"{s}: {name}: makeWrapper {args[i]} {args[i + 1]} has an empty segment")
            i += n + 1

# The crate's source: every file git tracks under what cargo reads.
tracked = subprocess.run(["git", "ls-files", "Cargo.toml", "Cargo.lock", "build.rs", "src", "tests",
                          "examples"], capture_output=True, text=True, check=True).stdout.split()
def check_source(s, what, src, extra=()):
    missing = [f for f in list(tracked) + list(extra) if not os.path.exists(os.path.join(src, f))]
    if missing:
        fail(f"{s}: {what}'s source {src} lacks {len(missing)} file(s) cargo reads, e.g. {missing[:3]}")

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
    check_source(s, "foldprint-unwrapped", attr(unwrapped, "src"))
    tgraph = show(outs["checks"][s]["tests"])
    tests = tgraph[outs["checks"][s]["tests"]]
    check_source(s, "checks.tests", attr(tests, "src"), ["README.md"])
    if attr(unwrapped, "doCheck") not in ("", "0", "false"):
        fail(f"{s}: foldprint-unwrapped runs the test suite in the package users run")
    if attr(tests, "doCheck") in ("", "0", "false"):
        fail(f"{s}: checks.tests does not run the test suite")
    skips = [l for l in open("nix/sandbox-skips.txt").read().splitlines() if l and not l.startswith("#")]
    flags = attr(tests, "checkFlags").split()
    if sorted(f[len("--skip="):] for f in flags if f.startswith("--skip=")) != sorted(skips):
        fail(f"{s}: checks.tests' checkFlags {flags} are not nix/sandbox-skips.txt")
    for name, p in pk.items():
        if name.startswith("image"):
            continue
        g = show(p)
        check_wrappers(s, name, g, p)
    # Every package but the images names the binary, so `nix run` and
    # lib.getExe need not guess.
    for name, prog in load("mainProgram")[s].items():
        if not name.startswith("image") and prog != "foldprint":
            fail(f"{s}: {name}'s meta.mainProgram is {prog!r}, not 'foldprint'")
    # Apps start the binary cargo builds.
    for name, prog in outs["apps"][s].items():
        if not prog.endswith("/bin/foldprint"):
            fail(f"{s}: app {name} runs {prog}, not bin/foldprint")
    # Licences as Cargo.toml declares them.
    want_lic = re.search(r'^license = "(.*)"', open("Cargo.toml").read(), re.M).group(1)
    if " OR ".join(load("licenses")[s]) != want_lic:
        fail(f"{s}: foldprint's meta.license {load('licenses')[s]} is not Cargo.toml's {want_lic}")
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
        # The wrapper pins NVRTC's library output (libnvrtc.so lives there).
        used = {o for p, outs_ in graph[pk[name]]["inputDrvs"].items() if "-cuda_nvrtc-" in p for o in outs_}
        if used != {"lib"}:
            fail(f"{s}: {name} uses NVRTC's output(s) {sorted(used)}, not its lib output")
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
        sm = re.findall(r"code=sm_(\d+)", attr(d, "makeFlags"))
        want_sm = [cap.replace(".", "") for cap in c["nccl"]["cudaCapabilities"]]
        if sm != want_sm:
            fail(f"{s}: {name} compiles NCCL for sm_{sm}, the matrix says {want_sm}")
        src = [p for p in d["inputDrvs"] if p.endswith("-source.drv")]
        if len(src) != 1 or graph[src[0]]["outputs"]["out"].get("hash") is None:
            fail(f"{s}: {name}: NCCL source is not one fixed-output fetch")
        # The fetch is the matrix's release (nixpkgs picks the hash by
        # version: overriding `version` alone keeps the old source).
        if graph[src[0]]["outputs"]["out"]["hash"] != sri_to_hex(c["nccl"]["hash"]):
            fail(f"{s}: {name}: NCCL's source is not the matrix's {c['nccl']['version']} (hash differs)")

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
