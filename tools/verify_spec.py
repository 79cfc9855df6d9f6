#!/usr/bin/env python3
"""Independent verifier for foldprint digests, written from docs/SPEC.md,
docs/EXPERIMENTS.md and docs/REPORT.md alone (no foldprint source was read).

It regenerates every addend of every case with the generator of SPEC §1
(rounded once to the case's dtype, SPEC §8), folds shard by shard (SPEC §2,
§3) in binary32 with numpy, scales a mean, rounds once to the dtype,
applies the NaN policy the golden names (SPEC §5, §8), hashes the
little-endian bytes of each arena and of each 65536-element chunk, computes
the order sensitivity (SPEC §7), and compares all of it with
experiments/golden/<experiment>.json by case key (SPEC §6). --strict also compares case ids and their order
(EXPERIMENTS.md). tools/mutate_spec.py mutates this file one rule at a time.

Exit codes: 0 all digests match, 1 any mismatch (or missing / extra golden
case), 2 bad input (unreadable or invalid experiment / golden / vectors).

Requirements: Python >= 3.11 (tomllib) and numpy.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import re
import sys
import time
import tomllib
from dataclasses import dataclass, field

import numpy as np

# ---------------------------------------------------------------------------
# Constants (SPEC §1, §4)

MASK64 = (1 << 64) - 1
SEED_SALT = 0x666F6C647072696E  # ASCII "foldprin"
GAMMA = 0x9E3779B97F4A7C15
SHUFFLE_SALT = 0x53485546464C4521
MIX_M1 = 0xBF58476D1CE4E5B9
MIX_M2 = 0x94D049BB133111EB

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

DISTRIBUTIONS = (
    "mixed-magnitude",
    "uniform",
    "cancellation",
    "subnormal-heavy",
    "specials",
    "exact-integers",
)
CONTRACTS = ("fixed-order", "arrival-order", "pairwise-tree")
DTYPES = ("f32", "bf16", "f16")

# numpy constants: every operand of a uint64 array op is a np.uint64 so that
# nothing is promoted to float64 or int64 (numpy 1.x value-based casting).
U64 = np.uint64
_S27, _S30, _S31, _S32 = U64(27), U64(30), U64(31), U64(32)
_S39, _S48 = U64(39), U64(48)
_M1, _M2 = U64(MIX_M1), U64(MIX_M2)
_GAMMA = U64(GAMMA)
U32 = np.uint32
_U32_7FFFFF = U32(0x7FFFFF)
_U32_3FFFFF = U32(0x3FFFFF)
_U32_FF = U32(0xFF)
_U32_NOT_FF = U32(0xFFFFFF00)
_U32_SIGN = U32(0x80000000)
_U32_EXP = U32(0x7F800000)
_U32_QNAN = U32(0x7FC00000)

_U32_LOW16 = U32(0xFFFF)

# SPEC §8: the canonical NaN and the NaN test of each dtype, on its bits.
CANONICAL_NAN = {"f32": 0x7FC00000, "bf16": 0x7FC0, "f16": 0x7E00}
ELEMENT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}

DEFAULT_CHUNK = 1 << 20          # elements folded per numpy pass (any value gives the same digests)
CHUNK_ELEMS = 1 << 16            # SPEC §5: elements per chunk digest
SENSITIVITY_CAP = 1 << 20        # SPEC §7: elements checked at most per case


class BadInput(Exception):
    """Invalid experiment, golden or vector file: exit code 2."""


# ---------------------------------------------------------------------------
# Scalar (Python int) reference of the integer mixing

def mix64_int(z: int) -> int:
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX_M1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_M2) & MASK64
    return z ^ (z >> 31)


def lane_key(seed: int, rank: int, arena: int) -> int:
    return mix64_int(mix64_int(mix64_int(seed ^ SEED_SALT) ^ rank) ^ arena)


def u_int(seed: int, rank: int, arena: int, index: int) -> int:
    return mix64_int((lane_key(seed, rank, arena) + index * GAMMA) & MASK64)


# ---------------------------------------------------------------------------
# Vectorized generator (numpy uint64, wrapping)

def mix64_inplace(z: np.ndarray, tmp: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on a uint64 array, in place (tmp: scratch)."""
    np.right_shift(z, _S30, out=tmp)
    np.bitwise_xor(z, tmp, out=z)
    np.multiply(z, _M1, out=z)
    np.right_shift(z, _S27, out=tmp)
    np.bitwise_xor(z, tmp, out=z)
    np.multiply(z, _M2, out=z)
    np.right_shift(z, _S31, out=tmp)
    np.bitwise_xor(z, tmp, out=z)
    return z


class IndexBlock:
    """index * GAMMA (wrapping) for a contiguous range of element indices,
    shared by all ranks of one chunk."""

    def __init__(self, indices: np.ndarray):
        assert indices.dtype == np.uint64
        self.n = int(indices.shape[0])
        self.idx_gamma = np.multiply(indices, _GAMMA)
        self.z = np.empty(self.n, dtype=np.uint64)
        self.tmp = np.empty(self.n, dtype=np.uint64)

    @classmethod
    def range(cls, start: int, stop: int) -> "IndexBlock":
        return cls(np.arange(start, stop, dtype=np.uint64))

    def words(self, seed: int, rank: int, arena: int) -> tuple[np.ndarray, np.ndarray]:
        """(hi, lo) 32-bit halves of u(seed, rank, arena, index)."""
        key = U64(lane_key(seed, rank, arena))
        np.add(self.idx_gamma, key, out=self.z)
        mix64_inplace(self.z, self.tmp)
        np.right_shift(self.z, _S32, out=self.tmp)
        hi = self.tmp.astype(np.uint32)
        lo = self.z.astype(np.uint32)  # modular truncation to the low word
        return hi, lo

    def u64(self, seed: int, rank: int, arena: int) -> np.ndarray:
        key = U64(lane_key(seed, rank, arena))
        np.add(self.idx_gamma, key, out=self.z)
        mix64_inplace(self.z, self.tmp)
        return self.z.copy()


