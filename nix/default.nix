# Everything the flake exposes for one system. flake.nix only maps these
# into its outputs.
#
# callPackage passes every formal argument that names a nixpkgs attribute,
# even one with a default, so the files called through it (package.nix,
# combination.nix, cpu.nix, image.nix, gpu-check.nix) declare no defaults,
# and every argument of ours is passed here explicitly.
# ci/nix-eval-check.sh checks this and evaluates every output against
# stand-ins of nixpkgs and rust-overlay.
{
  self,
  nixpkgs,
  rust-overlay,
  system,
  matrix,
}:
let
  inherit (nixpkgs) lib;

  # Unfree packages allowed: those whose every unfree licence is NVIDIA's
  # CUDA EULA (NVRTC, and the CUDA compiler and runtime NCCL is built with).
  # nixpkgs gives the CUDA redistributables `licenses.nvidiaCudaRedist` with
  # a per-package `url`, so the licence is recognised by its name, not by
  # equality. NCCL itself is BSD-3-Clause (free) and needs no exception.
  # Nothing else unfree is admitted: a new unfree dependency fails
  # evaluation instead of being accepted silently.
  cudaLicenseNames = [
    lib.licenses.nvidiaCuda.shortName
    lib.licenses.nvidiaCudaRedist.shortName
  ];
  allowUnfreePredicate =
    pkg:
    lib.all (l: (l.free or true) || lib.elem (l.shortName or "") cudaLicenseNames) (
      lib.toList (pkg.meta.license or [ ])
    );

  importPkgs =
    extraConfig:
    import nixpkgs {
      inherit system;
      overlays = [ rust-overlay.overlays.default ];
      # A flake's `legacyPackages` never allows unfree packages, hence this
      # import.
      # cudaSupport: nixpkgs' CUDA redistributables (NVRTC, and the
      # compiler and runtime NCCL is built with) are `meta.broken`, so
      # refused at evaluation, unless it is set.
      config = {
        inherit allowUnfreePredicate;
        cudaSupport = true;
      }
      // extraConfig;
    };

  # The binary, the wrappers, NVRTC and the tools: nixpkgs' defaults, so the
  # CUDA packages are the ones the CUDA team's cache holds.
  pkgs = importPkgs { };

  # NCCL is compiled from source in any case (the matrix overrides it), so
  # it is compiled only for the runner architectures of nix/matrix.nix: one
  # nixpkgs instance per list of capabilities.
  capsKey = caps: lib.concatStringsSep "," caps;
  ncclCombos = lib.filter (c: c.nccl != null) matrix.combinations;
  pkgsForCaps = lib.listToAttrs (
    map (
      caps:
      lib.nameValuePair (capsKey caps) (importPkgs {
        cudaCapabilities = caps;
      })
    ) (lib.unique (map (c: c.nccl.cudaCapabilities) ncclCombos))
  );

  toolchainFile = lib.importTOML ../rust-toolchain.toml;
  toolchain = pkgs.rust-bin.fromRustupToolchainFile ../rust-toolchain.toml;
  rustPlatform = pkgs.makeRustPlatform {
    cargo = toolchain;
    rustc = toolchain;
  };

  version = (lib.importTOML ../Cargo.toml).package.version;
  # Used by the wrappers and images only (provenance, labels).
  gitRev = self.rev or self.dirtyRev or "unknown";
  sources = import ./source.nix { inherit lib; };

  foldprint = pkgs.callPackage ./package.nix {
    inherit rustPlatform version;
    src = sources.crate;
    mode = "package";
  };

  # What every provenance file says about the build as a whole.
  provenanceCommon = {
    format = "foldprint-provenance";
    format_version = 1;
    inherit system;
    foldprint = {
      inherit version;
      git = gitRev;
      store_path = "${foldprint}";
      rust_toolchain = toolchainFile.toolchain.channel;
    };
    nixpkgs = {
      rev = nixpkgs.rev or "unknown";
      last_modified = nixpkgs.lastModified or 0;
      nar_hash = nixpkgs.narHash or "unknown";
    };
  };

  cudaSet =
    set: combo:
    set.${combo.cudaAttr} or (throw
      "nix/matrix.nix: ${combo.cudaAttr} is not in the pinned nixpkgs (${provenanceCommon.nixpkgs.rev}); remove it from the matrix or move the pin"
    );

  combinations = lib.listToAttrs (
    map (
      combo:
      lib.nameValuePair combo.name (
        pkgs.callPackage ./combination.nix {
          inherit foldprint combo provenanceCommon;
          cudaPackages = cudaSet pkgs combo;
          ncclCudaPackages =
            if combo.nccl == null then null else cudaSet pkgsForCaps.${capsKey combo.nccl.cudaCapabilities} combo;
        }
      )
    ) matrix.combinations
  );

  foldprint-cpu = pkgs.callPackage ./cpu.nix { inherit foldprint provenanceCommon; };
  default = combinations.${matrix.default};

  image =
    tag: package:
    pkgs.callPackage ./image.nix {
      inherit package tag gitRev;
      inherit (sources) experiments;
    };

  app = package: {
    type = "app";
    program = lib.getExe package;
    meta.description = package.meta.description;
  };

  # nix run .#<combination>, .#foldprint-<combination>, .#image-<combination>
  perCombination = lib.concatMapAttrs (name: p: {
    ${name} = p;
    "foldprint-${name}" = p;
    "image-${name}" = image name p;
  }) combinations;
in
{
  packages = perCombination // {
    inherit default foldprint-cpu;
    foldprint-unwrapped = foldprint;
    image = image matrix.default default;
    image-cpu = image "cpu" foldprint-cpu;
  };

  apps = lib.mapAttrs (_: app) combinations // {
    default = app default;
    foldprint-cpu = app foldprint-cpu;
  };

  checks = import ./checks.nix {
    inherit (pkgs) lib runCommand writeText jq;
    inherit
      toolchain
      foldprint
      foldprint-cpu
      combinations
      ;
    inherit (sources) crate experiments;
    testSource = sources.tests;
  };

  gpuChecks = lib.mapAttrs (
    name: package:
    pkgs.callPackage ./gpu-check.nix {
      inherit name package;
      inherit (sources) experiments;
    }
  ) combinations;

  devShells = {
    # The pinned toolchain and the cargo tools; `cargo test --release` as in
    # the README.
    default = pkgs.mkShell {
      packages = [
        toolchain
        pkgs.cargo-nextest
        pkgs.cargo-deny
        pkgs.cargo-audit
        pkgs.coreutils
        pkgs.jq
        pkgs.shellcheck
        pkgs.actionlint
        pkgs.hadolint
      ];
    };

    # As `default`, plus the default combination's pinned NVRTC for
    # `cargo run -- ... --backend cuda` (foldprint finds the host's driver
    # itself; `doctor` shows where).
    cuda = pkgs.mkShell {
      packages = [
        toolchain
        pkgs.coreutils
        pkgs.jq
      ];
      shellHook = ''
        export LD_LIBRARY_PATH="${default}/lib/foldprint''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:${pkgs.addDriverRunpath.driverLink}/lib"
        echo "foldprint dev shell: NVRTC of ${matrix.default} first on LD_LIBRARY_PATH" >&2
      '';
    };

    # What ci/compare-reports.sh needs: the CPU package and jq.
    ci = pkgs.mkShell {
      packages = [
        foldprint-cpu
        pkgs.jq
        pkgs.coreutils
      ];
    };
  };
}
