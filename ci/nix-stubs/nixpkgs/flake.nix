# Stand-in for the nixpkgs flake (ci/nix-eval-check.sh): `lib`, and
# `import <this> { system; overlays; config; }` through default.nix.
{
  description = "stand-in nixpkgs for evaluating foldprint's flake offline";
  outputs =
    { self }:
    {
      lib = import ./lib.nix;
    };
}
