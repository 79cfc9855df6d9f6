# The foldprint binary, built once for every library combination.
#
# No CUDA at build time: cudarc is built with `dynamic-loading`, so the binary
# dlopens libcuda, libnvrtc and libnccl when a CUDA backend starts. Which
# NVRTC and NCCL it finds is decided by the thin wrappers in combination.nix.
# Nothing here depends on the git revision: provenance (revision, store
# paths, pins) lives in the wrappers, so a commit that changes only the
# packaging or the documents leaves this derivation, and its test run, alone.
#
# `mode` picks one of three derivations sharing the vendored dependencies:
# - "package": what users run. It does not run the test suite: several
#   tests need what no build sandbox has (a git checkout, the host's loader
#   cache), and a package that cannot build stops every `nix run`. This is
#   the split crane popularised and nixpkgs uses where a suite needs more
#   than the sandbox: the suite runs in its own derivation, so a failing or
#   sandbox-bound test never blocks the package, and `nix flake check`
#   still fails on it.
# - "tests": `checks.<system>.tests`, `cargo test --release` with the
#   skips of nix/sandbox-skips.txt (the same list ci/nix-sandbox-build.sh
#   uses) over a source that also holds the README and docs/audit.
# - "clippy": the lint check, as .ci/run runs it; installs nothing.
#
# Called through callPackage, which passes EVERY formal argument that names
# a nixpkgs attribute, defaults included (`clippy ? false` received nixpkgs'
# clippy package). So no formal here has a default, and every argument that
# is not a package is passed explicitly by nix/default.nix;
# ci/nix-eval-check.sh enforces both.
{
  lib,
  rustPlatform,
  coreutils,
  python3,
  src,
  version,
  mode,
}:
let
  # Comment lines (#) and blank lines aside, one test name a line.
  skips = builtins.filter (l: builtins.isString l && l != "" && builtins.substring 0 1 l != "#") (
    builtins.split "\n" (builtins.readFile ./sandbox-skips.txt)
  );
in
assert lib.assertMsg (builtins.elem mode [
  "package"
  "tests"
  "clippy"
]) "nix/package.nix: unknown mode ${mode}";
rustPlatform.buildRustPackage (
  {
    pname =
      {
        package = "foldprint";
        tests = "foldprint-tests";
        clippy = "foldprint-clippy";
      }
      .${mode};
    inherit version src;

    cargoLock.lockFile = ../Cargo.lock;

    doCheck = mode == "tests";
    # The CLI tests check dumps with `sha256sum -c`; tests/cli/progress.rs draws
    # the progress line under a pseudo-terminal from python3. tests/gpu.rs
    # needs the `gpu-tests` feature and a GPU: it is not built here.
    nativeCheckInputs = [
      coreutils
      python3
    ];
    checkFlags = map (t: "--skip=${t}") skips ++ [ "--exact" ];

    meta = {
      description = "Bitwise-reproducible fixed-order float32 reduction harness with SHA-256 digests";
      license = with lib.licenses; [
        mit
        asl20
      ];
      mainProgram = "foldprint";
      platforms = lib.platforms.linux;
    };
  }
  // lib.optionalAttrs (mode == "clippy") {
    # cargo-auditable wraps cargo and sets RUSTC_WORKSPACE_WRAPPER, which is
    # how clippy hooks in as well; lints need no audit data.
    auditable = false;
    buildPhase = ''
      runHook preBuild
      cargo clippy --frozen --all-targets -- -D warnings
      cargo clippy --frozen --all-targets --features gpu-tests -- -D warnings
      runHook postBuild
    '';
    doCheck = false;
    installPhase = ''
      runHook preInstall
      touch "$out"
      runHook postInstall
    '';
    dontFixup = true;
  }
)
