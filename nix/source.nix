# Source trees the derivations see, as file sets, so that editing the
# packaging (flake, nix/, ci/, containers/, .ci/) does not rebuild and
# retest the binary. (A flake sees only files git tracks; target/ is listed
# for evaluations of the working tree outside a flake, where it is visible.)
{ lib }:
let
  fs = lib.fileset;
  root = ../.;
  packaging = fs.unions [
    ../flake.nix
    ../flake.lock
    ../nix
    (fs.maybeMissing ../ci)
    (fs.maybeMissing ../containers)
    (fs.maybeMissing ../.ci)
    (fs.maybeMissing ../.github)
    (fs.maybeMissing ../target)
  ];
in
{
  # Everything cargo needs: Cargo.toml/lock, src/, tests/, examples/,
  # experiments/ (the CLI tests read them), rust-toolchain.toml.
  crate = fs.toSource {
    inherit root;
    fileset = fs.difference root packaging;
  };

  # The experiment files and their committed goldens, for the runtime checks
  # and the images.
  experiments = fs.toSource {
    inherit root;
    fileset = ../experiments;
  };
}
