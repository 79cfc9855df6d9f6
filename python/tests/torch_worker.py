"""W ranks of a small job on gloo (CPU), for test_torch.py:

    python torch_worker.py ddp  OUT W DTYPE   # DDP: plain, recorded, fixed-order
    python torch_worker.py fsdp OUT W         # FSDP2, recorded
    python torch_worker.py uneven OUT W       # fixed_order_all_reduce, odd lengths

Each rank saves its gradients after each step under OUT so the test
compares them bit for bit. A script (not the test module) so that
torch.multiprocessing's spawned ranks import it cleanly.
"""

import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import foldprint.torch as fpt
except ImportError:  # not installed: the package of this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import foldprint.torch as fpt

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
STEPS = 2


def convnet():
    """Not the example's MLP: two convolutions and a linear head."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 10),
    )


def batch(rank, step, dtype):
    # Each rank's data at its own scale, so the ranks' gradients differ in
    # magnitude and their sum changes with the order of the ranks.
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(12, 3, 8, 8, generator=g) * (4.0 ** rank)
    return x.to(dtype), torch.randint(0, 10, (12,), generator=g)


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def ddp(rank, world, out, dtype):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Small buckets, also after DDP rebuilds them at the first step.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 2048
    variants = {
        "plain": lambda m: None,
        "torch_hook": lambda m: m.register_comm_hook(None, allreduce_hook),
        "recorded": lambda m: fpt.record(m, out / "ddp", steps=range(STEPS)),
        "recorded_divide": lambda m: fpt.record(m, out / "ddp_divide", steps=[0], prescale="divide"),
        "fixed": lambda m: fpt.fixed_order(m, record_to=out / "fixed", steps=range(STEPS)),
    }
    for name, setup in variants.items():
        model = DDP(convnet().to(dtype), bucket_cap_mb=2048 / 2**20)
        setup(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(STEPS):
            x, y = batch(rank, step, dtype)
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x).float(), y).backward()
            fpt.save_safetensors(out / f"grads_{name}_step{step}_rank{rank}.safetensors", grads(model.module))
            opt.step()


def fsdp(rank, world, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    # Output sizes divisible by 3 and 4: each weight's shard is unpadded.
    model = torch.nn.Sequential(
        torch.nn.Linear(20, 36), torch.nn.ReLU(), torch.nn.Linear(36, 24), torch.nn.ReLU(),
        torch.nn.Linear(24, 10),
    )
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rec = fpt.record_fsdp(model, out / "fsdp", steps=range(STEPS))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 20, generator=g) * (4.0 ** rank)
        y = torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local = {n: p.grad._local_tensor.detach().clone() for n, p in model.named_parameters()}
        fpt.save_safetensors(out / f"grads_fsdp_step{step}_rank{rank}.safetensors", local)
        opt.step()
    # Each step was written at the end of its own backward, before close().
    assert [d.name for d in rec.written] == [f"step{k}" for k in range(STEPS)], rec.written
    rec.close()


def uneven(rank, world, out):
    lengths = [0, 1, 2, 3, 4, 1001, 4096]
    for n in lengths:
        g = torch.Generator().manual_seed(7)
        every = [torch.randn(n, generator=g) * 8.0 ** r for r in range(world)]
        t = every[rank].clone()
        fpt.fixed_order_all_reduce(t)
        acc = every[0].clone()
        for r in range(1, world):
            acc = acc + every[r]
        assert torch.equal(t.view(torch.int32), acc.view(torch.int32)), n
    if rank == 0:
        (out / "uneven.ok").write_text(" ".join(map(str, lengths)))


def main(rank, world, port, mode, out, dtype):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if mode == "ddp":
            ddp(rank, world, out, DTYPES[dtype])
        elif mode == "uneven":
            uneven(rank, world, out)
        else:
            fsdp(rank, world, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mode, out, world = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    dtype = sys.argv[4] if len(sys.argv) > 4 else "f32"
    out.mkdir(parents=True, exist_ok=True)
    mp.spawn(main, args=(world, free_port(), mode, out, dtype), nprocs=world)
