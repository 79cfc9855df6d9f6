# `foldprint-cpu`: the same binary with no CUDA library pinned, for the CPU
# oracle (comparisons, goldens, CI's reference report). It still writes a
# provenance file, so a report says it came from this package. `--backend
# auto` finds no pinned NVRTC here and runs the CPU oracle unless the
# caller's LD_LIBRARY_PATH provides CUDA libraries.
# Called through callPackage: no formal argument has a default.
{
  runCommand,
  makeBinaryWrapper,
  foldprint,
  provenanceCommon,
}:
let
  provenance = provenanceCommon // {
    combination = "cpu";
    default = false;
    package = "${placeholder "out"}";
    wrapper = "${placeholder "out"}/bin/foldprint";
    cuda = null;
    nvrtc = null;
    nccl = null;
    driver = {
      pinned = false;
      note = "no CUDA library is pinned by this package";
    };
  };
in
runCommand "foldprint-cpu-${foldprint.version}"
  {
    nativeBuildInputs = [ makeBinaryWrapper ];
    provenance = builtins.toJSON provenance;
    passAsFile = [ "provenance" ];
    passthru = { inherit foldprint; };
    meta = foldprint.meta // {
      description = "foldprint without CUDA libraries (the CPU oracle)";
      mainProgram = "foldprint";
    };
  }
  ''
    mkdir -p "$out/bin" "$out/share/foldprint"
    cp "$provenancePath" "$out/share/foldprint/provenance.json"
    makeWrapper ${foldprint}/bin/foldprint "$out/bin/foldprint" \
      --set FOLDPRINT_PROVENANCE "$out/share/foldprint/provenance.json"
  ''
