#!/usr/bin/env python3
"""Independent verifier for foldprint digests, written from docs/SPEC.md,
docs/EXPERIMENTS.md and docs/REPORT.md alone (no foldprint source was read).

It regenerates every addend of every case with the generator of SPEC §1,
folds shard by shard (SPEC §2, §3) in binary32 with numpy, applies the NaN
policy (SPEC §5), hashes the little-endian bytes of each arena and compares
the digests with experiments/golden/<experiment>.json by case key (SPEC §6).

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

DEFAULT_CHUNK = 1 << 20


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
        # The copy from source s lands in slot s: rank s's addends.
        return generate_values(c.distribution, c.seed, s, self.arena, self.blk)

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


def le_bytes(bits: np.ndarray) -> bytes:
    return bits.astype("<u4", copy=False).tobytes()


def arena_digest(case: "Case", arena: int, policy: str, chunk: int,
                 contract: str | None = None, sequence: list[int] | None = None,
                 tamper=None) -> str:
    """SHA-256 of rank 0's reduced arena (every rank ends with the same
    shards, SPEC §3), folding shard by shard, chunk by chunk."""
    n = case.arenas[arena]
    contract = contract or case.contract
    sequence = sequence if sequence is not None else case.sequence
    h = hashlib.sha256()
    for start, length in shard_plan(n, case.world):
        pos = start
        while pos < start + length:
            stop = min(pos + chunk, start + length)
            blk = IndexBlock.range(pos, stop)
            acc = Folder(case, arena, blk).fold(contract, sequence)
            if case.mean:
                acc = apply_mean(acc, case.world)
            bits = nan_policy_bits(acc, policy)
            if tamper is not None:
                bits = tamper(pos, bits)
            h.update(le_bytes(bits))
            pos = stop
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Experiments (EXPERIMENTS.md)

PARAM_ORDER = ("world", "arenas", "order", "seed", "distribution", "contract", "mean", "rounds")
SWEEPABLE = ("world", "arenas", "order", "seed", "distribution", "contract", "mean")
BUILTIN_DEFAULTS = {
    "order": "ascending",
    "seed": 0,
    "distribution": "mixed-magnitude",
    "contract": "fixed-order",
    "mean": False,
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
    rounds: int
    sequence: list[int] = field(default_factory=list)

    @property
    def key(self) -> str:
        return (
            f"{self.contract}/{'mean' if self.mean else 'sum'}/W{self.world}/"
            f"n{'+'.join(str(x) for x in self.arenas)}/{self.distribution}/"
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
    # EXPERIMENTS.md only says "named after the sweep and the values that
    # vary"; the exact rendering is not specified. Ids are informational:
    # cases are matched by key.
    if name == "world":
        return f"W={v}"
    if name == "arenas":
        return "n=" + "+".join(str(x) for x in v)
    if name == "order":
        return "[" + " ".join(str(x) for x in v) + "]" if isinstance(v, list) else v
    if name == "seed":
        return f"s={v}"
    if name == "mean":
        return "mean" if v else "sum"
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


def load_golden(path: str, experiment: str) -> tuple[str, dict[str, dict]]:
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
    out = {}
    for c in doc.get("cases", []):
        if not isinstance(c, dict) or not isinstance(c.get("key"), str) or not isinstance(c.get("arenas"), list):
            raise BadInput(f"{path}: malformed case entry {c!r}")
        if c["key"] in out:
            raise BadInput(f"{path}: key {c['key']} listed twice")
        out[c["key"]] = c
    return policy, out


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


def verify(files: list[str], golden_dir: str, skip_larger_than: int | None, chunk: int,
           verbose: bool) -> int:
    loaded = []
    for path in files:
        name, cases = load_experiment(path)
        gpath = os.path.join(golden_dir, f"{name}.json")
        policy, golden = load_golden(gpath, name)
        loaded.append((name, cases, policy, golden))

    rows = []
    problems = []
    id_notes = []
    for name, cases, policy, golden in loaded:
        t0 = time.perf_counter()
        checked = skipped = bad = 0
        skipped_keys = set()
        for case in cases:
            if skip_larger_than is not None and case.addends > skip_larger_than:
                skipped += 1
                skipped_keys.add(case.key)
                continue
            g = golden.get(case.key)
            tc = time.perf_counter()
            digests = [arena_digest(case, k, policy, chunk) for k in range(len(case.arenas))]
            dt = time.perf_counter() - tc
            checked += 1
            if verbose:
                print(f"  {name}: {case.id}: {case.key}: {dt:.2f}s", file=sys.stderr)
            if g is None:
                bad += 1
                problems.append(f"{name}: {case.key} (case `{case.id}`): no golden entry")
                continue
            if g.get("id") is not None and g.get("id") != case.id:
                id_notes.append(f"{name}: {case.key}: id `{case.id}` here, `{g.get('id')}` in golden")
            want = g["arenas"]
            if len(want) != len(digests):
                bad += 1
                problems.append(f"{name}: {case.key}: {len(digests)} arenas here, {len(want)} in golden")
                continue
            case_bad = False
            for k, (got, exp) in enumerate(zip(digests, want)):
                if got != exp:
                    case_bad = True
                    problems.append(f"{name}: {case.key} arena {k}: computed {got}, golden {exp}")
            bad += case_bad
        declared = {c.key for c in cases}
        for key in golden:
            if key not in declared:
                bad += 1
                problems.append(f"{name}: golden lists {key}, which the experiment does not declare")
        rows.append((name, len(cases), checked, skipped, bad, time.perf_counter() - t0))

    print(f"{'experiment':<14} {'cases':>5} {'checked':>7} {'skipped':>7} {'result':<14} {'time':>8}")
    for name, total, checked, skipped, bad, dt in rows:
        result = "ok" if bad == 0 else f"MISMATCH ({bad})"
        print(f"{name:<14} {total:>5} {checked:>7} {skipped:>7} {result:<14} {dt:>7.2f}s")
    for note in id_notes:
        print(f"note: {note}")
    if problems:
        print()
        for p in problems:
            print(f"mismatch: {p}")
        return 1
    print("all checked digests match the goldens")
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
    policy, golden = load_golden(os.path.join(golden_dir, f"{name}.json"), name)
    case = next(c for c in cases if c.contract == "fixed-order" and c.world >= 3
                and c.distribution == "mixed-magnitude" and c.key in golden and not c.mean)
    want = golden[case.key]["arenas"][0]
    fwd = arena_digest(case, 0, policy, chunk)
    report(f"positive control {case.key} arena 0 matches golden", fwd == want,
           f"computed {fwd}, golden {want}")
    rev = arena_digest(case, 0, policy, chunk, contract="arrival-order",
                       sequence=list(range(case.world - 1, -1, -1)))
    report("negative control: reversed chain differs from golden", rev != want,
           f"reversed {rev[:16]}..., golden {want[:16]}...")
    # chunking must not change anything
    small = arena_digest(case, 0, policy, 37)
    report("chunk size does not change the digest", small == fwd)

    # (c) one flipped bit changes the digest
    def flip(pos, bits):
        if pos == 0:
            bits = bits.copy()
            bits[0] ^= U32(1)
        return bits

    flipped = arena_digest(case, 0, policy, chunk, tamper=flip)
    report("negative control: one flipped bit changes the digest", flipped != fwd and flipped != want)

    # NaN policy: payload NaNs become 0x7FC00000, infinities untouched
    vals = np.array([0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001],
                    dtype=np.uint32).view(np.float32)
    got = nan_policy_bits(vals, "canonical").tolist()
    report("canonical NaN policy", got == [0x7FC00000, 0x7FC00000, 0x7F800000, 0xFF800000,
                                           0x80000000, 0x00000001])
    report("empty arena digest", hashlib.sha256(le_bytes(np.empty(0, np.uint32))).hexdigest() == EMPTY_SHA256)

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
                    help=f"elements per fold chunk (default {DEFAULT_CHUNK})")
    ap.add_argument("--self-test", action="store_true",
                    help="check vectors and the negative controls, then exit")
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
        return verify(files, args.golden, args.skip_larger_than, args.chunk, args.verbose)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
