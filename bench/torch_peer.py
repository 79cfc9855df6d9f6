#!/usr/bin/env python3
"""PyTorch peers for foldprint's fold, on the same addends.

Input: a file of W x n float32 addends (little-endian, rank-major, as
foldprint writes it with `CudaBackend::write_peer_files`) and foldprint's
reduced output (n float32, little-endian). Times on the GPU, with CUDA
events (warm-up, then the median of many iterations):

  * torch.sum(x, dim=0)                        (PyTorch's own reduction)
  * acc = x[0].clone(); acc.add_(x[r]) r=1..W-1 (fixed order in PyTorch)

and reports effective bandwidth with foldprint's formula, (W+1)*n*4 bytes
over the time, plus the fraction of elements whose bits differ from
foldprint's output (every NaN canonicalized to 0x7FC00000 first).

usage: torch_peer.py ADDENDS REDUCED --world W [--iters 100] [--warmup 10] [--json OUT]
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

CANONICAL_NAN = 0x7FC00000


def canonical_bits(t: torch.Tensor) -> torch.Tensor:
    bits = t.contiguous().view(torch.int32)
    nan = torch.isnan(t)
    return torch.where(nan, torch.full_like(bits, CANONICAL_NAN), bits)


def time_ms(fn, warmup: int, iters: int) -> list:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    pairs = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        pairs.append((a, b))
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in pairs)


def median(v: list) -> float:
    k = len(v)
    return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("addends")
    ap.add_argument("reduced")
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        print("error: PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    w = a.world
    total = os.path.getsize(a.addends) // 4
    if total % w:
        print(f"error: {total} floats is not a multiple of W={w}", file=sys.stderr)
        return 2
    n = total // w
    if os.path.getsize(a.reduced) != n * 4:
        print(f"error: reduced file holds {os.path.getsize(a.reduced) // 4} floats, expected n={n}", file=sys.stderr)
        return 2

    dev = torch.device("cuda")
    x = torch.from_numpy(np.fromfile(a.addends, dtype="<f4").reshape(w, n)).to(dev)
    ours = torch.from_numpy(np.fromfile(a.reduced, dtype="<f4")).to(dev)
    ours_bits = canonical_bits(ours)
    nbytes = (w + 1) * n * 4

    out = torch.empty(n, dtype=torch.float32, device=dev)

    def torch_sum():
        torch.sum(x, dim=0, out=out)

    def chained():
        out.copy_(x[0])
        for r in range(1, w):
            out.add_(x[r])

    rows = []
    for name, fn in [("torch.sum(x, dim=0)", torch_sum), ("chained add_ (fixed order)", chained)]:
        t = time_ms(fn, a.warmup, a.iters)
        fn()
        torch.cuda.synchronize()
        differ = (canonical_bits(out) != ours_bits).sum().item()
        med = median(t)
        rows.append(
            {
                "what": name,
                "world": w,
                "n": n,
                "median_ms": med,
                "min_ms": t[0],
                "bytes": nbytes,
                "effective_tb_s": nbytes / (med * 1e-3) / 1e12,
                "elements_differing_from_foldprint": differ,
                "fraction_differing": differ / n if n else 0.0,
            }
        )

    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev)}; W={w} n={n}")
    for r in rows:
        print(
            f"{r['what']:<28} median {r['median_ms']:.4f} ms  min {r['min_ms']:.4f} ms  "
            f"{r['effective_tb_s']:.3f} TB/s  differ from foldprint: {r['fraction_differing'] * 100:.2f}%"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(dev), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
