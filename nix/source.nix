# Source trees the derivations see, as file sets. The crate is an allowlist
# of what cargo reads, so that editing the packaging (flake, nix/, ci/,
# containers/, .ci/) or the documents (README, docs/) does not rebuild and
# retest the binary.
{ lib }:
let
  fs = lib.fileset;
  root = ../.;
in
{
  # Everything `cargo build` and `cargo test` read: the manifest and lock,
  # the toolchain file, src/, tests/ (with tests/data), examples/, and the
  # files the tests load (experiments/ and audits/).
  crate = fs.toSource {
    inherit root;
    fileset = fs.unions [
      ../Cargo.toml
      ../Cargo.lock
      ../rust-toolchain.toml
      ../src
      ../tests
      ../examples
      ../experiments
      ../audits
    ];
  };

  # The experiment files and their committed goldens, for the runtime checks
  # and the images.
  experiments = fs.toSource {
    inherit root;
    fileset = ../experiments;
  };
}
