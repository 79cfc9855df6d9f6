# One library combination: the foldprint binary (built once, package.nix)
# wrapped so that it loads exactly this combination's NVRTC and NCCL, plus a
# provenance file that every report embeds. Cheap: no compilation here, only
# symlinks, a wrapper and a JSON file (the NCCL it points at is built from
# source once per CUDA set and NCCL release).
#
# Why a directory of unversioned symlinks: cudarc opens libraries by bare
# name (`libnvrtc.so` first, then versioned names; `libnccl.so` and never
# `libnccl.so.2`), and the loader resolves bare names through
# LD_LIBRARY_PATH. The fixup phase shrinks RPATH to DT_NEEDED libraries, so
# dlopen-only directories cannot live in the binary's RPATH; a wrapper is the
# one place that survives.
#
# What is not pinned: libcuda (the driver). It must match the kernel module,
# so it comes from the host: /run/opengl-driver/lib on NixOS (nixpkgs'
# addDriverRunpath convention), or whatever directory the user or the
# container toolkit puts on LD_LIBRARY_PATH elsewhere (docs/NIX.md).
{
  lib,
  runCommand,
  makeBinaryWrapper,
  jq,
  fetchFromGitHub,
  addDriverRunpath,
  foldprint,
  cudaPackages,
  combo,
  provenanceCommon,
}:
let
  # The set's own NCCL, moved to the release the matrix names. nixpkgs picks
  # the source hash by version, so both `version` and `src` are replaced.
  nccl = cudaPackages.nccl.overrideAttrs (_old: {
    version = combo.ncclVersion;
    src = fetchFromGitHub {
      owner = "NVIDIA";
      repo = "nccl";
      tag = "v${combo.ncclVersion}";
      hash = combo.ncclHash;
    };
  });
  nvrtc = cudaPackages.cuda_nvrtc;
  nvrtcLib = lib.getLib nvrtc;
  ncclLib = lib.getLib nccl;
  driverDir = "${addDriverRunpath.driverLink}/lib";
  cudaVersion = cudaPackages.cudaMajorMinorVersion or cudaPackages.cudaVersion or combo.cudaVersion;

  provenance = provenanceCommon // {
    combination = combo.name;
    default = combo.isDefault;
    package = "${placeholder "out"}";
    wrapper = "${placeholder "out"}/bin/foldprint";
    lib_dir = "${placeholder "out"}/lib/foldprint";
    cuda = {
      package_set = combo.cudaAttr;
      version = cudaVersion;
      expected_version = combo.cudaVersion;
    };
    nvrtc = {
      version = nvrtc.version;
      store_path = "${nvrtcLib}";
      # `file` (the library the symlink resolves to) is added at build time.
    };
    nccl = {
      version = nccl.version;
      store_path = "${ncclLib}";
      source = {
        url = "https://github.com/NVIDIA/nccl";
        tag = "v${combo.ncclVersion}";
        hash = combo.ncclHash;
      };
    };
    driver = {
      pinned = false;
      search_path = [ driverDir ];
      note = "libcuda.so.1 is the host's driver library, found through LD_LIBRARY_PATH: the user's entries, then ${driverDir}; the report's environment.backend says which file was loaded";
    };
  };
in
assert lib.assertMsg (cudaVersion == combo.cudaVersion)
  "nix/matrix.nix: ${combo.cudaAttr} is CUDA ${cudaVersion} in this nixpkgs, the matrix says ${combo.cudaVersion}";
runCommand "foldprint-${combo.name}-${foldprint.version}"
  {
    nativeBuildInputs = [
      makeBinaryWrapper
      jq
    ];
    provenance = builtins.toJSON provenance;
    passAsFile = [ "provenance" ];
    passthru = {
      inherit
        foldprint
        nccl
        nvrtc
        cudaPackages
        combo
        ;
    };
    meta = foldprint.meta // {
      description = "foldprint with ${combo.cudaAttr} NVRTC ${nvrtc.version} and NCCL ${nccl.version} pinned";
      mainProgram = "foldprint";
    };
  }
  ''
    # The first of the names that exists: the unversioned name, else the
    # soname (a library's unversioned link often lives in its dev output).
    first() {
      for f in "$@"; do
        if [ -e "$f" ]; then
          echo "$f"
          return 0
        fi
      done
      echo "none of these exist: $*" >&2
      return 1
    }
    nvrtc_file=$(first ${nvrtcLib}/lib/libnvrtc.so ${nvrtcLib}/lib/libnvrtc.so.[0-9]*)
    nccl_file=$(first ${ncclLib}/lib/libnccl.so ${ncclLib}/lib/libnccl.so.[0-9]*)

    mkdir -p "$out/bin" "$out/lib/foldprint" "$out/share/foldprint"
    ln -s "$nvrtc_file" "$out/lib/foldprint/libnvrtc.so"
    ln -s "$nccl_file" "$out/lib/foldprint/libnccl.so"

    jq --sort-keys \
      --arg nvrtc "$(readlink -f "$nvrtc_file")" \
      --arg nccl "$(readlink -f "$nccl_file")" \
      '.nvrtc.file = $nvrtc | .nccl.file = $nccl' \
      "$provenancePath" > "$out/share/foldprint/provenance.json"

    # Pins first (they must win), then the caller's LD_LIBRARY_PATH, then the
    # NixOS driver directory (so a host or container driver directory the
    # caller names is preferred to it).
    makeWrapper ${foldprint}/bin/foldprint "$out/bin/foldprint" \
      --prefix LD_LIBRARY_PATH : "$out/lib/foldprint:${nvrtcLib}/lib:${ncclLib}/lib" \
      --suffix LD_LIBRARY_PATH : "${driverDir}" \
      --set FOLDPRINT_PROVENANCE "$out/share/foldprint/provenance.json"

    # Fail here, not on a GPU runner, if a pin does not resolve.
    for l in libnvrtc.so libnccl.so; do
      [ -e "$out/lib/foldprint/$l" ] || { echo "$l does not resolve" >&2; exit 1; }
    done
  ''
