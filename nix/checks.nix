# CPU checks: what `nix flake check` builds. No GPU, no CUDA build (the
# combinations are only evaluated here; building their NCCL is the GPU
# jobs' business). Imported with explicit arguments, not callPackage.
{
  lib,
  runCommand,
  writeText,
  jq,
  toolchain,
  foldprint,
  foldprint-cpu,
  combinations,
  crate,
  testSource,
  experiments,
}:
{
  # The test suite, less nix/sandbox-skips.txt (package.nix says why it is
  # not in the package's own build).
  tests = foldprint.override {
    mode = "tests";
    src = testSource;
  };

  # clippy with the vendored dependencies, as in .ci/run.
  clippy = foldprint.override { mode = "clippy"; };

  # rustfmt only reads sources; no dependencies needed.
  fmt = runCommand "foldprint-fmt" { nativeBuildInputs = [ toolchain ]; } ''
    export HOME="$TMPDIR"
    cp -r ${crate} crate
    chmod -R u+w crate
    cd crate
    cargo fmt --all -- --check
    touch "$out"
  '';

  # Every combination evaluates to a derivation (without building it): a CUDA
  # set missing from the pinned nixpkgs or a broken override fails here.
  combinations = writeText "foldprint-combinations.json" (
    builtins.toJSON (
      lib.mapAttrs (_: p: builtins.unsafeDiscardStringContext p.drvPath) combinations
    )
  );

  # The CPU package end to end: the README's main job, the goldens, the
  # provenance a report embeds, and `compare` between two reports.
  cpu-smoke = runCommand "foldprint-cpu-smoke" {
    nativeBuildInputs = [
      foldprint-cpu
      jq
    ];
  } ''
    cp -r ${experiments}/experiments ./experiments
    foldprint run experiments/smoke.toml --backend cpu --out smoke.json
    foldprint verify experiments --golden experiments/golden --backend cpu \
      --out verify.json --junit verify.xml
    jq -e '.environment.provenance.content.combination == "cpu"' verify.json
    foldprint compare --allow-missing verify.json smoke.json
    mkdir -p "$out"
    cp smoke.json verify.json verify.xml "$out/"
  '';
}
