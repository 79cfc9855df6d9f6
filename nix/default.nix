# Everything the flake exposes for one system. flake.nix only maps these
# into its outputs.
{
  self,
  nixpkgs,
  rust-overlay,
  system,
  matrix,
}:
let
  pkgs = import nixpkgs {
    inherit system;
    overlays = [ rust-overlay.overlays.default ];
    # CUDA is unfree (the CUDA EULA); a flake's `legacyPackages` never allows
    # unfree packages, hence this import.
    config = {
      allowUnfree = true;
      cudaSupport = true;
    };
  };
  inherit (pkgs) lib;

  toolchainFile = lib.importTOML ../rust-toolchain.toml;
  toolchain = pkgs.rust-bin.fromRustupToolchainFile ../rust-toolchain.toml;
  rustPlatform = pkgs.makeRustPlatform {
    cargo = toolchain;
    rustc = toolchain;
  };

  version = (lib.importTOML ../Cargo.toml).package.version;
  gitRev = self.rev or self.dirtyRev or "unknown";
  sources = import ./source.nix { inherit lib; };

  foldprint = pkgs.callPackage ./package.nix {
    inherit rustPlatform version gitRev;
    src = sources.crate;
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

  cudaSetFor =
    combo:
    pkgs.${combo.cudaAttr} or (throw
      "nix/matrix.nix: ${combo.cudaAttr} is not in the pinned nixpkgs (${provenanceCommon.nixpkgs.rev}); remove it from the matrix or move the pin"
    );

  combinations = lib.listToAttrs (
    map (
      combo:
      lib.nameValuePair combo.name (
        pkgs.callPackage ./combination.nix {
          inherit foldprint combo provenanceCommon;
          cudaPackages = cudaSetFor combo;
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
    inherit toolchain foldprint foldprint-cpu combinations;
    inherit (sources) crate experiments;
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

    # As `default`, plus the default combination's pinned NVRTC and NCCL for
    # `cargo run -- ... --backend cuda` (libcuda still comes from the host).
    cuda = pkgs.mkShell {
      packages = [
        toolchain
        pkgs.coreutils
        pkgs.jq
      ];
      shellHook = ''
        export LD_LIBRARY_PATH="${default}/lib/foldprint:${lib.getLib default.nvrtc}/lib:${lib.getLib default.nccl}/lib''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:${pkgs.addDriverRunpath.driverLink}/lib"
        echo "foldprint dev shell: NVRTC/NCCL of ${matrix.default} first on LD_LIBRARY_PATH" >&2
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
