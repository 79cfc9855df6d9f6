"""Train a small model data-parallel for a few steps and dump, at each step,
every rank's gradients before the all-reduce and the all-reduced result,
as foldprint's rank files and `expect` file.

    torchrun --standalone --nproc_per_node 4 train.py --out grads [--emulate-hosts] [--dtype bf16]

Writes, per step k:

    grads/step{k}/rank{r}.safetensors   rank r's gradients (one tensor per parameter)
    grads/step{k}/allreduced.safetensors what torch.distributed.all_reduce left
    grads/step{k}/grads.toml            a foldprint experiment over them

The gradients are reduced the way a hand-written data-parallel loop does
it: one `all_reduce(SUM)` per parameter, then divided by the world size for
the optimizer step. (DistributedDataParallel all-reduces flat buckets of
several parameters instead; NCCL splits a bucket differently from a single
tensor, so dump the bucket if you want to check DDP's own bits.)

With --dtype bf16 (or f16) the model, its gradients and the all-reduce are
in that dtype, as on a model moved with `model.to(torch.bfloat16)`: the rank
files keep the dtype, so foldprint reduces in it (float32 accumulation,
one rounding) and its `nccl-allreduce` control runs NCCL's bf16 all-reduce,
the one PyTorch ran.

With --emulate-hosts every rank gets its own NCCL host id (NCCL_HOSTID), so
ranks sharing one GPU talk over NCCL's network transport as separate
machines would.
"""

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}

EXPERIMENT = """\
# Written by examples/pytorch_gradients/train.py: the gradients of step {step}.
name = "{name}"
description = "W = {world} ranks of a {params}-parameter {dtype} MLP, step {step}: is PyTorch's all_reduce the fixed-order sum?"

[defaults]
# A missing rank file is an error, not a smaller world.
world = {world}

[[sweep]]
id = "grads"
addends = "rank{{rank}}.safetensors"
expect = "allreduced.safetensors"
contract = ["fixed-order", "nccl-allreduce"]
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--emulate-hosts", action="store_true")
    ap.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    args = ap.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    if args.emulate_hosts:
        # Before NCCL starts: it reads the host id once.
        os.environ["NCCL_HOSTID"] = f"fp-example-host{rank}"
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
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator(device="cpu").manual_seed(1000 + rank)
    params = sum(p.numel() for p in model.parameters())

    for step in range(args.steps):
        x = torch.randn(args.batch, 784, generator=data).to(device=device, dtype=DTYPES[args.dtype])
        y = torch.randint(0, 10, (args.batch,), generator=data).to(device)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()

        folder = args.out / f"step{step}"
        folder.mkdir(parents=True, exist_ok=True)
        named = [(n, p.grad) for n, p in model.named_parameters()]
        # This rank's addends, before any reduction.
        save_file(
            {n: g.detach().contiguous().cpu() for n, g in named},
            str(folder / f"rank{rank}.safetensors"),
        )
        for _, g in named:
            dist.all_reduce(g, op=dist.ReduceOp.SUM)
        if rank == 0:
            save_file(
                {n: g.detach().contiguous().cpu() for n, g in named},
                str(folder / "allreduced.safetensors"),
            )
            (folder / "grads.toml").write_text(
                EXPERIMENT.format(
                    step=step, name=f"pytorch-step{step}", world=world, params=params, dtype=args.dtype
                )
            )
        for _, g in named:
            g.div_(world)
        opt.step()
        dist.barrier()

    if rank == 0:
        print(f"wrote {args.steps} step(s) of W = {world} gradients ({params} parameters) under {args.out}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
