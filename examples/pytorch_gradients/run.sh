#!/usr/bin/env bash
# Train with DDP, record its gradient buckets with foldprint.torch, and ask
# foldprint whether DDP's all-reduce of them is the fixed-order sum:
#
#   examples/pytorch_gradients/run.sh [W] [OUT] [DTYPE]
#
# DTYPE is f32 (default), bf16 or f16: the model's and the all-reduce's.
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
foldprint=${FOLDPRINT:-foldprint}
read -ra torchrun <<< "${TORCHRUN:-torchrun}"
here=$(dirname "$0")
python3 -c 'import foldprint' 2>/dev/null || export PYTHONPATH="$(cd "$here/../.." && pwd)/python${PYTHONPATH:+:$PYTHONPATH}"

"${torchrun[@]}" --standalone --nproc_per_node "$world" "$here/train.py" \
  --out "$out" --steps 2 --emulate-hosts --dtype "$dtype"

for step in "$out"/step*; do
  echo "== $step: the CPU oracle (reads every rank's file)"
  code=0
  "$foldprint" run "$step/experiment.toml" --backend cpu --out "$step/cpu.json" || code=$?
  echo "(exit $code)"
  echo "== $step: NCCL, one process per rank, each reading its own file"
  code=0
  "${torchrun[@]}" --standalone --nproc_per_node "$world" --no-python \
    "$foldprint" run "$step/experiment.toml" --backend nccl --emulate-hosts \
    --out "$step/nccl.json" || code=$?
  echo "(exit $code)"
done
