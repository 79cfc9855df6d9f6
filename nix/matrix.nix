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
let
  # CUDA package sets of the pinned nixpkgs, by attribute name. `version` is
  # what the set is expected to be; the provenance file records what the set
  # itself says, so a mismatch shows in every report.
  cuda = {
    "12_6" = {
      attr = "cudaPackages_12_6";
      version = "12.6";
    };
    "12_8" = {
      attr = "cudaPackages_12_8";
      version = "12.8";
    };
    "12_9" = {
      attr = "cudaPackages_12_9";
      version = "12.9";
    };
  };

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

  # Pairs of the product to leave out, e.g. [ { cuda = "12_6"; nccl = "2_27_7"; } ].
  exclude = [ ];

  # The combination `packages.default`, `apps.default` and `image` use:
  # the newest CUDA set with the newest NCCL.
  default = "cuda12_9-nccl2_28_9";

  nameOf = c: n: "cuda${c}-nccl${n}";

  excluded = c: n: builtins.any (e: e.cuda == c && e.nccl == n) exclude;

  combinations = builtins.concatMap (
    c:
    builtins.concatMap (
      n:
      if excluded c n then
        [ ]
      else
        [
          {
            name = nameOf c n;
            cudaKey = c;
            cudaAttr = cuda.${c}.attr;
            cudaVersion = cuda.${c}.version;
            ncclKey = n;
            ncclVersion = nccl.${n}.version;
            ncclHash = nccl.${n}.hash;
            isDefault = nameOf c n == default;
          }
        ]
    ) (builtins.attrNames nccl)
  ) (builtins.attrNames cuda);

  names = map (x: x.name) combinations;

  isSri = h: builtins.match "sha256-[A-Za-z0-9+/]{43}=" h != null;
  isNcclVersion = v: builtins.match "[0-9]+\\.[0-9]+\\.[0-9]+-[0-9]+" v != null;

  problems =
    (if builtins.elem default names then [ ] else [ "default `${default}` is not a combination" ])
    ++ builtins.concatMap (
      k:
      let
        r = nccl.${k};
      in
      (if isSri r.hash then [ ] else [ "nccl ${k}: hash is not an SRI sha256" ])
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
      if builtins.replaceStrings [ "." ] [ "_" ] cuda.${k}.version == k then
        [ ]
      else
        [ "cuda ${k}: key does not match version ${cuda.${k}.version}" ]
    ) (builtins.attrNames cuda)
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
      exclude
      default
      combinations
      names
      ;
    byName = builtins.listToAttrs (
      map (x: {
        inherit (x) name;
        value = x;
      }) combinations
    );
    # What ci/workflows/gpu.yml runs on every GPU runner label (all of them
    # unless trimmed here).
    ci = names;
  }
