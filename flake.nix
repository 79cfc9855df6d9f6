{
  description = "foldprint: bitwise-reproducible fixed-order float32 reduction, packaged per CUDA/NCCL combination";

  # The nixpkgs CUDA team's binary cache: CUDA redistributables and the
  # nixpkgs-default builds of CUDA packages come from here, which is all a
  # CUDA-only combination (the default) needs. (The NCCL releases
  # nix/matrix.nix selects are built from source, for the CI runners'
  # architectures only.)
  nixConfig = {
    extra-substituters = [ "https://cache.nixos-cuda.org" ];
    extra-trusted-public-keys = [
      "cache.nixos-cuda.org:74DUi4Ye579gUqzH4ziL9IyiJBlDpMRn9MBN8oNan9M="
    ];
  };

  inputs = {
    # Locked (flake.lock) to the revision the CUDA team's own Hydra jobset
    # builds. Evaluating it needs Nix >= 2.18.
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable-small";
    rust-overlay = {
      url = "github:oxalica/rust-overlay";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      rust-overlay,
    }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      # CUDA sets x NCCL releases, as plain data (evaluable without nixpkgs).
      matrix = import ./nix/matrix.nix;
      bySystem = lib.genAttrs systems (
        system:
        import ./nix {
          inherit
            self
            nixpkgs
            rust-overlay
            system
            matrix
            ;
        }
      );
      output = name: lib.mapAttrs (_: s: s.${name}) bySystem;
    in
    {
      # default = the newest CUDA set, CUDA only (nix/matrix.nix `default`);
      # <combination>, foldprint-<combination>, image-<combination>,
      # foldprint-cpu, foldprint-unwrapped, image, image-cpu.
      packages = output "packages";
      apps = output "apps";
      devShells = output "devShells";

      # CPU only: tests, clippy, fmt, every combination evaluates, CPU smoke.
      checks = output "checks";

      # Need a GPU in the build sandbox (requiredSystemFeatures = [ "cuda" ]),
      # so they are not in `checks`: nix build .#gpuChecks.<system>.<combination>
      gpuChecks = output "gpuChecks";

      # The matrix itself, e.g. for CI: nix eval --json .#lib.matrix.ci
      lib = { inherit matrix; };
    };
}
