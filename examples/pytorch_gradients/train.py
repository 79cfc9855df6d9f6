"""Train a small model with DistributedDataParallel for a few steps and let
foldprint record, at each step, every rank's gradient buckets as DDP reduces
them and DDP's all-reduced result.

    torchrun --standalone --nproc_per_node 4 train.py --out grads [--emulate-hosts] [--dtype bf16]

`foldprint.torch.record` registers a DDP comm hook that reduces exactly as
DDP does without one (each bucket scaled by 1/W, then all-reduced), so the
training is unchanged, and writes per step k:

    grads/step{k}/rank{r}.safetensors    rank r's buckets as reduced (bucket0, bucket1, ...)
    grads/step{k}/allreduced.safetensors what the all-reduce returned
    grads/step{k}/experiment.toml        world = W, expect = the above,
                                         contracts fixed-order and nccl-allreduce

Each bucket is one tensor, NCCL's own message: the nccl-allreduce control
reduces the same flat buffer DDP did. The bucket's parameter names are in
the files' metadata.

With --dtype bf16 (or f16) the model, its gradients and the buckets are in
that dtype: the rank files keep it, so foldprint reduces in it (float32
accumulation, one rounding) and its nccl-allreduce control runs NCCL's bf16
all-reduce, the one DDP ran.

With --emulate-hosts every rank gets its own NCCL host id (NCCL_HOSTID), so
ranks sharing one GPU talk over NCCL's network transport as separate
machines would. With --cpu it trains on the CPU over gloo, no GPU needed:
the all-reduce recorded is then gloo's (the nccl-allreduce control has
nothing to equal; check the recording with `--backend cpu`).
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import foldprint.torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--emulate-hosts", action="store_true")
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    ap.add_argument("--cpu", action="store_true",
                    help="train on the CPU with gloo (no GPU needed; gloo's all-reduce, not NCCL's)")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if args.emulate_hosts:
        # Before NCCL starts: it reads the host id once.
        os.environ["NCCL_HOSTID"] = f"fp-example-host{rank}"
    if args.cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)

    # The same initial weights on every rank; each rank its own data.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    ).to(device=device, dtype=DTYPES[args.dtype])
    model = DDP(model, device_ids=None if args.cpu else [device])
    foldprint.torch.record(model, args.out, steps=range(args.steps))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator(device="cpu").manual_seed(1000 + rank)

    for _ in range(args.steps):
        x = torch.randn(args.batch, 784, generator=data).to(device=device, dtype=DTYPES[args.dtype])
        y = torch.randint(0, 10, (args.batch,), generator=data).to(device)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()

    dist.barrier()
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        print(f"recorded {args.steps} step(s) of W = {world} gradient buckets ({params} parameters) under {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
