#!/usr/bin/env bash
# The launchers users already run, live on this CPU machine, each starting
# 4 ranks of `foldprint world`, once all healthy and once with a rank that
# fails (tests/cli/launchers.rs, #[ignore]d in the plain test run), and mpirun
# inside an sbatch-like environment (tests/cli/launchers_setup.rs):
# - Open MPI's mpirun, from Debian's openmpi-bin;
# - Slurm's srun, against a one-node Slurm started here: munged, slurmctld
#   and slurmd from Debian's packages, with a private slurm.conf and state
#   under target/slurm-ci, stopped again on exit.
# Installs what is missing (needs root or sudo, as does starting the
# daemons); fails, never skips, when a launcher cannot be installed or
# started, or a test did not run.
set -euo pipefail
cd "$(dirname "$0")/.."

ci_name="launchers"
# shellcheck source=ci/lib.sh
source ci/lib.sh

missing=()
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
for tool in slurmctld slurmd srun munged; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        missing+=(slurmctld slurmd slurm-client munge)
        break
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    as_root apt-get update -qq
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mpirun --version | head -1

# A one-node Slurm of our own; `srun -O` lets 4 tasks share fewer cores.
slurm=$PWD/target/slurm-ci
rm -rf "$slurm"
mkdir -p "$slurm/state" "$slurm/spool" "$slurm/log"
host=$(hostname)
{
    echo "ClusterName=foldprint-ci"
    echo "SlurmctldHost=$host"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$slurm/state"
    echo "SlurmdSpoolDir=$slurm/spool"
    echo "SlurmctldPidFile=$slurm/slurmctld.pid"
    echo "SlurmdPidFile=$slurm/slurmd.pid"
    echo "SlurmctldLogFile=$slurm/log/slurmctld.log"
    echo "SlurmdLogFile=$slurm/log/slurmd.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "NodeName=$host CPUs=$(nproc) State=UNKNOWN"
    echo "PartitionName=ci Nodes=$host Default=YES MaxTime=INFINITE State=UP"
} >"$slurm/slurm.conf"
export SLURM_CONF=$slurm/slurm.conf
srun --version
stop_slurm() {
    local pid
    for pid in "$slurm/slurmd.pid" "$slurm/slurmctld.pid"; do
        if [ -f "$pid" ]; then as_root kill "$(cat "$pid")" 2>/dev/null || true; fi
    done
}
trap stop_slurm EXIT
if ! munge -n >/dev/null 2>&1; then
    as_root mkdir -p /run/munge
    as_root chown munge:munge /run/munge
    as_root su -s /bin/sh munge -c /usr/sbin/munged
fi
as_root env SLURM_CONF="$SLURM_CONF" slurmctld -c
as_root env SLURM_CONF="$SLURM_CONF" slurmd
for _ in $(seq 1 100); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then break; fi
    sleep 0.2
done
sinfo
sinfo -h -o %T | grep -q idle \
    || { echo "launchers: the one-node Slurm did not come up ($slurm/log)" >&2; exit 1; }

mkdir -p target
cargo test --release --locked --test cli launchers -- --include-ignored 2>&1 \
    | tee target/launcher-tests.log
grep -Eq '^test result: ok\. [1-9][0-9]* passed; 0 failed; 0 ignored' target/launcher-tests.log \
    || { echo "launchers: the launcher tests did not all run" >&2; exit 1; }
for t in world_under_mpirun_lists_every_rank world_under_srun_lists_every_rank; do
    grep -q "^test launchers::$t \.\.\. ok" target/launcher-tests.log \
        || { echo "launchers: $t did not run" >&2; exit 1; }
done
