# An OCI image of one package (a combination, or foldprint-cpu), streamed:
#
#   nix build .#image-<combination> && ./result | docker load
#
# The image holds the Nix closure only: no libcuda. The NVIDIA container
# toolkit injects the host's driver libraries at `docker run --gpus all`
# (or CDI `--device nvidia.com/gpu=all`) time, and Nix's glibc ignores
# /etc/ld.so.cache, so the image lists on LD_LIBRARY_PATH the directories
# the toolkit is known to inject into. The wrapper still puts the pinned
# NVRTC/NCCL first (combination.nix).
#
# Called through callPackage: no formal argument has a default (see
# package.nix).
{
  lib,
  stdenv,
  dockerTools,
  writeTextDir,
  runCommand,
  package,
  experiments,
  tag,
  gitRev,
}:
let
  uid = "10001";
  # The licence label: foldprint's own, and the licences of the libraries
  # the package pins, as their nixpkgs `meta.license` says (SPDX ids where
  # they have one; NVIDIA's CUDA EULA has none, hence a LicenseRef). The
  # rest of the closure (glibc and the like) keeps its own licences.
  pinned = lib.filter (p: p != null) [
    (package.passthru.nvrtc or null)
    (package.passthru.nccl or null)
  ];
  spdx =
    l:
    l.spdxId
      or ("LicenseRef-" + lib.replaceStrings [ " " "(" ")" ] [ "-" "" "" ] (l.shortName or "unknown"));
  licenseLabel = lib.concatStringsSep " AND " (
    [ "(MIT OR Apache-2.0)" ]
    ++ lib.unique (map spdx (lib.concatMap (p: lib.toList (p.meta.license or [ ])) pinned))
  );
  # Debian's multiarch directory name: x86_64-linux-gnu, aarch64-linux-gnu.
  multiarch = "${stdenv.hostPlatform.parsed.cpu.name}-linux-gnu";
  driverDirs = [
    "/usr/lib/${multiarch}" # toolkit on Debian/Ubuntu hosts, and CDI specs generated there
    "/usr/lib64" # toolkit on RPM-based hosts, and its default for unknown rootfs layouts
    "/usr/local/nvidia/lib64" # GKE and other managed node images
    "/run/opengl-driver/lib" # NixOS hosts passing their driver directory through
  ];
  etc = [
    (writeTextDir "etc/passwd" ''
      root:x:0:0:root:/root:/noshell
      foldprint:x:${uid}:${uid}:foldprint:/work:/noshell
    '')
    (writeTextDir "etc/group" ''
      root:x:0:
      foldprint:x:${uid}:
    '')
  ];
  # /share/foldprint/experiments: the committed experiments and goldens, so
  # `verify /share/foldprint/experiments --golden /share/foldprint/experiments/golden`
  # works without mounting a checkout.
  experimentsDir = runCommand "foldprint-experiments" { } ''
    mkdir -p "$out/share/foldprint"
    cp -r ${experiments}/experiments "$out/share/foldprint/experiments"
  '';
in
dockerTools.streamLayeredImage {
  name = "foldprint";
  inherit tag;
  contents = [
    package
    experimentsDir
  ]
  ++ etc;
  fakeRootCommands = ''
    mkdir -p ./work ./tmp
    chmod 1777 ./tmp
    chown ${uid}:${uid} ./work
  '';
  config = {
    Entrypoint = [ "${package}/bin/foldprint" ];
    Cmd = [ "doctor" ];
    User = "${uid}:${uid}";
    WorkingDir = "/work";
    Env = [
      "HOME=/work"
      "NVIDIA_VISIBLE_DEVICES=all"
      "NVIDIA_DRIVER_CAPABILITIES=compute,utility"
      "LD_LIBRARY_PATH=${lib.concatStringsSep ":" driverDirs}"
    ];
    Labels = {
      "org.opencontainers.image.title" = "foldprint";
      "org.opencontainers.image.description" = package.meta.description;
      "org.opencontainers.image.version" = package.passthru.foldprint.version;
      "org.opencontainers.image.revision" = gitRev;
      "org.opencontainers.image.licenses" = licenseLabel;
    };
  };
}
