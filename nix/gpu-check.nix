# The GPU check of one package: verify every experiment against the
# committed goldens on the CUDA backend, and check that the report embeds
# this package's provenance. Kept out of `checks` (exposed as
# `gpuChecks.<system>.<combination>`), because it needs a GPU inside the
# build sandbox: the builder must offer the `cuda` system feature and mount
# the device nodes and driver libraries into such builds (on NixOS:
# `programs.nix-required-mounts.presets.nvidia-gpu.enable = true`).
#
#   nix build .#gpuChecks.x86_64-linux.<combination> -L
#
# The report, the JUnit file and `doctor`'s output are the outputs.
# Called through callPackage: no formal argument has a default.
{
  runCommand,
  jq,
  package,
  experiments,
  name,
}:
runCommand "foldprint-gpu-check-${name}"
  {
    nativeBuildInputs = [
      package
      jq
    ];
    requiredSystemFeatures = [ "cuda" ];
    # Reports carry the host name, time and GPU; nothing to share through a
    # binary cache.
    allowSubstitutes = false;
    preferLocalBuild = true;
  }
  ''
    mkdir -p "$out"
    cp -r ${experiments}/experiments ./experiments
    foldprint doctor | tee "$out/doctor.txt"
    foldprint verify experiments --golden experiments/golden --backend cuda \
      --out "$out/report.json" --junit "$out/report.xml"
    jq -e --arg c "${name}" '.environment.provenance.content.combination == $c' "$out/report.json" >/dev/null \
      || { echo "report does not carry the provenance of ${name}" >&2; exit 1; }
  ''
