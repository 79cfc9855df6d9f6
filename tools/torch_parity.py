#!/usr/bin/env python3
"""PyTorch's all-reduce on foldprint's addends, for the parity test.

One process per rank under torchrun. Rank r reads its addends from
DIR/rank<r>.f32 (float32, little-endian), becomes its own NCCL host
(NCCL_HOSTID = PREFIX + the rank as 4 digits, the id foldprint's
--emulate-hosts gives that rank when FOLDPRINT_JOB_ID names the same job),
and all-reduces them (SUM) with torch.distributed over NCCL on
cuda:(LOCAL_RANK mod the visible devices). Rank 0 then writes

  DIR/allreduce.f32   what all_reduce gave rank 0
  DIR/rank-order.f32  x0 + x1 + ... + x(W-1), elementwise float32 adds on
                      the GPU in rank order (PyTorch's fixed-order sum)

each written beside its target and renamed into place, and prints one JSON
line: the world, PyTorch's version and the NCCL version it runs.

usage: torchrun --standalone --nproc-per-node W tools/torch_parity.py DIR PREFIX
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist


def read_addends(path: str, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.fromfile(path, dtype="<f4")).to(device)


def write_f32(t: torch.Tensor, path: str) -> None:
    tmp = path + ".partial"
    t.cpu().numpy().astype("<f4").tofile(tmp)
    os.replace(tmp, path)


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, prefix = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    # NCCL reads its host id once, when the communicator is made.
    os.environ["NCCL_HOSTID"] = f"{prefix}{rank:04d}"
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    mine = read_addends(os.path.join(folder, f"rank{rank}.f32"), device)
    reduced = mine.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    torch.cuda.synchronize()
    if rank == 0:
        write_f32(reduced, os.path.join(folder, "allreduce.f32"))
        acc = mine.clone()
        for r in range(1, world):
            acc.add_(read_addends(os.path.join(folder, f"rank{r}.f32"), device))
        torch.cuda.synchronize()
        write_f32(acc, os.path.join(folder, "rank-order.f32"))
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        print(json.dumps({"world": world, "torch": torch.__version__, "nccl": nccl}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
