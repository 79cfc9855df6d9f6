# One library combination: the foldprint binary (built once, package.nix)
# wrapped so that it loads exactly this combination's NVRTC (and NCCL, in an
# NCCL combination), plus a provenance file that every report embeds.
# Cheap: no compilation here, only symlinks, a wrapper and a JSON file.
#
# A CUDA-only combination (`combo.nccl == null`) uses nixpkgs' packages as
# they are, so the binary cache has all of them. An NCCL combination adds
# the set's NCCL moved to the release the matrix names, from a nixpkgs
# instance whose `cudaCapabilities` are the CI runners' (nix/default.nix):
# that build is the long one, and only these combinations have it.
#
# Why a directory of unversioned symlinks: cudarc opens libraries by bare
# name (`libnvrtc.so` first, then versioned names; `libnccl.so` and never
# `libnccl.so.2`), and the loader resolves bare names through
# LD_LIBRARY_PATH. The fixup phase shrinks RPATH to DT_NEEDED libraries, so
# dlopen-only directories cannot live in the binary's RPATH; a wrapper is the
# one place that survives.
#
# What is not pinned: libcuda and the driver's other libraries. They must
# match the kernel module, so they come from the host: foldprint looks for
# them itself (src/gpu/host_driver.rs: LD_LIBRARY_PATH, then
# /run/opengl-driver/lib, the loader cache and the usual directories,
# loading only the driver's own files), and `doctor` lists what it found.
#
# Called through callPackage: no formal argument has a default (see
# package.nix); everything not from nixpkgs is passed by nix/default.nix.
{
  lib,
  runCommand,
  makeBinaryWrapper,
  jq,
  fetchFromGitHub,
  addDriverRunpath,
  foldprint,
  cudaPackages,
  ncclCudaPackages,
  combo,
  provenanceCommon,
}:
let
  hasNccl = combo.nccl != null;
  # The set's own NCCL, moved to the release the matrix names. nixpkgs picks
  # the source hash by version, so both `version` and `src` are replaced.
  nccl =
    if hasNccl then
      ncclCudaPackages.nccl.overrideAttrs (_old: {
        version = combo.nccl.version;
        src = fetchFromGitHub {
          owner = "NVIDIA";
          repo = "nccl";
          tag = "v${combo.nccl.version}";
          hash = combo.nccl.hash;
        };
      })
    else
      null;
  nvrtc = cudaPackages.cuda_nvrtc;
  nvrtcLib = lib.getLib nvrtc;
  ncclLib = lib.getLib nccl;
  driverDir = "${addDriverRunpath.driverLink}/lib";
  cudaVersion = cudaPackages.cudaMajorMinorVersion or cudaPackages.cudaVersion or combo.cudaVersion;
  pinnedDirs = [ "$out/lib/foldprint" "${nvrtcLib}/lib" ] ++ lib.optional hasNccl "${ncclLib}/lib";

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
    nccl =
      if hasNccl then
        {
          version = nccl.version;
          store_path = "${ncclLib}";
          cuda_capabilities = combo.nccl.cudaCapabilities;
          source = {
            url = "https://github.com/NVIDIA/nccl";
            tag = "v${combo.nccl.version}";
            hash = combo.nccl.hash;
          };
        }
      else
        null;
    driver = {
      pinned = false;
      nixos_dir = driverDir;
      note = "the driver's libraries come from the host; foldprint finds them at run time and loads only those files (environment.host_driver in a report, and `foldprint doctor`, say which)";
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
      description =
        "foldprint with ${combo.cudaAttr} NVRTC ${nvrtc.version}"
        + (if hasNccl then " and NCCL ${nccl.version}" else "")
        + " pinned";
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
    mkdir -p "$out/bin" "$out/lib/foldprint" "$out/share/foldprint"
    ln -s "$nvrtc_file" "$out/lib/foldprint/libnvrtc.so"
    ${
      if hasNccl then
        ''
          nccl_file=$(first ${ncclLib}/lib/libnccl.so ${ncclLib}/lib/libnccl.so.[0-9]*)
          ln -s "$nccl_file" "$out/lib/foldprint/libnccl.so"
          nccl_real=$(readlink -f "$nccl_file")
        ''
      else
        ''
          nccl_real=
        ''
    }
    jq --sort-keys \
      --arg nvrtc "$(readlink -f "$nvrtc_file")" \
      --arg nccl "$nccl_real" \
      '.nvrtc.file = $nvrtc | if .nccl != null then .nccl.file = $nccl else . end' \
      "$provenancePath" > "$out/share/foldprint/provenance.json"

    # Pins first (they must win), then the caller's LD_LIBRARY_PATH, then the
    # NixOS driver directory (so a host or container driver directory the
    # caller names is preferred to it). Elsewhere foldprint finds the
    # driver's own files itself (doctor lists them).
    makeWrapper ${foldprint}/bin/foldprint "$out/bin/foldprint" \
      --prefix LD_LIBRARY_PATH : "${lib.concatStringsSep ":" pinnedDirs}" \
      --suffix LD_LIBRARY_PATH : "${driverDir}" \
      --set FOLDPRINT_PROVENANCE "$out/share/foldprint/provenance.json"

    # Fail here, not on a GPU runner, if a pin does not resolve.
    for l in libnvrtc.so ${lib.optionalString hasNccl "libnccl.so"}; do
      [ -e "$out/lib/foldprint/$l" ] || { echo "$l does not resolve" >&2; exit 1; }
    done
  ''
