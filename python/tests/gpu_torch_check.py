"""foldprint.torch on a GPU host with NCCL: W ranks under torchrun on
emulated hosts (each rank its own NCCL_HOSTID, all on the GPUs there are).

    FOLDPRINT_BIN=/path/to/foldprint PYTHONPATH=python \\
        python3 python/tests/gpu_torch_check.py [--worlds 4 8] [--dtypes f32] [--out DIR]

For each W it trains a small transformer (not examples/pytorch_gradients'
MLP) with DDP and FSDP2 and checks:

  (a) the DDP recorder leaves DDP's gradients as they are, and its buckets
      give foldprint's nccl-allreduce (run with PyTorch's own libnccl, which
      the package hands the CLI) equal to DDP's result bit for bit, and
      fixed-order on NCCL equal to the CPU oracle's;
  (b) the fixed-order hook's gradients are identical under default NCCL,
      under NCCL_PROTO=LL and under NCCL_ALGO=allreduce:tree, and equal
      foldprint's fixed-order of its recorded buckets; the default
      reduction's gradients under each are compared too (the negative
      control: they should differ);
  (c) the time per training step of the fixed-order hook against DDP's
      default (emulated hosts: loopback sockets, not a bandwidth result);
  (d) the FSDP2 recorder's output shards against the reduce-scatter
      control (nccl-allreduce of a reduce-scatter: ncclReduceScatter, with
      mean ncclAvg), where the binary runs it.

Prints a table and exits 1 if a check fails. The worker half runs under
torchrun (`python3 gpu_torch_check.py worker ...`), started by this script.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
try:
    import foldprint
except ImportError:  # a checkout, not installed
    sys.path.insert(0, str(HERE.parents[1]))
    import foldprint

STEPS = 2
DTYPES = ("f32", "bf16", "f16")


# --- worker (one per rank, under torchrun) ---------------------------------------------------

def build(torch, vocab=512, d=128, layers=2, ff=512):
    nn = torch.nn

    class Net(nn.Module):
        """Embedding, two encoder layers, a head."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.layers = nn.ModuleList(
                nn.TransformerEncoderLayer(d, 4, ff, dropout=0.0, batch_first=True) for _ in range(layers))
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    torch.manual_seed(0)
    return Net()


def worker(args):
    # Deterministic local gradients, so that runs differ only in the reduction.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    os.environ["NCCL_HOSTID"] = f"fp-torch-check-host{rank}"  # before NCCL starts
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import foldprint.torch as fpt

    torch.use_deterministic_algorithms(True, warn_only=True)
    if args.smoke_cpu:  # the script's own logic, on gloo: no NCCL, no GPU
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        torch.cuda.synchronize = lambda *a: None
    else:
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    out = Path(args.out)

    def batch(step, size=8, seq=32):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randint(0, 512, (size, seq), generator=g)
        return x.to(device), torch.roll(x, 1, 1).to(device)

    def train(model, steps, save=None, timed=False):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        times = []
        for step in range(steps):
            x, y = batch(step)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            if save:
                module = getattr(model, "module", model)
                fpt.save_safetensors(out / f"grads_{save}_step{step}_rank{rank}.safetensors",
                                     {n: p.grad for n, p in module.named_parameters()})
        return times

    def ddp(cap_mb=0.25, **kw):
        # Small buckets for the checks, so each step has several.
        return DDP(build(torch, **kw).to(device=device, dtype=dtype), bucket_cap_mb=cap_mb,
                   device_ids=None if args.smoke_cpu else [device])

    timing = {}
    # Default reduction and fixed-order hook, gradients saved (both parts).
    train(ddp(), STEPS, save="plain")
    m = ddp()
    m.register_comm_hook(fpt.FixedOrderState(record_to=out / "fixed", steps=range(STEPS), ddp_model=m),
                         fpt.fixed_order_hook)
    train(m, STEPS, save="fixed")
    if args.part == "all":
        m = ddp()
        fpt.record(m, out / "ddp", steps=range(STEPS))
        train(m, STEPS, save="recorded")
        # (c) the same bigger model and steps under each reduction.
        for name in ("default", "fixed-order", "fixed-order, one stream") * 2:
            m = ddp(cap_mb=25, d=256, layers=4, ff=1024)  # DDP's default buckets
            if name == "fixed-order":
                m.register_comm_hook(None, fpt.fixed_order_hook)
            elif name != "default":
                m.register_comm_hook(fpt.FixedOrderState(side_stream=False), fpt.fixed_order_hook)
            times = train(m, 3 + args.timed_steps)[3:]
            timing.setdefault(name, []).extend(times)
        # (d) FSDP2: each encoder layer and the root.
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        model = build(torch).to(device)
        mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        rec = fpt.record_fsdp(model, out / "fsdp", steps=range(STEPS))
        train(model, STEPS)
        rec.close()
    dist.barrier()
    if rank == 0:
        (out / "worker.json").write_text(json.dumps({
            "timing_ms": {k: 1000 * statistics.median(v) for k, v in timing.items()},
            "torch": torch.__version__,
            "nccl": "none" if args.smoke_cpu else ".".join(map(str, torch.cuda.nccl.version())),
            "card": "cpu" if args.smoke_cpu else torch.cuda.get_device_name(device),
            "params_timed": sum(p.numel() for p in build(torch, d=256, layers=4, ff=1024).parameters()),
        }))
    dist.destroy_process_group()


