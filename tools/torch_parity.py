#!/usr/bin/env python3
"""PyTorch's all-reduce on foldprint's addends, for the parity tests.

One process per rank under torchrun. Rank r reads its addends from
DIR/rank<r>.<dtype> (little-endian float32, bfloat16 or float16 bits),
becomes its own NCCL host (NCCL_HOSTID = PREFIX + the rank as 4 digits,
the id foldprint's --emulate-hosts gives that rank when FOLDPRINT_JOB_ID
names the same job), and all-reduces them (SUM) in that dtype with
torch.distributed over NCCL on cuda:(LOCAL_RANK mod the visible devices).
Rank 0 then writes, in the dtype:

  DIR/allreduce.<dtype>   what all_reduce gave rank 0
  DIR/rank-order.<dtype>  x0 + x1 + ... + x(W-1) accumulated in float32 on
                          the GPU in rank order, cast once to the dtype
                          (PyTorch's fixed-order sum)

each written beside its target and renamed into place, and prints one JSON
line: the world, the dtype, PyTorch's version and the NCCL version it runs.

With --collective reduce-scatter, each rank instead runs
dist.reduce_scatter_tensor over its addends (W equal shards) with
ReduceOp.SUM (--op sum, the default) or ReduceOp.AVG (--op avg, FSDP2's
default), and rank r writes what it was left:

  DIR/reducescatter-<op>.rank<r>.<dtype>

usage: torchrun --standalone --nproc-per-node W tools/torch_parity.py DIR PREFIX [f32|bf16|f16]
           [--collective all-reduce|reduce-scatter] [--op sum|avg]
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

# foldprint's dtype names: the torch dtype and the numpy type of its bits.
DTYPES = {
    "f32": (torch.float32, "<f4"),
    "bf16": (torch.bfloat16, "<i2"),
    "f16": (torch.float16, "<i2"),
}


def read_addends(path: str, dtype: str, device: torch.device) -> torch.Tensor:
    torch_dtype, np_type = DTYPES[dtype]
    raw = torch.from_numpy(np.fromfile(path, dtype=np_type))
    if dtype != "f32":
        # The file holds the dtype's bits: reinterpret, never convert.
        raw = raw.view(torch_dtype)
    return raw.to(device)


def write(t: torch.Tensor, dtype: str, path: str) -> None:
    tmp = path + ".partial"
    t = t.cpu()
    if dtype != "f32":
        t = t.view(torch.int16)
    t.numpy().tofile(tmp)
    os.replace(tmp, path)


def options(args: list) -> dict:
    """The named options after the positional arguments; None when bad."""
    known = {"--collective": ("all-reduce", "reduce-scatter"), "--op": ("sum", "avg")}
    got = {"--collective": "all-reduce", "--op": "sum"}
    if len(args) % 2:
        return None
    for name, value in zip(args[::2], args[1::2]):
        if name not in known or value not in known[name]:
            return None
        got[name] = value
    return got


def main() -> int:
    positional = []
    for a in sys.argv[1:4]:
        if a.startswith("--"):
            break
        positional.append(a)
    opts = options(sys.argv[1 + len(positional):])
    if len(positional) not in (2, 3) or opts is None:
        print(__doc__, file=sys.stderr)
        return 2
    folder, prefix = positional[0], positional[1]
    dtype = positional[2] if len(positional) == 3 else "f32"
    if dtype not in DTYPES:
        print(f"unknown dtype {dtype!r} (f32, bf16 or f16)", file=sys.stderr)
        return 2
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    # NCCL reads its host id once, when the communicator is made.
    os.environ["NCCL_HOSTID"] = f"{prefix}{rank:04d}"
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    name = lambda r: os.path.join(folder, f"rank{r}.{dtype}")
    mine = read_addends(name(rank), dtype, device)
    if opts["--collective"] == "reduce-scatter":
        op = opts["--op"]
        if mine.numel() % world:
            print(f"{mine.numel()} elements do not split into {world} equal shards", file=sys.stderr)
            return 2
        shard = torch.empty(mine.numel() // world, dtype=mine.dtype, device=device)
        reduce_op = dist.ReduceOp.AVG if op == "avg" else dist.ReduceOp.SUM
        dist.reduce_scatter_tensor(shard, mine, op=reduce_op)
        torch.cuda.synchronize()
        write(shard, dtype, os.path.join(folder, f"reducescatter-{op}.rank{rank}.{dtype}"))
        dist.barrier()
        if rank == 0:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            print(json.dumps({"world": world, "dtype": dtype, "collective": "reduce-scatter",
                              "op": op, "torch": torch.__version__, "nccl": nccl}))
        dist.destroy_process_group()
        return 0
    reduced = mine.clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    torch.cuda.synchronize()
    if rank == 0:
        write(reduced, dtype, os.path.join(folder, f"allreduce.{dtype}"))
        acc = mine.float()
        for r in range(1, world):
            acc += read_addends(name(r), dtype, device).float()
        torch.cuda.synchronize()
        write(acc.to(DTYPES[dtype][0]), dtype, os.path.join(folder, f"rank-order.{dtype}"))
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        print(json.dumps({"world": world, "dtype": dtype, "torch": torch.__version__, "nccl": nccl}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