def _mixed_bits(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    # bits(u >> 63, 115 + ((((u >> 32) & 0xFF) * 24) >> 8), u)
    e = np.bitwise_and(hi, _U32_FF)
    e *= U32(24)
    e >>= U32(8)
    e += U32(115)
    e <<= U32(23)
    bits = np.bitwise_and(hi, _U32_SIGN)
    bits |= e
    bits |= np.bitwise_and(lo, _U32_7FFFFF)
    return bits


def generate_bits(dist: str, seed: int, rank: int, arena: int, blk: IndexBlock) -> np.ndarray:
    """uint32 bit patterns of value(dist, seed, rank, arena, index) for the block."""
    if dist == "mixed-magnitude":
        hi, lo = blk.words(seed, rank, arena)
        return _mixed_bits(hi, lo)
    if dist == "uniform":
        u = blk.u64(seed, rank, arena)
        i = np.right_shift(u, _S39).astype(np.int64) - np.int64(1 << 24)
        v = i.astype(np.float32)  # |i| <= 2^24: exact
        v *= np.float32(2.0 ** -24)  # power of two, no underflow: exact
        return v.view(np.uint32)
    if dist == "exact-integers":
        u = blk.u64(seed, rank, arena)
        i = np.right_shift(u, _S48).astype(np.int64) - np.int64(1 << 15)
        return i.astype(np.float32).view(np.uint32)
    if dist == "subnormal-heavy":
        hi, lo = blk.words(seed, rank, arena)
        s = np.bitwise_and(hi, U32(3))
        e_hi = np.right_shift(hi, U32(2))  # (u >> 34)
        e_hi &= U32(3)
        e_hi += U32(1)
        e = np.where(s < U32(3), U32(0), e_hi).astype(np.uint32)
        e <<= U32(23)
        bits = np.bitwise_and(hi, _U32_SIGN)
        bits |= e
        bits |= np.bitwise_and(lo, _U32_7FFFFF)
        return bits
    if dist == "specials":
        hi, lo = blk.words(seed, rank, arena)
        k = np.bitwise_and(hi, U32(63))
        bits = _mixed_bits(hi, lo)
        nan = np.bitwise_and(hi, _U32_SIGN) | _U32_QNAN | np.bitwise_and(lo, _U32_3FFFFF)
        bits = np.where(k == U32(0), U32(0x7F800000), bits)
        bits = np.where(k == U32(1), U32(0xFF800000), bits)
        bits = np.where(k == U32(2), nan, bits)
        bits = np.where(k == U32(3), U32(0x80000000), bits)
        bits = np.where(k == U32(4), U32(0x00000000), bits)
        return bits.astype(np.uint32, copy=False)
    if dist == "cancellation":
        even = rank & ~1
        p_hi, p_lo = blk.words(seed, even, arena)
        e = np.bitwise_and(p_hi, _U32_FF)
        e *= U32(11)
        e >>= U32(8)
        e += U32(137)
        e <<= U32(23)
        if rank == even:
            return e | np.bitwise_and(p_lo, _U32_7FFFFF)
        _, lo = blk.words(seed, rank, arena)
        m = np.bitwise_and(p_lo, _U32_NOT_FF) | np.bitwise_and(lo, _U32_FF)
        return _U32_SIGN | e | np.bitwise_and(m, _U32_7FFFFF)
    raise BadInput(f"unknown distribution {dist!r}")


def generate_values(dist: str, seed: int, rank: int, arena: int, blk: IndexBlock) -> np.ndarray:
    bits = generate_bits(dist, seed, rank, arena, blk)
    assert bits.dtype == np.uint32
    return bits.view(np.float32)


# ---------------------------------------------------------------------------
# Element types (SPEC §8): exact widening, one rounding to nearest-even

def _round_up(rest: np.ndarray, half, kept: np.ndarray) -> np.ndarray:
    """1 where the dropped part `rest` rounds the kept part up: above half
    way, or exactly half way with the kept part odd (ties to even)."""
    return ((rest > half) | ((rest == half) & ((kept & U32(1)) == U32(1)))).astype(np.uint32)


def narrow_bf16(b: np.ndarray, rounding=_round_up) -> np.ndarray:
    """binary32 bits -> bfloat16 bits (in uint32), SPEC §8."""
    b = b.astype(np.uint32)
    kept = b >> U32(16)
    out = kept + rounding(b & _U32_LOW16, U32(0x8000), kept)  # a carry steps the exponent, up to infinity
    nan = (b & U32(0x7FFFFFFF)) > _U32_EXP
    return np.where(nan, kept | U32(0x0040), out).astype(np.uint32)


def narrow_f16(b: np.ndarray, rounding=_round_up) -> np.ndarray:
    """binary32 bits -> binary16 bits (in uint32), SPEC §8."""
    b = b.astype(np.uint32)
    sign = (b >> U32(16)) & U32(0x8000)
    a = b & U32(0x7FFFFFFF)
    out = np.zeros_like(a)
    # NaN: sign, the top 10 bits of the payload, quiet bit set.
    nan = a > _U32_EXP
    out[nan] = U32(0x7E00) | ((a[nan] >> U32(13)) & U32(0x3FF))
    # |x| >= 65520 (half way from 65504 to 2^16, a tie to the even infinity).
    big = ~nan & (a >= U32(0x477FF000))
    out[big] = U32(0x7C00)
    normal = ~nan & ~big & (a >= U32(0x38800000))
    an = a[normal]
    kept = (an >> U32(13)) - U32(0x1C000)
    out[normal] = kept + rounding(an & U32(0x1FFF), U32(0x1000), kept)
    # Subnormal results: 2^-25 < |x| < 2^-14, in units of 2^-24.
    sub = ~nan & ~big & ~normal & (a > U32(0x33000000))
    asub = a[sub]
    shift = U32(126) - (asub >> U32(23))  # 14 ..= 24
    sig = (asub & _U32_7FFFFF) | U32(0x800000)
    kept = sig >> shift
    rest = sig & ((U32(1) << shift) - U32(1))
    half = U32(1) << (shift - U32(1))
    out[sub] = kept + rounding(rest, half, kept)
    # The rest (|x| <= 2^-25) is a signed zero.
    return (out | sign).astype(np.uint32)


def widen_f16(h: np.ndarray) -> np.ndarray:
    """binary16 bits -> binary32 bits, exactly (every NaN payload bit kept)."""
    h = h.astype(np.uint32)
    sign = (h & U32(0x8000)) << U32(16)
    e = (h >> U32(10)) & U32(0x1F)
    f = h & U32(0x3FF)
    out = np.where(e == U32(31), _U32_EXP | (f << U32(13)), ((e + U32(112)) << U32(23)) | (f << U32(13)))
    zero = (e == U32(0)) & (f == U32(0))
    sub = (e == U32(0)) & (f != U32(0))
    fs = f[sub]
    top = np.zeros_like(fs)  # position of the leading one of f (0 ..= 9)
    for t in range(1, 10):
        top[fs >= U32(1 << t)] = U32(t)
    out[sub] = ((top + U32(103)) << U32(23)) | ((fs << (U32(23) - top)) & _U32_7FFFFF)
    out[zero] = U32(0)
    return (out | sign).astype(np.uint32)


def narrow(bits: np.ndarray, dtype: str, rounding=_round_up) -> np.ndarray:
    """binary32 bits -> the dtype's bits (uint32; the identity for f32)."""
    if dtype == "bf16":
        return narrow_bf16(bits, rounding)
    if dtype == "f16":
        return narrow_f16(bits, rounding)
    return bits


def widen(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The dtype's bits -> binary32 bits, exactly."""
    if dtype == "bf16":
        return bits.astype(np.uint32) << U32(16)
    if dtype == "f16":
        return widen_f16(bits)
    return bits


def is_nan_bits(bits: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "f32":
        return (bits & U32(0x7FFFFFFF)) > _U32_EXP
    return (bits & U32(0x7FFF)) > U32(0x7F80 if dtype == "bf16" else 0x7C00)


# ---------------------------------------------------------------------------
# Generator vectors

def load_vectors(path: str) -> list[tuple[str, int, int, int, int, int, int]]:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                line = line.rstrip("\n")
                if not line.strip() or line.startswith("#"):
                    continue
                parts = line.split("\t")
                if len(parts) != 6:
                    raise BadInput(f"{path}:{lineno}: expected 6 tab-separated fields")
                dist = parts[0]
                if dist not in DISTRIBUTIONS:
                    raise BadInput(f"{path}:{lineno}: unknown distribution {dist!r}")
                try:
                    seed, rank, arena, index = (int(x) for x in parts[1:5])
                    bits = int(parts[5], 16)
                except ValueError as e:
                    raise BadInput(f"{path}:{lineno}: {e}") from None
                rows.append((dist, seed, rank, arena, index, bits, lineno))
    except OSError as e:
        raise BadInput(f"{path}: {e}") from None
    if not rows:
        raise BadInput(f"{path}: no vectors")
    return rows


def check_vectors(path: str) -> tuple[int, list[str]]:
    rows = load_vectors(path)
    failures = []
    for dist, seed, rank, arena, index, want, lineno in rows:
        blk = IndexBlock(np.array([index], dtype=np.uint64))
        got = int(generate_bits(dist, seed, rank, arena, blk)[0])
        if got != want:
            failures.append(
                f"{os.path.basename(path)}:{lineno}: {dist} seed={seed} rank={rank} "
                f"arena={arena} index={index}: got {got:08x}, want {want:08x}"
            )
    return len(rows), failures


# ---------------------------------------------------------------------------
# Shard plan (SPEC §2) and delivery orders (SPEC §4)

def shard_plan(n: int, world: int) -> list[tuple[int, int]]:
    """[(start_r, len_r)] for r in 0..W-1."""
    if world < 1:
        raise ValueError("world must be >= 1")
    base, extra = divmod(n, world)
    plan = []
    start = 0
    for r in range(world):
        length = base + (1 if r < extra else 0)
        plan.append((start, length))
        start += length
    check_shard_plan(n, world, plan)
    return plan


def check_shard_plan(n: int, world: int, plan: list[tuple[int, int]]) -> None:
    """Self-check: shards are contiguous, in rank order, cover [0, n)."""
    assert len(plan) == world, "one shard per rank"
    pos = 0
    for r, (start, length) in enumerate(plan):
        assert start == pos, f"shard {r} starts at {start}, expected {pos}"
        assert length >= 0
        if n < world and r >= n:
            assert length == 0 and start == n, "ranks n..W-1 own empty shards at n"
        pos += length
    assert pos == n, f"shards cover [0, {pos}), expected [0, {n})"
    lens = [l for _, l in plan]
    assert max(lens) - min(lens) <= 1


def shuffle_order(seed: int, world: int) -> list[int]:
    p = list(range(world))
    key = mix64_int(seed ^ SHUFFLE_SALT)
    for i in range(world - 1, 0, -1):
        h = mix64_int((key + i) & MASK64)
        j = (h * (i + 1)) >> 64  # high word of the 128-bit product
        p[i], p[j] = p[j], p[i]
    return p


def order_sequence(order, world: int) -> list[int]:
    if isinstance(order, list):
        return list(order)
    if order == "ascending":
        return list(range(world))
    if order == "descending":
        return list(range(world - 1, -1, -1))
    kind, _, arg = order.partition(":")
    if kind == "rotate":
        k = int(arg)
        return [(i + k) % world for i in range(world)]
    if kind == "shuffle":
        return shuffle_order(int(arg), world)
    raise BadInput(f"unknown order {order!r}")


def order_label(order) -> str:
    if isinstance(order, list):
        return "[" + ",".join(str(x) for x in order) + "]"
    kind, sep, arg = order.partition(":")
    if sep:  # rotate:K, shuffle:S: the decimal value, no leading zeros, not reduced mod W
        return f"{kind}:{int(arg)}"
    return order


# ---------------------------------------------------------------------------
# The fold (SPEC §3)

class Folder:
    """Folds one chunk of one shard: every source rank's addends for the
    same element indices, in the contract's order, in binary32."""

    def __init__(self, case: "Case", arena: int, blk: IndexBlock):
        self.case = case
        self.arena = arena
        self.blk = blk

    def slot(self, s: int) -> np.ndarray:
        c = self.case
        # The copy from source s lands in slot s: rank s's addends, the
        # generator's binary32 value rounded once to the dtype (SPEC §8).
        v = generate_values(c.distribution, c.seed, s, self.arena, self.blk)
        if c.dtype == "f32":
            return v
        return widen(narrow(v.view(np.uint32), c.dtype), c.dtype).view(np.float32)

    def chain(self, sequence: list[int]) -> np.ndarray:
        acc = self.slot(sequence[0]).copy()  # starts from the first value, not 0.0
        for s in sequence[1:]:
            np.add(acc, self.slot(s), out=acc)  # float32 + float32 -> float32
        return acc

    def tree(self, lo: int, hi: int) -> np.ndarray:
        k = hi - lo
        if k == 1:
            return self.slot(lo).copy()
        mid = lo + (k + 1) // 2  # first ceil(k/2) slots
        left = self.tree(lo, mid)
        right = self.tree(mid, hi)
        np.add(left, right, out=left)
        return left

    def fold(self, contract: str, sequence: list[int]) -> np.ndarray:
        w = self.case.world
        if contract == "fixed-order":
            out = self.chain(list(range(w)))
        elif contract == "arrival-order":
            out = self.chain(sequence)
        elif contract == "pairwise-tree":
            out = self.tree(0, w)
        else:
            raise BadInput(f"unknown contract {contract!r}")
        assert out.dtype == np.float32
        return out


def apply_mean(acc: np.ndarray, world: int) -> np.ndarray:
    scale = np.float32(1.0) / np.float32(world)  # correctly rounded binary32 reciprocal
    assert isinstance(scale, np.float32)
    np.multiply(acc, scale, out=acc)
    assert acc.dtype == np.float32
    return acc


def nan_policy_bits(values: np.ndarray, policy: str) -> np.ndarray:
    bits = values.view(np.uint32).copy()
    if policy == "canonical":
        is_nan = (np.bitwise_and(bits, _U32_EXP) == _U32_EXP) & (
            np.bitwise_and(bits, _U32_7FFFFF) != U32(0)
        )
        bits[is_nan] = _U32_QNAN
    elif policy != "preserve":
        raise BadInput(f"unknown nan_policy {policy!r}")
    return bits


def nan_policy_bits16(bits: np.ndarray, dtype: str, policy: str) -> np.ndarray:
    """The NaN policy on a 16-bit dtype's bits (SPEC §8): its own canonical NaN."""
    bits = bits.copy()
    if policy == "canonical":
        bits[is_nan_bits(bits, dtype)] = U32(CANONICAL_NAN[dtype])
    elif policy != "preserve":
        raise BadInput(f"unknown nan_policy {policy!r}")
    return bits


def le_bytes(bits: np.ndarray) -> bytes:
    return bits.astype("<u4", copy=False).tobytes()


def le_bytes16(bits: np.ndarray) -> bytes:
    return bits.astype("<u2", copy=False).tobytes()


class ChunkedSha:
    """SHA-256 of a byte stream, plus SHA-256 of each CHUNK_ELEMS-element
    piece of it (SPEC §5: chunk digests), fed in pieces of any size."""

    def __init__(self, chunk_elems: int = CHUNK_ELEMS, element_bytes: int = 4):
        self.whole = hashlib.sha256()
        self.chunk_bytes = element_bytes * chunk_elems  # a chunk counts elements, not bytes
        self.cur = hashlib.sha256()
        self.filled = 0
        self.chunks: list[str] = []

    def update(self, data: bytes) -> None:
        self.whole.update(data)
        view = memoryview(data)
        while len(view):
            take = min(len(view), self.chunk_bytes - self.filled)
            self.cur.update(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == self.chunk_bytes:
                self.chunks.append(self.cur.hexdigest())
                self.cur = hashlib.sha256()
                self.filled = 0

    def finish(self) -> "ArenaDigest":
        if self.filled:
            self.chunks.append(self.cur.hexdigest())
            self.filled = 0
        return ArenaDigest(self.whole.hexdigest(), list(self.chunks), chunk_root(self.chunks))


def chunk_root(chunks: list[str]) -> str:
    """SHA-256 of the chunk digests' raw 32-byte values, concatenated in
    chunk order (no chunks: SHA-256 of no bytes)."""
    return hashlib.sha256(b"".join(bytes.fromhex(c) for c in chunks)).hexdigest()


@dataclass
class ArenaDigest:
    sha256: str
    chunks: list[str]
    root: str


def arena_digest(case: "Case", arena: int, policy: str, chunk: int,
                 contract: str | None = None, sequence: list[int] | None = None,
                 tamper=None) -> ArenaDigest:
    """Digests of rank 0's reduced arena (every rank ends with the same
    shards, SPEC §3), folding shard by shard, `chunk` elements at a time."""
    n = case.arenas[arena]
    contract = contract or case.contract
    sequence = sequence if sequence is not None else case.sequence
    h = ChunkedSha(element_bytes=ELEMENT_BYTES[case.dtype])
    for start, length in shard_plan(n, case.world):
        pos = start
        while pos < start + length:
            stop = min(pos + chunk, start + length)
            blk = IndexBlock.range(pos, stop)
            acc = Folder(case, arena, blk).fold(contract, sequence)
            if case.mean:
                acc = apply_mean(acc, case.world)
            h.update(result_bytes(case, acc, policy, pos, tamper))
            pos = stop
    return h.finish()


def result_bytes(case: "Case", acc: np.ndarray, policy: str, pos: int = 0, tamper=None) -> bytes:
    """The hashed bytes of a block of reduced binary32 sums (SPEC §5, §8)."""
    if case.dtype == "f32":
        bits = nan_policy_bits(acc, policy)
        if tamper is not None:
            bits = tamper(pos, bits)
        return le_bytes(bits)
    # One rounding to the dtype, after the chain and the mean (SPEC §8).
    bits = nan_policy_bits16(narrow(acc.view(np.uint32), case.dtype), case.dtype, policy)
    if tamper is not None:
        bits = tamper(pos, bits)
    return le_bytes16(bits)


def scatter_digest(case: "Case", arena: int, policy: str, chunk: int) -> ArenaDigest:
    """SPEC §3, reduce-scatter: rank r ends with shard r, folded as the
    all-reduce folds it (mean, then nothing else); the arena digest is over
    what the ranks hold, concatenated in rank order. A 16-bit shard is
    rounded once, after the mean, and hashed in the dtype (SPEC §8.4)."""
    n = case.arenas[arena]
    plan = shard_plan(n, case.world)
    held = [plan[r] for r in range(case.world)]  # the shard rank r ends with
    h = ChunkedSha(element_bytes=ELEMENT_BYTES[case.dtype])
    for holder in range(case.world):
        start, length = held[holder]
        pos = start
        while pos < start + length:
            stop = min(pos + chunk, start + length)
            blk = IndexBlock.range(pos, stop)
            acc = Folder(case, arena, blk).fold(case.contract, case.sequence)
            acc = apply_mean(acc, case.world) if case.mean else acc
            h.update(result_bytes(case, acc, policy))
            pos = stop
    return h.finish()


# ---------------------------------------------------------------------------
# Order sensitivity (SPEC §7)

@dataclass
class Sensitivity:
    changed: int
    checked: int
    sample: str


def sensitivity(case: "Case", chunk: int) -> Sensitivity:
    """Elements whose ascending fixed-order chain and descending chain
    differ in bits (any NaN equals any NaN), unscaled, over every S-th
    element of each arena counted from its index 0."""
    total = sum(case.arenas)
    stride = max(1, -(-total // SENSITIVITY_CAP))
    w = case.world
    changed = checked = 0
    for arena, n in enumerate(case.arenas):
        origin = 0  # each arena is sampled from its own index 0
        picks = -(-(n - origin) // stride) if n > origin else 0
        for first in range(0, picks, chunk):
            idx = np.arange(first, min(first + chunk, picks), dtype=np.uint64) * U64(stride) + U64(origin)
            f = Folder(case, arena, IndexBlock(idx))
            fwd = f.chain(list(range(w)))
            rev = f.chain(list(range(w - 1, -1, -1)))
            # compared before any mean scaling, as the dtype's bits (SPEC §8)
            fb = narrow(fwd.view(np.uint32), case.dtype)
            rb = narrow(rev.view(np.uint32), case.dtype)
            same = (fb == rb) | (is_nan_bits(fb, case.dtype) & is_nan_bits(rb, case.dtype))
            changed += int(np.count_nonzero(~same))
            checked += int(idx.shape[0])
    return Sensitivity(changed, checked, "every element" if stride == 1 else f"stride {stride}")


# ---------------------------------------------------------------------------
# Experiments (EXPERIMENTS.md)

PARAM_ORDER = ("world", "arenas", "order", "seed", "distribution", "contract", "mean", "dtype",
               "collective", "rounds")
SWEEPABLE = ("world", "arenas", "order", "seed", "distribution", "contract", "mean", "dtype",
             "collective")
COLLECTIVES = ("all-reduce", "reduce-scatter")
BUILTIN_DEFAULTS = {
    "order": "ascending",
    "seed": 0,
    "distribution": "mixed-magnitude",
    "contract": "fixed-order",
    "mean": False,
    "dtype": "f32",
    "collective": "all-reduce",
    "rounds": 1,
}
MAX_CASES = 4096
MAX_BYTES = 1 << 40
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class Case:
    experiment: str
    id: str
    world: int
    arenas: list[int]
    order: object
    seed: int
    distribution: str
    contract: str
    mean: bool
    dtype: str
    collective: str
    rounds: int
    sequence: list[int] = field(default_factory=list)

    @property
    def key(self) -> str:
        # SPEC §6: a reduce-scatter says so after the contract; §6, §8: the
        # dtype after the lengths, absent for f32.
        collective = "/reduce-scatter" if self.collective == "reduce-scatter" else ""
        dtype = "" if self.dtype == "f32" else f"/{self.dtype}"
        return (
            f"{self.contract}{collective}/{'mean' if self.mean else 'sum'}/W{self.world}/"
            f"n{'+'.join(str(x) for x in self.arenas)}{dtype}/{self.distribution}/"
            f"s{self.seed}/{order_label(self.order)}"
        )

    @property
    def group_key(self) -> str:
        return self.key.rsplit("/", 1)[0]

    @property
    def addends(self) -> int:
        return self.world * sum(self.arenas)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_param(where: str, name: str, v):
    """Type / range check of one parameter value; returns the value."""
    if name == "world":
        if not _is_int(v) or not 1 <= v <= 65536:
            raise BadInput(f"{where}: field `world`: expected an integer 1 ..= 65536, got {v!r}")
    elif name == "arenas":
        if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
            raise BadInput(f"{where}: field `arenas`: expected an array of lengths >= 0, got {v!r}")
        if not v:
            raise BadInput(f"{where}: field `arenas`: empty array")
    elif name == "order":
        if isinstance(v, list):
            if not all(_is_int(x) and x >= 0 for x in v):
                raise BadInput(f"{where}: field `order`: permutation must list ranks, got {v!r}")
        elif isinstance(v, str):
            if v not in ("ascending", "descending"):
                m = re.fullmatch(r"(rotate|shuffle):([0-9]+)", v)
                if not m:
                    raise BadInput(f"{where}: field `order`: unknown order {v!r}")
                if int(m.group(2)) > MASK64:
                    raise BadInput(f"{where}: field `order`: {v!r} out of range")
        else:
            raise BadInput(f"{where}: field `order`: expected a string or an array, got {v!r}")
    elif name == "seed":
        if not _is_int(v) or not 0 <= v <= MASK64:
            raise BadInput(f"{where}: field `seed`: expected an integer >= 0, got {v!r}")
    elif name == "distribution":
        if v not in DISTRIBUTIONS:
            raise BadInput(f"{where}: field `distribution`: unknown distribution {v!r}")
    elif name == "contract":
        if v not in CONTRACTS:
            raise BadInput(f"{where}: field `contract`: unknown contract {v!r}")
    elif name == "mean":
        if not isinstance(v, bool):
            raise BadInput(f"{where}: field `mean`: expected a bool, got {v!r}")
    elif name == "dtype":
        if v not in DTYPES:
            raise BadInput(f"{where}: field `dtype`: unknown dtype {v!r}")
    elif name == "collective":
        if v not in COLLECTIVES:
            raise BadInput(f"{where}: field `collective`: unknown collective {v!r}")
    elif name == "rounds":
        if not _is_int(v) or not 1 <= v <= 1000:
            raise BadInput(f"{where}: field `rounds`: expected an integer 1 ..= 1000, got {v!r}")
    return v


def _check_unknown(where: str, table: dict, allowed) -> None:
    for k in table:
        if k not in allowed:
            raise BadInput(f"{where}: unknown field `{k}`, expected one of "
                           + ", ".join(f"`{a}`" for a in allowed))


def _make_case(path: str, exp: str, cid: str, params: dict) -> Case:
    where = f"{path}: case `{cid}`"
    for req in ("world", "arenas"):
        if req not in params:
            raise BadInput(f"{where}: missing required field `{req}`")
    full = dict(BUILTIN_DEFAULTS)
    full.update(params)
    for k in PARAM_ORDER:
        _check_param(where, k, full[k])
    case = Case(experiment=exp, id=cid, **{k: full[k] for k in PARAM_ORDER})
    w = case.world
    if isinstance(case.order, list):
        if sorted(case.order) != list(range(w)):
            seen = set()
            for x in case.order:
                if x in seen:
                    raise BadInput(f"{where}: field `order`: permutation {case.order} names rank {x} twice")
                seen.add(x)
            raise BadInput(f"{where}: field `order`: {case.order} is not a permutation of 0..{w}")
    case.sequence = order_sequence(case.order, w)
    assert sorted(case.sequence) == list(range(w))
    if case.addends * 4 > MAX_BYTES:
        raise BadInput(f"{where}: W x total length x 4 bytes exceeds 1 TiB")
    return case


def _id_value(name: str, v) -> str:
    # EXPERIMENTS.md, "Cases and sweeps": one part per multi-valued list.
    if name == "world":
        return f"W={v}"
    if name == "arenas":
        return "n=" + "+".join(str(x) for x in v)
    if name == "order":
        return "[" + " ".join(str(x) for x in v) + "]" if isinstance(v, list) else v
    if name == "seed":
        return f"seed={v}"
    if name == "mean":
        return "mean=true" if v else "mean=false"
    return str(v)


def load_experiment(path: str) -> tuple[str, list[Case]]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise BadInput(f"{path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise BadInput(f"{path}: {e}") from None
    _check_unknown(path, doc, ("name", "description", "defaults", "case", "sweep"))
    name = doc.get("name")
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise BadInput(f"{path}: field `name`: expected letters, digits, - _ . (got {name!r})")
    if "description" in doc and not isinstance(doc["description"], str):
        raise BadInput(f"{path}: field `description`: expected a string")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise BadInput(f"{path}: `defaults` must be a table")
    _check_unknown(f"{path}: [defaults]", defaults, PARAM_ORDER)
    for k, v in defaults.items():
        _check_param(f"{path}: [defaults]", k, v)

    cases: list[Case] = []
    ids: set[str] = set()

    def add(case: Case):
        if case.id in ids:
            raise BadInput(f"{path}: case id `{case.id}` is not unique")
        ids.add(case.id)
        cases.append(case)
        if len(cases) > MAX_CASES:
            raise BadInput(f"{path}: more than {MAX_CASES} cases")

    explicit = doc.get("case", [])
    if not isinstance(explicit, list) or not all(isinstance(t, dict) for t in explicit):
        raise BadInput(f"{path}: `case` must be an array of tables ([[case]])")
    for i, table in enumerate(explicit):
        cid = table.get("id")
        if not isinstance(cid, str) or not cid:
            raise BadInput(f"{path}: [[case]] #{i + 1}: missing or invalid `id`")
        _check_unknown(f"{path}: case `{cid}`", table, ("id",) + PARAM_ORDER)
        params = dict(defaults)
        params.update({k: v for k, v in table.items() if k != "id"})
        add(_make_case(path, name, cid, params))

    sweeps = doc.get("sweep", [])
    if not isinstance(sweeps, list) or not all(isinstance(t, dict) for t in sweeps):
        raise BadInput(f"{path}: `sweep` must be an array of tables ([[sweep]])")
    for i, table in enumerate(sweeps):
        sid = table.get("id")
        if not isinstance(sid, str) or not sid:
            raise BadInput(f"{path}: [[sweep]] #{i + 1}: missing or invalid `id`")
        where = f"{path}: sweep `{sid}`"
        _check_unknown(where, table, ("id",) + PARAM_ORDER)
        axes = []  # (name, values) in the parameter-table order
        for k in PARAM_ORDER:
            if k not in table:
                continue
            v = table[k]
            if k not in SWEEPABLE:
                continue  # rounds: one value for the whole sweep
            if not isinstance(v, list) or not v:
                raise BadInput(f"{where}: field `{k}`: a sweep lists values (non-empty array)")
            axes.append((k, v))
        total = math.prod(len(v) for _, v in axes) if axes else 1
        if len(cases) + total > MAX_CASES:
            raise BadInput(f"{where}: expands past {MAX_CASES} cases")
        for combo in itertools.product(*(v for _, v in axes)):
            params = dict(defaults)
            if "rounds" in table:
                params["rounds"] = table["rounds"]
            varying = []
            for (k, values), v in zip(axes, combo):
                params[k] = v
                if len(values) > 1:
                    varying.append(_id_value(k, v))
            cid = f"{sid}[{','.join(varying)}]" if varying else sid
            add(_make_case(path, name, cid, params))

    keys: dict[str, str] = {}
    for c in cases:
        if c.key in keys:
            raise BadInput(f"{path}: cases `{keys[c.key]}` and `{c.id}` have the same key {c.key}")
        keys[c.key] = c.id
    return name, cases


@dataclass
class GoldenFile:
    policy: str
    chunk_elems: int | None        # None: the golden has no chunk digests
    cases: dict[str, dict]         # by key
    order: list[tuple[str, str]]   # (key, id) in file order


def load_golden(path: str, experiment: str) -> GoldenFile:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise BadInput(f"{path}: {e}") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != "foldprint-golden" or doc.get("version") != 1:
        raise BadInput(f"{path}: not a foldprint-golden version 1 file")
    if doc.get("experiment") != experiment:
        raise BadInput(f"{path}: golden is for experiment {doc.get('experiment')!r}, not {experiment!r}")
    policy = doc.get("nan_policy", "canonical")
    if policy not in ("canonical", "preserve"):
        raise BadInput(f"{path}: unknown nan_policy {policy!r}")
    chunk_elems = doc.get("chunk_elems")
    if chunk_elems is not None and (not _is_int(chunk_elems) or chunk_elems < 1):
        raise BadInput(f"{path}: chunk_elems must be a positive integer, got {chunk_elems!r}")
    out = {}
    order = []
    for c in doc.get("cases", []):
        if not isinstance(c, dict) or not isinstance(c.get("key"), str) or not isinstance(c.get("arenas"), list):
            raise BadInput(f"{path}: malformed case entry {c!r}")
        if c["key"] in out:
            raise BadInput(f"{path}: key {c['key']} listed twice")
        n = len(c["arenas"])
        roots, chunks = c.get("chunk_root"), c.get("chunk_sha256")
        if (roots is None) != (chunks is None) or (roots is not None and chunk_elems is None):
            raise BadInput(f"{path}: {c['key']}: chunk_root, chunk_sha256 and chunk_elems go together")
        if roots is not None and (not isinstance(roots, list) or not isinstance(chunks, list)
                                  or len(roots) != n or len(chunks) != n
                                  or not all(isinstance(x, list) for x in chunks)):
            raise BadInput(f"{path}: {c['key']}: chunk_root and chunk_sha256 need one entry per arena")
        sens = c.get("sensitivity")
        if sens is not None and (not isinstance(sens, dict) or not _is_int(sens.get("changed"))
                                 or not _is_int(sens.get("checked"))
                                 or not isinstance(sens.get("sample"), str)):
            raise BadInput(f"{path}: {c['key']}: sensitivity needs changed, checked and sample")
        out[c["key"]] = c
        order.append((c["key"], c.get("id")))
    return GoldenFile(policy, chunk_elems, out, order)


# ---------------------------------------------------------------------------
# Verification

def expand_experiment_args(args: list[str]) -> list[str]:
    files = []
    for a in args:
        if os.path.isdir(a):
            files.extend(sorted(os.path.join(a, f) for f in os.listdir(a) if f.endswith(".toml")))
        elif os.path.isfile(a):
            files.append(a)
        else:
            raise BadInput(f"{a}: no such file or directory")
    if not files:
        raise BadInput("no experiment files given")
    return files


def compare_case(name: str, case: "Case", g: dict, gf: GoldenFile, policy: str, chunk: int,
                 problems: list[str], counts: dict[str, int]) -> bool:
    """Recompute one case and compare everything its golden entry pins:
    arena digests, chunk digests and roots (SPEC §5), sensitivity (§7).
    Appends one line per disagreement; returns whether the case matched."""
    where = f"{name}: {case.key}"
    digest = scatter_digest if case.collective == "reduce-scatter" else arena_digest
    digests = [digest(case, k, policy, chunk) for k in range(len(case.arenas))]
    want = g["arenas"]
    if len(want) != len(digests):
        problems.append(f"{where}: {len(digests)} arenas here, {len(want)} in golden")
        return False
    ok = True
    for k, (got, exp) in enumerate(zip(digests, want)):
        counts["digests"] += 1
        if got.sha256 != exp:
            ok = False
            problems.append(f"{where} arena {k}: computed {got.sha256}, golden {exp}")
    if gf.chunk_elems is not None:
        if gf.chunk_elems != CHUNK_ELEMS:
            problems.append(f"{where}: golden chunks of {gf.chunk_elems} elements, SPEC §5 says {CHUNK_ELEMS}")
            return False
        for k, got in enumerate(digests):
            counts["chunk roots"] += 1
            counts["chunk digests"] += len(got.chunks)
            if got.root != g["chunk_root"][k]:
                ok = False
                problems.append(f"{where} arena {k}: chunk root {got.root}, golden {g['chunk_root'][k]}")
            if got.chunks != g["chunk_sha256"][k]:
                ok = False
                bad = [i for i in range(max(len(got.chunks), len(g["chunk_sha256"][k])))
                       if got.chunks[i:i + 1] != g["chunk_sha256"][k][i:i + 1]]
                problems.append(f"{where} arena {k}: {len(bad)} chunk digest(s) differ (first: chunk "
                                f"{bad[0]}; {len(got.chunks)} chunks here, {len(g['chunk_sha256'][k])} in golden)")
    if g.get("sensitivity") is not None:
        counts["sensitivities"] += 1
        got = sensitivity(case, chunk)
        exp = g["sensitivity"]
        if (got.changed, got.checked, got.sample) != (exp["changed"], exp["checked"], exp["sample"]):
            ok = False
            problems.append(f"{where}: sensitivity {got.changed} of {got.checked} ({got.sample}), golden "
                            f"{exp['changed']} of {exp['checked']} ({exp['sample']})")
    return ok


def verify(files: list[str], golden_dir: str, skip_larger_than: int | None, chunk: int,
           verbose: bool, strict: bool = False, fail_fast: bool = False) -> int:
    loaded = []
    for path in files:
        name, cases = load_experiment(path)
        gpath = os.path.join(golden_dir, f"{name}.json")
        loaded.append((name, cases, load_golden(gpath, name)))

    rows = []
    problems: list[str] = []
    id_notes = []
    counts = {"digests": 0, "chunk digests": 0, "chunk roots": 0, "sensitivities": 0}
    stop = False
    for name, cases, gf in loaded:
        t0 = time.perf_counter()
        checked = skipped = bad = 0
        declared = [(c.key, c.id) for c in cases]
        for key in gf.cases:
            if key not in {k for k, _ in declared}:
                bad += 1
                problems.append(f"{name}: {key} (case `{gf.cases[key].get('id')}` of the golden): "
                                "the experiment does not declare it")
                stop = stop or fail_fast
        if strict and [k for k, _ in declared] != [k for k, _ in gf.order] \
                and set(k for k, _ in declared) == set(gf.cases):
            bad += 1
            first = next(i for i, (a, b) in enumerate(zip(declared, gf.order)) if a[0] != b[0])
            problems.append(f"{name}: cases in another order than the golden's: position {first} holds "
                            f"(case `{declared[first][1]}`) here, `{gf.order[first][1]}` in golden")
            stop = stop or fail_fast
        for case in cases:
            if stop:
                break
            if skip_larger_than is not None and case.addends > skip_larger_than:
                skipped += 1
                continue
            g = gf.cases.get(case.key)
            checked += 1
            if g is None:
                bad += 1
                problems.append(f"{name}: {case.key} (case `{case.id}`): no golden entry")
                stop = fail_fast
                continue
            if g.get("id") is not None and g.get("id") != case.id:
                note = f"{name}: {case.key}: id `{case.id}` here, `{g.get('id')}` in golden"
                if strict:
                    bad += 1
                    problems.append(note)
                    stop = fail_fast
                    continue
                id_notes.append(note)
            tc = time.perf_counter()
            if not compare_case(name, case, g, gf, gf.policy, chunk, problems, counts):
                bad += 1
                stop = fail_fast
            if verbose:
                print(f"  {name}: {case.id}: {case.key}: {time.perf_counter() - tc:.2f}s", file=sys.stderr)
        rows.append((name, gf.policy, len(cases), checked, skipped, bad, time.perf_counter() - t0))

    print(f"{'experiment':<14} {'policy':<9} {'cases':>5} {'checked':>7} {'skipped':>7} {'result':<14} {'time':>8}")
    for name, policy, total, checked, skipped, bad, dt in rows:
        result = "ok" if bad == 0 else f"MISMATCH ({bad})"
        print(f"{name:<14} {policy:<9} {total:>5} {checked:>7} {skipped:>7} {result:<14} {dt:>7.2f}s")
    print("compared: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for note in id_notes:
        print(f"note: {note}")
    if problems:
        print()
        for p in problems:
            print(f"mismatch: {p}")
        return 1
    print("all checked digests, chunk digests and sensitivities match the goldens")
    return 0


# ---------------------------------------------------------------------------
# Self-test (negative controls)

def self_test(vectors: str, experiments_dir: str, golden_dir: str, chunk: int) -> int:
    ok = True

    def report(label: str, passed: bool, detail: str = ""):
        nonlocal ok
        ok &= passed
        print(f"[{'PASS' if passed else 'FAIL'}] {label}{': ' + detail if detail else ''}")

    # (a) generator vectors
    count, failures = check_vectors(vectors)
    report(f"generator vectors ({count})", not failures, "; ".join(failures[:3]))

    # scalar Python-int reference agrees with the numpy path on a range
    idx = [0, 1, 2, 3, 1 << 32, (1 << 40) + 3, MASK64]
    blk = IndexBlock(np.array(idx, dtype=np.uint64))
    vec = blk.u64(12345, 6, 2)
    report("numpy uint64 mix64 == Python-int mix64",
           all(int(vec[i]) == u_int(12345, 6, 2, x) for i, x in enumerate(idx)))

    # binary32 arithmetic really is binary32
    a = np.array([16777216.0], dtype=np.float32)
    b = np.array([1.0], dtype=np.float32)
    s = a + b
    report("float32 add rounds in binary32 (2^24 + 1 == 2^24)",
           s.dtype == np.float32 and float(s[0]) == 16777216.0)
    tiny = np.array([1e-45], dtype=np.float32)  # smallest subnormal
    report("no flush-to-zero (subnormal + subnormal != 0)", float((tiny + tiny)[0]) != 0.0)
    report("mean scale 1/3 is the binary32 reciprocal",
           (np.float32(1.0) / np.float32(3)).view(np.uint32) == U32(0x3EAAAAAB))

    # shard plan self-check over many shapes
    try:
        for n in list(range(0, 70)) + [97, 8191, 10007, 1 << 25]:
            for w in (1, 2, 3, 5, 7, 8, 13, 61, 64, 65536):
                shard_plan(n, w)
        report("shard plan covers [0, n) in rank order", True)
    except AssertionError as e:
        report("shard plan covers [0, n) in rank order", False, str(e))

    # shuffle yields permutations
    report("shuffle:SEED yields permutations",
           all(sorted(shuffle_order(sd, w)) == list(range(w)) for sd in range(20) for w in (1, 2, 3, 8, 64)))

    # (b) a small golden case: forward must match, reversed must not
    smoke = os.path.join(experiments_dir, "smoke.toml")
    name, cases = load_experiment(smoke)
    gf = load_golden(os.path.join(golden_dir, f"{name}.json"), name)
    policy, golden = gf.policy, gf.cases
    case = next(c for c in cases if c.contract == "fixed-order" and c.world >= 3
                and c.distribution == "mixed-magnitude" and c.key in golden and not c.mean)
    want = golden[case.key]["arenas"][0]
    fwd = arena_digest(case, 0, policy, chunk).sha256
    report(f"positive control {case.key} arena 0 matches golden", fwd == want,
           f"computed {fwd}, golden {want}")
    rev = arena_digest(case, 0, policy, chunk, contract="arrival-order",
                       sequence=list(range(case.world - 1, -1, -1))).sha256
    report("negative control: reversed chain differs from golden", rev != want,
           f"reversed {rev[:16]}..., golden {want[:16]}...")
    # chunking must not change anything
    small = arena_digest(case, 0, policy, 37).sha256
    report("fold pass size does not change the digest", small == fwd)

    # (c) one flipped bit changes the digest
    def flip(pos, bits):
        if pos == 0:
            bits = bits.copy()
            bits[0] ^= U32(1)
        return bits

    flipped = arena_digest(case, 0, policy, chunk, tamper=flip).sha256
    report("negative control: one flipped bit changes the digest", flipped != fwd and flipped != want)

    # NaN policy: payload NaNs become 0x7FC00000, infinities untouched
    vals = np.array([0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001],
                    dtype=np.uint32).view(np.float32)
    got = nan_policy_bits(vals, "canonical").tolist()
    report("canonical NaN policy", got == [0x7FC00000, 0x7FC00000, 0x7F800000, 0xFF800000,
                                           0x80000000, 0x00000001])
    report("empty arena digest", hashlib.sha256(le_bytes(np.empty(0, np.uint32))).hexdigest() == EMPTY_SHA256)

    # chunk digests (SPEC §5): split at 65536 elements whatever the pieces fed
    data = np.arange(3 * CHUNK_ELEMS + 5, dtype=np.uint32)
    whole = ChunkedSha()
    whole.update(le_bytes(data))
    pieces = ChunkedSha()
    for a in range(0, data.shape[0], 12345):
        pieces.update(le_bytes(data[a:a + 12345]))
    d1, d2 = whole.finish(), pieces.finish()
    direct = [hashlib.sha256(le_bytes(data[a:a + CHUNK_ELEMS])).hexdigest()
              for a in range(0, data.shape[0], CHUNK_ELEMS)]
    report("chunk digests: 4 chunks, the last of 5 elements, any feeding",
           d1.chunks == d2.chunks == direct and len(direct) == 4 and d1.sha256 == d2.sha256)
    empty = ChunkedSha().finish()
    report("empty arena: no chunks, chunk root = SHA-256 of no bytes",
           empty.chunks == [] and empty.root == EMPTY_SHA256 == empty.sha256)
    one = ChunkedSha()
    one.update(le_bytes(data[:7]))
    one = one.finish()
    report("one chunk: its digest is the arena's; the root hashes its 32 raw bytes",
           one.chunks == [one.sha256] and one.root == hashlib.sha256(bytes.fromhex(one.sha256)).hexdigest())

    # SPEC §8: the conversions, against numpy's IEEE binary16 and an exact
    # nearest-even rounding for bfloat16, on edges and a random sample.
    rng = np.random.default_rng(33)
    edges = np.concatenate([np.arange(a - 4096, a + 4096, dtype=np.int64) for a in (
        0x477FE000, 0x477FF000, 0x38800000, 0x387FF000, 0x33000000, 0x33800000, 0x3F808000,
        0x00008000, 0x7F7F8000, 0x7F800000, 0x33C00000, 0x00000000)])
    edges = (edges & 0xFFFFFFFF).astype(np.uint32)
    sample = np.concatenate([edges, edges | U32(0x80000000),
                             rng.integers(0, 1 << 32, size=1 << 20, dtype=np.uint64).astype(np.uint32)])
    finite = sample[~is_nan_bits(sample, "f32")]
    want16 = finite.view(np.float32).astype(np.float16).view(np.uint16).astype(np.uint32)
    report(f"f16 narrowing == numpy's binary16 conversion ({finite.shape[0]} inputs)",
           bool(np.array_equal(narrow_f16(finite), want16)))
    x = finite.view(np.float32).astype(np.float64)
    lo = (finite & U32(0xFFFF0000))
    up = lo + U32(0x10000)
    dlo = np.abs(x - lo.view(np.float32).astype(np.float64))
    with np.errstate(all="ignore"):
        dup = np.where((up & _U32_EXP) == _U32_EXP, np.abs(x - np.sign(x) * 2.0 ** 128),
                       np.abs(up.view(np.float32).astype(np.float64) - x))
    pick_up = (dup < dlo) | ((dup == dlo) & (((lo >> U32(16)) & U32(1)) == U32(1)))
    want_bf = np.where(pick_up, up, lo) >> U32(16)
    report("bf16 narrowing == exact nearest-even (ties to even, overflow to infinity)",
           bool(np.array_equal(narrow_bf16(finite), want_bf)))
    every = np.arange(1 << 16, dtype=np.uint32)
    real = ~is_nan_bits(every, "f16")
    report("f16 widening == numpy's on every non-NaN pattern",
           bool(np.array_equal(widen_f16(every[real]),
                               every[real].astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32))))
    nan16 = every[~real]
    report("f16 widening keeps every NaN payload bit",
           bool(np.all(((widen_f16(nan16) >> U32(13)) & U32(0x3FF)) == (nan16 & U32(0x3FF)))))
    for d, quiet in (("bf16", 0x0040), ("f16", 0x0200)):
        back = narrow(widen(every, d), d)
        want = np.where(is_nan_bits(every, d), every | U32(quiet), every)
        report(f"{d}: narrowing gives back every widened pattern (NaNs made quiet)",
               bool(np.array_equal(back, want)))
    nans = np.array([0x7F800001, 0xFFC12345, 0x7FFFFFFF], dtype=np.uint32)
    report("NaN narrowing keeps the sign and the top of the payload, quiet",
           narrow_bf16(nans).tolist() == [0x7FC0, 0xFFC1, 0x7FFF]
           and narrow_f16(nans).tolist() == [0x7E00, 0xFE09, 0x7FFF])
    report("canonical NaN per dtype",
           nan_policy_bits16(np.array([0x7F81, 0xFFC1, 0x7F80], np.uint32), "bf16", "canonical").tolist()
           == [0x7FC0, 0x7FC0, 0x7F80]
           and nan_policy_bits16(np.array([0x7C01, 0xFE00, 0x7C00], np.uint32), "f16", "canonical").tolist()
           == [0x7E00, 0x7E00, 0x7C00])
    h16 = ChunkedSha(element_bytes=2)
    h16.update(le_bytes16(np.arange(CHUNK_ELEMS + 1, dtype=np.uint32) & U32(0xFFFF)))
    d16 = h16.finish()
    report("16-bit chunks: 65536 elements of 2 bytes",
           len(d16.chunks) == 2 and d16.chunks[1] == hashlib.sha256(b"\x00\x00").hexdigest())

    # A 16-bit golden case: forward must match, reversed must not.
    mp = os.path.join(experiments_dir, "mixed-precision.toml")
    if os.path.exists(mp):
        name, cases = load_experiment(mp)
        gf = load_golden(os.path.join(golden_dir, f"{name}.json"), name)
        for d in ("bf16", "f16"):
            # The case whose data sees order most: with one rounding after a
            # float32 chain, most 16-bit cases are blind (SPEC §8.7).
            case = max((c for c in cases if c.dtype == d and c.contract == "fixed-order"
                        and not c.mean and c.key in gf.cases),
                       key=lambda c: gf.cases[c.key].get("sensitivity", {}).get("changed", 0))
            want = gf.cases[case.key]["arenas"][0]
            got = arena_digest(case, 0, gf.policy, chunk).sha256
            report(f"positive control {case.key} arena 0 matches golden", got == want)
            rev = arena_digest(case, 0, gf.policy, chunk, contract="arrival-order",
                               sequence=list(range(case.world - 1, -1, -1))).sha256
            report(f"negative control: {d} reversed chain differs from golden", rev != want)
    else:
        report("experiments/mixed-precision.toml present", False)

    print("self-test", "passed" if ok else "FAILED")
    return 0 if ok else 1


# ---------------------------------------------------------------------------

def main(argv=None) -> int:
    # inf + -inf and NaN operands are part of the data (specials): no warnings.
    np.seterr(all="ignore")
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiments", nargs="*", help="experiment TOML files or directories")
    ap.add_argument("--experiments", dest="experiments_opt", nargs="+", default=[],
                    metavar="DIR_OR_FILES", help="experiment TOML files or directories")
    ap.add_argument("--golden", default=os.path.join(repo, "experiments", "golden"),
                    help="directory of <experiment>.json goldens (default: experiments/golden)")
    ap.add_argument("--skip-larger-than", type=int, default=None, metavar="N",
                    help="skip cases with more than N addends (W x total length)")
    ap.add_argument("--vectors", default=os.path.join(repo, "tests", "data", "generator-vectors.tsv"),
                    help="generator test vectors (default: tests/data/generator-vectors.tsv)")
    ap.add_argument("--no-vectors", action="store_true", help="do not check the generator vectors first")
    ap.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                    help=f"elements folded per numpy pass (default {DEFAULT_CHUNK}); "
                         "never changes a digest")
    ap.add_argument("--self-test", action="store_true",
                    help="check vectors and the negative controls, then exit")
    ap.add_argument("--strict", action="store_true",
                    help="also fail when a case id or the order of cases differs from the golden's "
                         "(EXPERIMENTS.md: sweep expansion and ids)")
    ap.add_argument("--fail-fast", action="store_true", help="stop at the first mismatching case")
    ap.add_argument("-v", "--verbose", action="store_true", help="per-case timings on stderr")
    args = ap.parse_args(argv)
    if args.chunk < 1:
        ap.error("--chunk must be >= 1")

    try:
        if args.self_test:
            exp_dir = (args.experiments_opt or args.experiments or [os.path.join(repo, "experiments")])[0]
            if not os.path.isdir(exp_dir):
                exp_dir = os.path.dirname(exp_dir) or "."
            return self_test(args.vectors, exp_dir, args.golden, args.chunk)

        if not args.no_vectors:
            count, failures = check_vectors(args.vectors)
            if failures:
                for f in failures:
                    print(f"vector mismatch: {f}")
                print(f"generator vectors: {len(failures)} of {count} FAILED")
                return 1
            print(f"generator vectors: {count} ok")
        targets = args.experiments_opt + args.experiments
        if not targets:
            targets = [os.path.join(repo, "experiments")]
        files = expand_experiment_args(targets)
        return verify(files, args.golden, args.skip_larger_than, args.chunk, args.verbose,
                      strict=args.strict, fail_fast=args.fail_fast)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
