#!/usr/bin/env bash
# Train with DDP, record its gradient buckets with foldprint.torch, and ask
# foldprint whether DDP's all-reduce of them is the fixed-order sum:
#
#   examples/pytorch_gradients/run.sh [W] [OUT] [DTYPE] [gpu|cpu]
#
# DTYPE is f32 (default), bf16 or f16: the model's and the all-reduce's.
# `cpu` trains over gloo without a GPU and checks on the CPU oracle only
# (no NCCL: the all-reduce recorded is gloo's).
# W ranks (default 4) on this host's GPUs, emulated hosts (one NCCL host id
# per rank), gradients under OUT (default ./grads). FOLDPRINT names the
# foldprint binary, TORCHRUN torchrun's command (default `torchrun`). For
# the nccl-allreduce control to be PyTorch's own NCCL, point
# FOLDPRINT_NCCL_LIBRARY at the libnccl.so.2 PyTorch loads (foldprint.check
# from a process that imported torch does this itself). The foldprint
# package is this checkout's python/ unless it is installed (`pip install .`).
set -euo pipefail
world=${1:-4}
out=${2:-grads}
dtype=${3:-f32}
where=${4:-gpu}
case $where in
  gpu) train_flags=(--emulate-hosts) ;;
  cpu) train_flags=(--cpu) ;;
  *) echo "run.sh: the 4th argument is gpu or cpu, not '$where'" >&2; exit 2 ;;
esac
foldprint=${FOLDPRINT:-foldprint}
read -ra torchrun <<< "${TORCHRUN:-torchrun}"
here=$(dirname "$0")
if ! python3 -c 'import foldprint' 2>/dev/null; then
  checkout=$(cd "$here/../.." && pwd)
  export PYTHONPATH="$checkout/python${PYTHONPATH:+:$PYTHONPATH}"
fi

"${torchrun[@]}" --standalone --nproc_per_node "$world" "$here/train.py" \
  --out "$out" --steps 2 --dtype "$dtype" "${train_flags[@]}"

# Which contract DDP's result equals is a finding, not a failure: with
# `--expect-gate none` a difference is reported and no rank exits 1 for it
# (torchrun would call that a crashed job). `--expect-gate fixed-order`
# would make it a gate.
for step in "$out"/step*; do
  echo "== $step: the CPU oracle (reads every rank's file)"
  "$foldprint" run "$step/experiment.toml" --backend cpu --expect-gate none \
    --out "$step/cpu.json"
  report=$step/cpu.json
  if [ "$where" = gpu ]; then
    echo "== $step: NCCL, one process per rank, each reading its own file"
    "${torchrun[@]}" --standalone --nproc_per_node "$world" --no-python \
      "$foldprint" run "$step/experiment.toml" --backend nccl --emulate-hosts \
      --expect-gate none --out "$step/nccl.json"
    report=$step/nccl.json
  fi
  echo "== $step: the drift, drawn"
  "$foldprint" plot "$report" --out "$step/drift.svg"
done
