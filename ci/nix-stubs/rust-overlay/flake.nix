# Stand-in for oxalica/rust-overlay (ci/nix-eval-check.sh): the overlay's
# `rust-bin.fromRustupToolchainFile` and `rust-bin.stable.<version>.default`,
# for the releases the pinned overlay holds (1.29.0 to 1.98.0). The real
# overlay reads the same file: channel, components, targets.
{
  description = "stand-in rust-overlay for evaluating foldprint's flake offline";
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable-small";
  outputs =
    { self, nixpkgs }:
    {
      overlays.default =
        final: prev:
        let
          known =
            v:
            builtins.compareVersions v "1.29.0" >= 0 && builtins.compareVersions v "1.98.0" <= 0
            && builtins.match "[0-9]+\\.[0-9]+\\.[0-9]+" v != null;
          toolchain =
            {
              channel,
              components ? [ ],
              targets ? [ ],
              profile ? "default",
            }:
            if !known channel then
              throw "stand-in rust-overlay: no stable release ${channel} in the pinned overlay"
            else
              final.stdenv.mkDerivation {
                pname = "rust-${profile}";
                version = channel;
                inherit components targets;
                meta.mainProgram = "cargo";
              };
        in
        {
          rust-bin = {
            fromRustupToolchainFile =
              file:
              let
                t = (builtins.fromTOML (builtins.readFile file)).toolchain;
              in
              toolchain (
                builtins.intersectAttrs {
                  channel = null;
                  components = null;
                  targets = null;
                  profile = null;
                } t
              );
            stable = builtins.listToAttrs (
              map
                (v: {
                  name = v;
                  value.default = toolchain { channel = v; };
                })
                [
                  "1.95.0"
                ]
            );
          };
        };
    };
}
