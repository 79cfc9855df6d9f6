# Source trees the derivations see, as file sets. The crate is an allowlist
# of what cargo reads, so that editing the packaging (flake, nix/, ci/,
# containers/, .ci/) or the documents (README, docs/) does not rebuild the
# binary; only the README and docs/audit rerun `checks.tests`.
{ lib }:
let
  fs = lib.fileset;
  root = ../.;
  # Everything `cargo build` and `cargo test` read: the manifest and lock,
  # the toolchain file, build.rs (it finds no git in a build sandbox, so the
  # binary says `unknown` and the wrappers carry the revision), src/, tests/
  # (with tests/data), examples/, and the files the tests load
  # (experiments/ and audits/).
  crateFiles = fs.unions [
    ../Cargo.toml
    ../Cargo.lock
    ../rust-toolchain.toml
    ../build.rs
    ../src
    ../tests
    ../examples
    ../experiments
    ../audits
  ];
in
{
  crate = fs.toSource {
    inherit root;
    fileset = crateFiles;
  };

  # What the test suite reads beyond the crate: the README (its examples and
  # exit codes are checked against the code) and docs/audit (a recorded
  # audit the environment parser is tested on). Only `checks.tests` sees
  # these, so editing the documents reruns the tests but does not rebuild
  # the package users run.
  tests = fs.toSource {
    inherit root;
    fileset = fs.unions [
      crateFiles
      ../README.md
      ../docs/audit
    ];
  };

  # The experiment files and their committed goldens, for the runtime checks
  # and the images.
  experiments = fs.toSource {
    inherit root;
    fileset = ../experiments;
  };
}
