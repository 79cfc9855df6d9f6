# The foldprint binary, built once for every library combination.
#
# No CUDA at build time: cudarc is built with `dynamic-loading`, so the binary
# dlopens libcuda, libnvrtc and libnccl when a CUDA backend starts. Which
# NVRTC and NCCL it finds is decided by the thin wrappers in combination.nix.
# Nothing here depends on the git revision: provenance (revision, store
# paths, pins) lives in the wrappers, so a commit that changes only the
# packaging or the documents leaves this derivation, and its test run, alone.
#
# `lintOnly = true` turns the same derivation (same vendored dependencies)
# into the lint check: it runs clippy like .ci/run does and installs nothing.
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
  src,
  version,
  lintOnly,
}:
rustPlatform.buildRustPackage (
  {
    pname = if lintOnly then "foldprint-clippy" else "foldprint";
    inherit version src;

    cargoLock.lockFile = ../Cargo.lock;

    # The CPU test suite runs in the build (`cargo test --release`); the CLI
    # tests check dumps with `sha256sum -c`. tests/gpu.rs needs the
    # `gpu-tests` feature and a GPU: it is not built here.
    nativeCheckInputs = [ coreutils ];

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
  // lib.optionalAttrs lintOnly {
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
