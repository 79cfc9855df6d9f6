#!/usr/bin/env bash
# The launchers users already run, live on this CPU machine: Open MPI's
# mpirun (from Debian's openmpi-bin, installed here when missing) starts 4
# ranks of `foldprint world`, once all healthy and once with a rank that
# fails (tests/cli/launchers.rs, #[ignore]d in the plain test run). Fails,
# never skips, when mpirun cannot be installed or a test did not run.
#
# Slurm is not run here: a single-node slurmctld + slurmd needs munge keys,
# a slurm.conf naming this host and its cgroup setup, and root-owned
# daemons, more than a CI container gives; its variables are tested in
# src/ranks/discover.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

ci_name="launchers"
# shellcheck source=ci/lib.sh
source ci/lib.sh

if ! command -v mpirun >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends openmpi-bin >/dev/null
fi
mpirun --version | head -1

mkdir -p target
cargo test --release --locked --test cli launchers:: -- --include-ignored 2>&1 \
    | tee target/launcher-tests.log
grep -Eq '^test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' target/launcher-tests.log \
    || { echo "launchers: the launcher tests did not all run" >&2; exit 1; }
grep -q '^test launchers::world_under_mpirun_lists_every_rank \.\.\. ok' target/launcher-tests.log \
    || { echo "launchers: the mpirun test did not run" >&2; exit 1; }