# --- driver ---------------------------------------------------------------------------------------

def torchrun(world, out, part, dtype, timed_steps, env=None, smoke=False):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
           str(HERE), "worker", "--out", str(out), "--part", part, "--dtype", dtype,
           "--timed-steps", str(timed_steps)] + (["--smoke-cpu"] if smoke else [])
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), e.get("PYTHONPATH", "")])
    done = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=480)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-6000:])
        raise SystemExit(f"torchrun W={world} {part} {env or ''} failed (exit {done.returncode})")


def load_grads(torch_load, out, name, step, rank):
    return torch_load(out / f"grads_{name}_step{step}_rank{rank}.safetensors")[0]


def differing(torch, a, b):
    ints = {torch.float32: torch.int32}.get(a.dtype, torch.int16)
    return int((a.contiguous().view(ints) != b.contiguous().view(ints)).sum())


def grads_differing(torch, load, out_a, out_b, name, world):
    total = 0
    for step in range(STEPS):
        for r in range(world):
            a, b = load_grads(load, out_a, name[0], step, r), load_grads(load, out_b, name[1], step, r)
            total += sum(differing(torch, a[n], b[n]) for n in a)
    return total


def fixed_digests(report):
    return {c["key"]: [a["sha256"] for a in c["arenas"]]
            for c in report.data["cases"] if c["params"]["contract"] == "fixed-order"}


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--out", required=True)
    w.add_argument("--part", choices=["all", "ll"], default="all")
    w.add_argument("--dtype", choices=DTYPES, default="f32")
    w.add_argument("--timed-steps", type=int, default=10)
    w.add_argument("--smoke-cpu", action="store_true")
    ap.add_argument("--worlds", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["f32"])
    ap.add_argument("--timed-steps", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("/tmp/foldprint-torch-check"))
    ap.add_argument("--no-tree", action="store_true", help="skip the NCCL_ALGO=allreduce:tree run")
    ap.add_argument("--smoke-cpu", action="store_true",
                    help="run the script's logic on gloo/CPU, without the NCCL checks")
    args = ap.parse_args()
    if args.cmd == "worker":
        return worker(args)

    import torch

    import foldprint.torch as fpt

    rows, failed = [], False

    def row(what, ok, detail):
        nonlocal failed
        failed |= ok is False
        rows.append((what, {True: "PASS", False: "FAIL", None: "note"}[ok], detail))
        print(f"{what:34} {rows[-1][1]:4} {detail}", flush=True)

    print(f"foldprint {foldprint.version()} at {foldprint.binary()}; NCCL library for the CLI: "
          f"{fpt.nccl_library()}", flush=True)
    for dtype in args.dtypes:
        for world in args.worlds:
            tag = f"W={world} {dtype}"
            out, ll = args.out / f"w{world}-{dtype}", args.out / f"w{world}-{dtype}-LL"
            tree = args.out / f"w{world}-{dtype}-tree"
            for d in (out, ll, tree):
                subprocess.run(["rm", "-rf", str(d)], check=True)
                d.mkdir(parents=True)
            t0 = time.time()
            torchrun(world, out, "all", dtype, args.timed_steps, smoke=args.smoke_cpu)
            torchrun(world, ll, "ll", dtype, args.timed_steps, env={"NCCL_PROTO": "LL"}, smoke=args.smoke_cpu)
            if not args.no_tree:
                # Per collective: a global NCCL_ALGO=Tree leaves Broadcast without an algorithm.
                torchrun(world, tree, "ll", dtype, args.timed_steps, env={"NCCL_ALGO": "allreduce:tree"},
                         smoke=args.smoke_cpu)
            info = json.loads((out / "worker.json").read_text())
            print(f"{tag}: trained in {time.time() - t0:.0f} s on {info['card']}, torch {info['torch']}, "
                  f"NCCL {info['nccl']}", flush=True)
            load = fpt.load_safetensors

            # (a) the DDP recorder
            moved = grads_differing(torch, load, out, out, ("plain", "recorded"), world)
            row(f"{tag} (a) recorder keeps grads", moved == 0, f"{moved} gradient elements differ from plain DDP")
            cpu = foldprint.check(out / "ddp")
            nccl = cpu if args.smoke_cpu else \
                foldprint.check(out / "ddp", backend="nccl", launch=world, emulate_hosts=True)
            buckets = [t for s in nccl for t in s.tensors]
            ok = bool(buckets) and all("nccl-allreduce" in t.matches for t in buckets)
            row(f"{tag} (a) nccl-allreduce == DDP", None if args.smoke_cpu else ok,
                f"{sum('nccl-allreduce' in t.matches for t in buckets)}/{len(buckets)} buckets over {STEPS} steps")
            same = all(fixed_digests(c.report) == fixed_digests(n.report) for c, n in zip(cpu, nccl))
            row(f"{tag} (a) fixed-order NCCL == CPU", None if args.smoke_cpu else same,
                "digests of the fixed-order cases")
            drift = [(t.name, t.contracts["fixed-order"].differing, t.contracts["fixed-order"].max_ulp)
                     for s in cpu for t in s.tensors]
            row(f"{tag} (a) DDP vs fixed-order", None,
                f"{sum(d for _, d, _ in drift)} elements differ, max {max((u or 0) for *_, u in drift)} ULP")

            # (b) the fixed-order hook
            fixed_ll = grads_differing(torch, load, out, ll, ("fixed", "fixed"), world)
            row(f"{tag} (b) fixed hook default==LL", fixed_ll == 0, f"{fixed_ll} gradient elements differ")
            unequal = 0
            for step in range(STEPS):
                reduced, meta = load(out / "fixed" / f"step{step}" / "allreduced.safetensors")
                for r in range(world):
                    g = load_grads(load, out, "fixed", step, r)
                    for name, flat in reduced.items():
                        m, at = json.loads(meta[name]), 0
                        for p, shape in zip(m["params"], m["shapes"]):
                            n = int(torch.tensor(shape).prod()) if shape else 1
                            unequal += differing(torch, flat[at:at + n].reshape(shape), g[p])
                            at += n
            row(f"{tag} (b) fixed hook grads == its files", unequal == 0,
                f"{unequal} gradient elements differ from the recorded result")
            fcpu = foldprint.check(out / "fixed")
            fll = foldprint.check(ll / "fixed")
            row(f"{tag} (b) fixed hook == fixed-order", fcpu.fixed_order and fll.fixed_order,
                f"{sum(len(s.tensors) for s in fcpu)} buckets (default), {sum(len(s.tensors) for s in fll)} (LL)")
            plain_ll = grads_differing(torch, load, out, ll, ("plain", "plain"), world)
            row(f"{tag} (b) default default vs LL", None,
                f"{plain_ll} gradient elements differ" + ("" if plain_ll else
                                                          ": the negative control did not move here"))
            if not args.no_tree:
                fixed_tree = grads_differing(torch, load, out, tree, ("fixed", "fixed"), world)
                row(f"{tag} (b) fixed hook default==tree", fixed_tree == 0,
                    f"{fixed_tree} gradient elements differ (NCCL_ALGO=allreduce:tree)")
                plain_tree = grads_differing(torch, load, out, tree, ("plain", "plain"), world)
                row(f"{tag} (b) default default vs tree", None, f"{plain_tree} gradient elements differ")

            # (c) timing
            t = info["timing_ms"]
            row(f"{tag} (c) ms/step", None,
                f"default {t['default']:.1f}, fixed-order {t['fixed-order']:.1f} "
                f"({t['fixed-order'] / t['default']:.2f}x; on the backward's stream "
                f"{t['fixed-order, one stream']:.1f}), {info['params_timed']} params, "
                f"median of {2 * args.timed_steps} steps, emulated hosts")

            # (d) FSDP2
            fs = foldprint.check(out / "fsdp", backend="cpu" if args.smoke_cpu else "nccl",
                                 **({} if args.smoke_cpu else dict(launch=world, emulate_hosts=True)))
            cases = [c for s in fs for c in s.cases if c.contract == "nccl-allreduce"]
            if not cases:
                reasons = {k.reason for s in fs for k in s.skipped}
                row(f"{tag} (d) FSDP2 == reduce-scatter", None, f"not run by this binary: {sorted(reasons)}")
            else:
                ok = all(c.equal for c in cases)
                shards = sum(len(r) for c in cases for r in c.rank_arenas)
                row(f"{tag} (d) FSDP2 == reduce-scatter", ok,
                    f"{sum(c.differing for c in cases)} elements differ over {shards} rank shards")
            fcpu = foldprint.check(out / "fsdp")
            row(f"{tag} (d) FSDP2 vs fixed-order", None,
                f"{sum(c.differing for s in fcpu for c in s.cases)} elements differ (CPU oracle, per-rank expect)")

    print("\n| check | verdict | detail |\n|---|---|---|")
    for what, v, detail in rows:
        print(f"| {what} | {v} | {detail} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main() or 0)
