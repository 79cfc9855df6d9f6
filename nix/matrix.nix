# The library matrix: which CUDA package sets and which NCCL releases
# foldprint is packaged against, as plain data.
#
# This file must stay evaluable on its own, offline and without nixpkgs:
#
#   nix-instantiate --eval --strict --json nix/matrix.nix
#   nix eval --offline --json --file nix/matrix.nix names
#
# so it uses builtins only. flake.nix turns every entry of `combinations`
# into a package `foldprint-<name>` (also reachable as `.#<name>`), an OCI
# image `image-<name>` and a GPU check `gpuChecks.<system>.<name>`.
# docs/NIX.md explains how to add a CUDA set or an NCCL release.
#
# Two kinds of combination:
# - `cuda<set>` (CUDA only): the binary with the set's NVRTC. Every package
#   it needs is nixpkgs' own, so the CUDA team's binary cache has them; no
#   NCCL is in its closure. The default (`nix run .`) is one of these.
# - `cuda<set>-nccl<release>`: as above plus an NCCL release built from
#   NVIDIA's source for the GPU architectures of the CI runners only
#   (`runners` below). Nothing caches these builds: the first one on a
#   machine compiles NCCL.
let
  # CUDA package sets of the pinned nixpkgs, by attribute name. `version` is
  # what the set is expected to be; the provenance file records what the set
  # itself says, so a mismatch shows in every report. `newestCapability`:
  # the newest GPU architecture the set's nvcc compiles for (CUDA 12.8 added
  # sm_100 and sm_120); NCCL is built only for runner architectures up to it.
  cuda = {
    "12_6" = {
      attr = "cudaPackages_12_6";
      version = "12.6";
      newestCapability = "9.0";
    };
    "12_8" = {
      attr = "cudaPackages_12_8";
      version = "12.8";
      newestCapability = "12.0";
    };
    "12_9" = {
      attr = "cudaPackages_12_9";
      version = "12.9";
      newestCapability = "12.1";
    };
  };

  # nixpkgs' `lib.fakeHash`, spelled out because this file cannot import
  # nixpkgs. Adding an NCCL release without its hash: put `hash = fakeHash;`,
  # build the combination, and take the real hash from the mismatch error
  # (docs/NIX.md). It passes the SRI check below on purpose; .ci/run refuses
  # to let it be committed.
  fakeHash = "sha256-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";

  # NCCL releases, built from source against each CUDA set by overriding
  # both `version` and `src` of the set's own `nccl` (nixpkgs looks its
  # hash up by version, so overriding one without the other fails).
  # Hashes: the NAR hash of the tagged tree, as `fetchFromGitHub { owner =
  # "NVIDIA"; repo = "nccl"; tag = "v<version>"; }` checks it; recomputed
  # from the repository with `nix hash path` over `git archive v<version>`.
  # Releases before 2.27.3-1 need an extra patch in some nixpkgs revisions
  # (the hard-coded -std=c++11); keep to 2.27.3-1 and later here.
  nccl = {
    "2_27_7" = {
      version = "2.27.7-1";
      released = "2025-07-24";
      hash = "sha256-mlZhcan/KqfFrpoHnesW1HEA7b0Uxg3PBkRyFlsk/ps=";
    };
    "2_28_9" = {
      version = "2.28.9-1";
      released = "2025-11-10";
      hash = "sha256-1nNLcS/F0HsGbYf327TLX+ZVI13YcrrhpLqbGVuml2g=";
    };
  };

  # The self-hosted GPU runner labels .github/workflows/gpu.yml runs on by default,
  # and each one's compute capability. NCCL combinations are compiled for
  # exactly these capabilities (those the CUDA set supports), plus PTX of the
  # newest for forward compatibility (nixpkgs' `cudaForwardCompat`).
  runners = {
    t4 = "7.5";
    a100 = "8.0";
    h100 = "9.0";
    h200 = "9.0";
    b200 = "10.0";
  };

  # Pairs of the product to leave out, e.g. [ { cuda = "12_6"; nccl = "2_27_7"; } ].
  exclude = [ ];

  # The combination `packages.default`, `apps.default` and `image` use:
  # the newest CUDA set, CUDA only (nothing to compile but foldprint).
  default = "cuda12_9";

  nameOf = c: n: if n == null then "cuda${c}" else "cuda${c}-nccl${n}";

  excluded = c: n: builtins.any (e: e.cuda == c && e.nccl == n) exclude;

  # Ascending, without repeats: the capabilities of the runner labels.
  runnerCapabilities = builtins.sort (a: b: builtins.compareVersions a b < 0) (
    builtins.foldl' (acc: c: if builtins.elem c acc then acc else acc ++ [ c ]) [ ] (
      builtins.attrValues runners
    )
  );

  capabilitiesFor =
    c:
    builtins.filter (
      cap: builtins.compareVersions cap cuda.${c}.newestCapability <= 0
    ) runnerCapabilities;

  combination = c: n: {
    name = nameOf c n;
    cudaKey = c;
    cudaAttr = cuda.${c}.attr;
    cudaVersion = cuda.${c}.version;
    isDefault = nameOf c n == default;
    # null for a CUDA-only combination.
    nccl =
      if n == null then
        null
      else
        {
          key = n;
          inherit (nccl.${n}) version hash;
          cudaCapabilities = capabilitiesFor c;
        };
  };

  combinations = builtins.concatMap (
    c:
    [ (combination c null) ]
    ++ builtins.concatMap (n: if excluded c n then [ ] else [ (combination c n) ]) (
      builtins.attrNames nccl
    )
  ) (builtins.attrNames cuda);

  names = map (x: x.name) combinations;

  byName = builtins.listToAttrs (
    map (x: {
      inherit (x) name;
      value = x;
    }) combinations
  );

  # What .github/workflows/gpu.yml runs on every GPU runner label (all of them
  # unless trimmed here).
  ci = names;

  isSri = h: builtins.match "sha256-[A-Za-z0-9+/]{43}=" h != null;
  isNcclVersion = v: builtins.match "[0-9]+\\.[0-9]+\\.[0-9]+-[0-9]+" v != null;
  isCapability = v: builtins.match "[0-9]+\\.[0-9]+" v != null;

  problems =
    (if builtins.elem default names then [ ] else [ "default `${default}` is not a combination" ])
    ++ (if builtins.all (n: builtins.elem n names) ci then [ ] else [ "ci lists an unknown combination" ])
    ++ builtins.concatMap (
      k:
      let
        r = nccl.${k};
      in
      (if isSri r.hash then [ ] else [ "nccl ${k}: hash is not an SRI sha256 (use fakeHash to learn it)" ])
      ++ (if isNcclVersion r.version then [ ] else [ "nccl ${k}: bad version `${r.version}`" ])
      ++ (
        if builtins.replaceStrings [ "." ] [ "_" ] (builtins.head (builtins.split "-" r.version)) == k then
          [ ]
        else
          [ "nccl ${k}: key does not match version ${r.version}" ]
      )
    ) (builtins.attrNames nccl)
    ++ builtins.concatMap (
      k:
      (
        if builtins.replaceStrings [ "." ] [ "_" ] cuda.${k}.version == k then
          [ ]
        else
          [ "cuda ${k}: key does not match version ${cuda.${k}.version}" ]
      )
      ++ (
        if capabilitiesFor k != [ ] then
          [ ]
        else
          [ "cuda ${k}: no runner capability is at most ${cuda.${k}.newestCapability}" ]
      )
    ) (builtins.attrNames cuda)
    ++ builtins.concatMap (
      r: if isCapability runners.${r} then [ ] else [ "runner ${r}: bad capability `${runners.${r}}`" ]
    ) (builtins.attrNames runners)
    ++ builtins.concatMap (
      e:
      if cuda ? ${e.cuda} && nccl ? ${e.nccl} then
        [ ]
      else
        [ "exclude names an unknown pair ${e.cuda}/${e.nccl}" ]
    ) exclude;
in
if problems != [ ] then
  throw ("nix/matrix.nix: " + builtins.concatStringsSep "; " problems)
else
  {
    inherit
      cuda
      nccl
      runners
      exclude
      default
      combinations
      names
      fakeHash
      runnerCapabilities
      ;
    inherit byName ci;
    # `ci` with what each GPU job runs: an NCCL combination also runs the
    # NCCL backend.
    ciJobs = map (n: {
      name = n;
      nccl = byName.${n}.nccl != null;
    }) ci;
    runnerLabels = builtins.attrNames runners;
  }
