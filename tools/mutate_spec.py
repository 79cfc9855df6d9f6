#!/usr/bin/env python3
"""Mutation check of the goldens: does every rule of docs/SPEC.md have a
golden that fails when an implementation gets that one rule wrong?

Each mutation below breaks one rule in a temporary copy of
tools/verify_spec.py (the independent implementation written from the
spec) by replacing exact source text, then runs the copy against the
committed goldens (without the generator vectors, so the goldens alone must
catch it). A mutation is *caught* when the copy exits 1 naming a case; the
first case named is printed. Rules that by design cannot change a digest
(the shard plan, SPEC §3) are mutated too and must NOT be caught, which
shows that claim. Each copy is also run against the generator vectors,
which is the other place a generator rule is pinned.

Exit codes: 0 every mutation behaved as expected (and the unmutated copy
passes); 1 a mutation escaped the goldens, an "unobservable" one was caught,
or the baseline failed; 2 a mutation's source text is not found exactly once
in verify_spec.py (the script and the verifier drifted apart).

Usage: python3 tools/mutate_spec.py [--markdown] [--only ID ...] [-j N]
Requirements: those of verify_spec.py (Python >= 3.11, numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VERIFIER = os.path.join(HERE, "verify_spec.py")

# Experiments in the order they are checked: the file of targeted cases
# first, so that the case named is the one written for the rule when it
# catches it, and the slowest last. large.toml is left out (over 10^8
# addends): every rule is caught without it.
EXPERIMENTS = [
    "experiments/spec-rules.toml",
    "experiments/preserve/nan-payloads.toml",
    "experiments/smoke.toml",
    "experiments/order-sweep.toml",
    "experiments/world-sweep.toml",
    "experiments/edge-cases.toml",
    "experiments/mixed-precision.toml",
    "experiments/reduce-scatter.toml",
]
GOLDEN = "experiments/golden"
VECTORS = "tests/data/generator-vectors.tsv"

FLUSH = "np.float32(1.1754944e-38)"  # smallest normal binary32


@dataclass
class Mutation:
    id: str
    section: str        # where docs/SPEC.md (or EXPERIMENTS.md) states the rule
    rule: str           # the rule, as the correct implementation follows it
    wrong: str          # what the mutant does instead
    edits: list[tuple[str, str]]  # (exact text, replacement), each found exactly once
    observable: bool = True


M = Mutation
MUTATIONS: list[Mutation] = [
    # --- §1 generator -------------------------------------------------------
    M("mix64-constant", "§1", "mix64 multiplies by 0xBF58476D1CE4E5B9", "another odd constant",
      [("MIX_M1 = 0xBF58476D1CE4E5B9", "MIX_M1 = 0xBF58476D1CE4E5BB")]),
    M("seed-salt", "§1", "SEED_SALT = 0x666F6C647072696E", "another salt",
      [("SEED_SALT = 0x666F6C647072696E", "SEED_SALT = 0x666F6C647072696F")]),
    M("gamma", "§1", "index * GAMMA, GAMMA = 0x9E3779B97F4A7C15", "another odd GAMMA",
      [("GAMMA = 0x9E3779B97F4A7C15", "GAMMA = 0x9E3779B97F4A7C17")]),
    M("lane-key-order", "§1", "lane_key mixes rank, then arena", "arena, then rank",
      [("mix64_int(mix64_int(mix64_int(seed ^ SEED_SALT) ^ rank) ^ arena)",
        "mix64_int(mix64_int(mix64_int(seed ^ SEED_SALT) ^ arena) ^ rank)")]),
    M("mixed-exponent-base", "§1", "mixed-magnitude exponent from 115", "from 116",
      [("e += U32(115)", "e += U32(116)")]),
    M("mixed-exponent-span", "§1", "mixed-magnitude spans 24 binades", "23 binades",
      [("e *= U32(24)", "e *= U32(23)")]),
    M("uniform-bits", "§1", "uniform takes u >> 39", "u >> 40",
      [("_S39, _S48 = U64(39), U64(48)", "_S39, _S48 = U64(40), U64(48)")]),
    M("uniform-scale", "§1", "uniform scales by 2^-24", "by 2^-23",
      [("v *= np.float32(2.0 ** -24)", "v *= np.float32(2.0 ** -23)")]),
    M("cancellation-low-bits", "§1", "odd cancellation rank redraws its low 8 bits from its own u",
      "keeps the pair's (exact cancellation)",
      [("np.bitwise_and(p_lo, _U32_NOT_FF) | np.bitwise_and(lo, _U32_FF)",
        "np.bitwise_and(p_lo, _U32_NOT_FF) | np.bitwise_and(p_lo, _U32_FF)")]),
    M("cancellation-exponent", "§1", "cancellation exponent from 137", "from 138",
      [("e += U32(137)", "e += U32(138)")]),
    M("subnormal-share", "§1", "subnormal-heavy: e = 0 when s < 3", "when s < 2",
      [("np.where(s < U32(3), U32(0), e_hi)", "np.where(s < U32(2), U32(0), e_hi)")]),
    M("subnormal-exponent", "§1", "subnormal-heavy normal exponent 1 + ((u >> 34) & 3)",
      "1 + ((u >> 35) & 3)",
      [("e_hi = np.right_shift(hi, U32(2))", "e_hi = np.right_shift(hi, U32(3))")]),
    M("specials-selector", "§1", "specials select on (u >> 32) & 63", "on & 31",
      [("k = np.bitwise_and(hi, U32(63))", "k = np.bitwise_and(hi, U32(31))")]),
    M("specials-negative-zero", "§1", "specials k = 3 is -0.0", "+0.0",
      [("np.where(k == U32(3), U32(0x80000000), bits)", "np.where(k == U32(3), U32(0x00000000), bits)")]),
    M("nan-sign", "§1", "a NaN addend's sign is u >> 63", "always 0",
      [("nan = np.bitwise_and(hi, _U32_SIGN) | _U32_QNAN", "nan = _U32_QNAN")]),
    M("nan-payload", "§1", "a NaN addend's payload is u & 0x3FFFFF", "u & 0x1FFFFF",
      [("| np.bitwise_and(lo, _U32_3FFFFF)", "| np.bitwise_and(lo, U32(0x1FFFFF))")]),
    M("exact-integers-bits", "§1", "exact-integers take u >> 48", "u >> 49",
      [("_S39, _S48 = U64(39), U64(48)", "_S39, _S48 = U64(39), U64(49)")]),
    # --- §2 shard plan: unobservable by design -------------------------------
    M("shard-remainder-high", "§2, §3", "the remainder goes to the lowest ranks",
      "to the highest ranks (no digest can change: every owner folds the same way)",
      [("length = base + (1 if r < extra else 0)", "length = base + (1 if r >= world - extra else 0)"),
       ("    check_shard_plan(n, world, plan)\n", "")],
      observable=False),
    # --- §3 fold -------------------------------------------------------------
    M("fold-from-zero", "§3", "the chain starts from rank 0's value", "from +0.0",
      [("acc = self.slot(sequence[0]).copy()  # starts from the first value, not 0.0\n"
        "        for s in sequence[1:]:",
        "acc = np.zeros(self.blk.n, dtype=np.float32)\n        for s in sequence:")]),
    M("fixed-descending", "§3", "fixed-order adds ranks in ascending order", "in descending order",
      [("out = self.chain(list(range(w)))", "out = self.chain(list(range(w - 1, -1, -1)))")]),
    M("fixed-follows-delivery", "§3", "fixed-order ignores the delivery order", "folds in delivery order",
      [("out = self.chain(list(range(w)))", "out = self.chain(sequence)")]),
    M("arrival-ignores-order", "§3", "arrival-order folds in delivery order", "in rank order",
      [("out = self.chain(sequence)", "out = self.chain(list(range(w)))")]),
    M("arrival-inverse", "§3", "arrival-order: position i adds slot order[i]",
      "adds the inverse permutation",
      [("out = self.chain(sequence)", "out = self.chain([sequence.index(i) for i in range(w)])")]),
    M("tree-floor", "§3", "pairwise-tree: first ceil(m/2) slots", "first floor(m/2)",
      [("mid = lo + (k + 1) // 2", "mid = lo + k // 2")]),
    M("tree-power-of-two", "§3", "pairwise-tree: first ceil(m/2) slots",
      "first the largest power of two below m",
      [("mid = lo + (k + 1) // 2", "mid = lo + (1 << ((k - 1).bit_length() - 1))")]),
    M("tree-delivery-order", "§3", "pairwise-tree over slots in source-rank order", "in delivery order",
      [("return self.slot(lo).copy()", "return self.slot(self.case.sequence[lo]).copy()")]),
    M("fold-float64", "§3", "every add rounds to binary32", "accumulates in binary64, rounds once",
      [("acc = self.slot(sequence[0]).copy()", "acc = self.slot(sequence[0]).astype(np.float64)"),
       ("            np.add(acc, self.slot(s), out=acc)  # float32 + float32 -> float32\n        return acc",
        "            np.add(acc, self.slot(s), out=acc)\n        return acc.astype(np.float32)")]),
    M("ftz", "§3", "no flush-to-zero of results", "subnormal sums flushed to (signed) zero",
      [("np.add(acc, self.slot(s), out=acc)  # float32 + float32 -> float32",
        f"np.add(acc, self.slot(s), out=acc); acc[np.abs(acc) < {FLUSH}] *= np.float32(0)")]),
    M("daz", "§3", "subnormal operands are used as they are (no DAZ)", "read as zero",
      [("v = generate_values(c.distribution, c.seed, s, self.arena, self.blk)\n",
        "v = generate_values(c.distribution, c.seed, s, self.arena, self.blk)\n"
        f"        v[np.abs(v) < {FLUSH}] *= np.float32(0)\n")]),
    M("mean-divide", "§3", "mean multiplies by the rounded 1/W", "divides by W",
      [("np.multiply(acc, scale, out=acc)", "np.divide(acc, np.float32(world), out=acc)")]),
    M("mean-float64", "§3", "mean: one binary32 multiply", "x * (1/W) in binary64, rounded once",
      [("np.multiply(acc, scale, out=acc)",
        "acc[:] = (acc.astype(np.float64) * (1.0 / world)).astype(np.float32)")]),
    M("mean-addends", "§3", "mean scales the sum, never the addends", "scales each addend",
      [("v = generate_values(c.distribution, c.seed, s, self.arena, self.blk)\n",
        "v = generate_values(c.distribution, c.seed, s, self.arena, self.blk)\n"
        "        v = v * (np.float32(1.0) / np.float32(c.world)) if c.mean else v\n"),
       ("np.multiply(acc, scale, out=acc)", "pass")]),
    M("mean-ftz", "§3", "the mean's subnormal results are kept", "flushed to zero",
      [("np.multiply(acc, scale, out=acc)",
        f"np.multiply(acc, scale, out=acc); acc[np.abs(acc) < {FLUSH}] *= np.float32(0)")]),
    M("mean-ignored", "§3", "mean = true scales", "mean ignored",
      [("            if case.mean:\n                acc = apply_mean", "            if False:\n                acc = apply_mean")]),
    # --- §3 reduce-scatter ---------------------------------------------------
    M("scatter-shard-to-next-rank", "§3", "reduce-scatter: rank r ends with shard r",
      "rank r + 1 ends with shard r",
      [("held = [plan[r] for r in range(case.world)]",
        "held = [plan[(r - 1) % case.world] for r in range(case.world)]")]),
    M("scatter-reverse-ranks", "§3, §5", "reduce-scatter digest: shards concatenated in rank order",
      "in reverse rank order",
      [("for holder in range(case.world):", "for holder in reversed(range(case.world)):")]),
    M("scatter-mean-twice", "§3", "reduce-scatter mean: one multiply by the rounded 1/W",
      "the mean applied twice",
      [("acc = apply_mean(acc, case.world) if case.mean else acc",
        "acc = apply_mean(apply_mean(acc, case.world), case.world) if case.mean else acc")]),
    M("scatter-mean-ignored", "§3", "reduce-scatter with mean = true scales", "mean ignored",
      [("acc = apply_mean(acc, case.world) if case.mean else acc", "acc = acc")]),
    M("scatter-redistributes", "§3, §5", "reduce-scatter: no redistribution; the digest covers one copy of each shard",
      "redistributed anyway: the digest covers every rank's copy of the arena",
      [("start, length = held[holder]", "start, length = 0, n")]),
    # --- §4 delivery orders ---------------------------------------------------
    M("rotate-direction", "§4", "rotate:K: position i receives from (i + K) mod W", "(i - K) mod W",
      [("return [(i + k) % world for i in range(world)]", "return [(i - k) % world for i in range(world)]")]),
    M("rotate-clamp", "§4", "rotate:K takes K mod W for any K", "clamps K to W - 1",
      [("k = int(arg)", "k = min(int(arg), world - 1)")]),
    M("rotate-k-32bit", "§4", "rotate:K takes any unsigned 64-bit K", "truncates K to 32 bits",
      [("k = int(arg)", "k = int(arg) & 0xFFFFFFFF")]),
    M("descending", "§4", "descending is W-1 .. 0", "rotate:W-1",
      [("return list(range(world - 1, -1, -1))", "return [world - 1] + list(range(world - 1))")]),
    M("permutation-inverse", "§4", "[p0, p1, ...]: position i receives from p_i", "the inverse",
      [("        return list(order)\n", "        return [order.index(i) for i in range(world)]\n")]),
    M("shuffle-salt", "§4", "shuffle key = mix64(SEED ^ 0x53485546464C4521)", "another salt",
      [("SHUFFLE_SALT = 0x53485546464C4521", "SHUFFLE_SALT = 0x53485546464C4520")]),
    M("shuffle-modulo", "§4", "shuffle j = high word of h * (i + 1)", "h mod (i + 1)",
      [("j = (h * (i + 1)) >> 64", "j = h % (i + 1)")]),
    M("shuffle-direction", "§4", "shuffle i = W-1 down to 1", "i = 1 up to W-1",
      [("for i in range(world - 1, 0, -1):", "for i in range(1, world):")]),
    M("shuffle-key-xor", "§4", "shuffle h = mix64(key + i)", "mix64(key ^ i)",
      [("h = mix64_int((key + i) & MASK64)", "h = mix64_int(key ^ i)")]),
    # --- §5 NaN policy and digest bytes -------------------------------------
    M("canonical-nan-value", "§5", "canonical NaN is 0x7FC00000", "0xFFC00000",
      [("bits[is_nan] = _U32_QNAN", "bits[is_nan] = U32(0xFFC00000)")]),
    M("canonical-nan-sign", "§5", "canonical NaN drops the sign", "keeps the sign",
      [("bits[is_nan] = _U32_QNAN", "bits[is_nan] = _U32_QNAN | (bits[is_nan] & _U32_SIGN)")]),
    M("canonical-off", "§5", "canonical replaces every NaN", "replaces none",
      [("bits[is_nan] = _U32_QNAN", "pass")]),
    M("canonical-infinities", "§5", "canonical leaves infinities alone", "canonicalizes them too",
      [("np.bitwise_and(bits, _U32_7FFFFF) != U32(0)", "np.bitwise_and(bits, _U32_7FFFFF) >= U32(0)")]),
    M("preserve-canonicalizes", "§5", "preserve hashes NaNs as produced", "canonicalizes",
      [('bits = values.view(np.uint32).copy()\n    if policy == "canonical":',
        'bits = values.view(np.uint32).copy()\n    if policy in ("canonical", "preserve"):'),
       ('bits = bits.copy()\n    if policy == "canonical":',
        'bits = bits.copy()\n    if policy in ("canonical", "preserve"):')]),
    M("big-endian", "§5", "4 little-endian bytes per element", "big-endian",
      [('bits.astype("<u4", copy=False)', 'bits.astype(">u4", copy=False)')]),
    M("chunk-size", "§5", "chunks of 65536 elements", "of 65535",
      [("def __init__(self, chunk_elems: int = CHUNK_ELEMS, element_bytes: int = 4):",
        "def __init__(self, chunk_elems: int = CHUNK_ELEMS - 1, element_bytes: int = 4):")]),
    M("chunk-last-dropped", "§5", "the last, shorter chunk has a digest", "is dropped",
      [("        if self.filled:\n            self.chunks.append", "        if False:\n            self.chunks.append")]),
    M("chunk-empty-arena", "§5", "an empty arena has no chunks", "one chunk of no bytes",
      [("        if self.filled:\n            self.chunks.append",
        "        if self.filled or not self.chunks:\n            self.chunks.append")]),
    M("chunk-root-hex", "§5", "chunk root hashes the raw 32-byte digests", "their hex text",
      [("bytes.fromhex(c) for c in chunks", "c.encode() for c in chunks")]),
    # --- §8 mixed precision ---------------------------------------------------
    M("dtype-round-every-add", "§8", "a 16-bit case rounds once, after the float32 chain",
      "rounds to the dtype after every add",
      [("np.add(acc, self.slot(s), out=acc)  # float32 + float32 -> float32",
        "np.add(acc, self.slot(s), out=acc)\n"
        "            acc = widen(narrow(acc.view(np.uint32), self.case.dtype), self.case.dtype).view(np.float32)")]),
    M("bf16-truncate", "§8", "narrowing to bf16 rounds to nearest", "truncates",
      [("out = kept + rounding(b & _U32_LOW16, U32(0x8000), kept)", "out = kept")]),
    M("f16-truncate", "§8", "narrowing to f16 rounds to nearest", "truncates",
      [("out[normal] = kept + rounding(an & U32(0x1FFF), U32(0x1000), kept)", "out[normal] = kept"),
       ("out[sub] = kept + rounding(rest, half, kept)", "out[sub] = kept")]),
    M("ties-away", "§8", "ties go to the even neighbour", "ties go away from zero",
      [("return ((rest > half) | ((rest == half) & ((kept & U32(1)) == U32(1)))).astype(np.uint32)",
        "return (rest >= half).astype(np.uint32)")]),
    M("dtype-narrow-before-mean", "§8", "the mean scales the float32 sum, then the one rounding",
      "rounds to the dtype, then scales and rounds again",
      [("            if case.mean:\n                acc = apply_mean(acc, case.world)\n",
        "            if case.mean:\n"
        "                acc = widen(narrow(acc.view(np.uint32), case.dtype), case.dtype).view(np.float32)\n"
        "                acc = apply_mean(acc, case.world)\n")]),
    M("generator-truncates", "§8", "a 16-bit addend is the generator's value rounded to nearest",
      "truncated",
      [("return widen(narrow(v.view(np.uint32), c.dtype), c.dtype).view(np.float32)",
        "return widen(narrow(v.view(np.uint32), c.dtype, rounding=lambda rest, half, kept: 0 * kept), "
        "c.dtype).view(np.float32)")]),
    M("f16-saturates", "§8", "f16 overflow goes to infinity", "saturates to 65504",
      [("out[big] = U32(0x7C00)", "out[big] = np.where(a[big] == _U32_EXP, U32(0x7C00), U32(0x7BFF))")]),
    M("f16-subnormals-flushed", "§8", "f16 subnormal results are kept", "flushed to signed zero",
      [("out[sub] = kept + rounding(rest, half, kept)", "out[sub] = U32(0)")]),
    M("bf16-subnormals-flushed", "§8", "bf16 subnormal results are kept", "flushed to signed zero",
      [("return np.where(nan, kept | U32(0x0040), out).astype(np.uint32)",
        "return np.where(nan, kept | U32(0x0040), np.where((b & _U32_EXP) == U32(0), kept & U32(0x8000), out))"
        ".astype(np.uint32)")]),
    M("f16-widen-subnormal", "§8", "f16 subnormals widen to h * 2^-24", "to h * 2^-23",
      [("((top + U32(103)) << U32(23))", "((top + U32(104)) << U32(23))")]),
    M("bf16-nan-payload", "§8", "a NaN narrowed to bf16 keeps its sign and top payload bits",
      "becomes the canonical NaN with its sign",
      [("return np.where(nan, kept | U32(0x0040), out)", "return np.where(nan, (kept & U32(0x8000)) | U32(0x7FC0), out)")]),
    M("f16-nan-payload", "§8", "a NaN narrowed to f16 keeps its sign and top payload bits",
      "becomes the canonical NaN with its sign",
      [("out[nan] = U32(0x7E00) | ((a[nan] >> U32(13)) & U32(0x3FF))", "out[nan] = U32(0x7E00)")]),
    M("canonical-nan-other-dtype", "§8", "canonical NaN: bf16 0x7FC0, f16 0x7E00", "each the other's",
      [('CANONICAL_NAN = {"f32": 0x7FC00000, "bf16": 0x7FC0, "f16": 0x7E00}',
        'CANONICAL_NAN = {"f32": 0x7FC00000, "bf16": 0x7E00, "f16": 0x7FC0}')]),
    M("canonical-nan-f32-cut", "§8", "a 16-bit NaN is hashed as the dtype's canonical NaN",
      "as f32's 0x7FC00000 cut to 16 bits",
      [("bits[is_nan_bits(bits, dtype)] = U32(CANONICAL_NAN[dtype])",
        'bits[is_nan_bits(bits, dtype)] = U32(CANONICAL_NAN["f32"] & 0xFFFF)')]),
    M("canonical-nan-f32-test", "§8", "16-bit NaNs are found by their own exponent field",
      "by float32's (none is found)",
      [("bits[is_nan_bits(bits, dtype)]", 'bits[is_nan_bits(bits, "f32")]')]),
    M("chunk-bytes", "§8", "a chunk is 65536 elements in every dtype", "262144 bytes (131072 16-bit elements)",
      [("self.chunk_bytes = element_bytes * chunk_elems", "self.chunk_bytes = 4 * chunk_elems")]),
    M("dtype-4-bytes", "§8", "a 16-bit element is hashed as 2 little-endian bytes",
      "as its widened float32's 4 bytes",
      [("return le_bytes16(bits)", "return le_bytes(widen(bits, case.dtype))")]),
    M("key-f32-written", "§6, §8", "f32 keys have no dtype part", "say /f32",
      [('dtype = "" if self.dtype == "f32" else f"/{self.dtype}"', 'dtype = f"/{self.dtype}"')]),
    M("key-dtype-last", "§6, §8", "the dtype follows the lengths in the key", "ends the key",
      [('n{\'+\'.join(str(x) for x in self.arenas)}{dtype}/{self.distribution}/"\n'
        '            f"s{self.seed}/{order_label(self.order)}"',
        'n{\'+\'.join(str(x) for x in self.arenas)}/{self.distribution}/"\n'
        '            f"s{self.seed}/{order_label(self.order)}{dtype}"')]),
    M("sweep-id-dtype", "EXPERIMENTS", "sweep id part is the dtype alone", "dtype=<d>",
      [('    if name == "mean":\n        return "mean=true"',
        '    if name == "dtype":\n        return f"dtype={v}"\n    if name == "mean":\n        return "mean=true"')]),
    M("sensitivity-f32-bits", "§7, §8", "a 16-bit case's sensitivity compares the dtype's bits",
      "float32 bits",
      [("fb = narrow(fwd.view(np.uint32), case.dtype)", "fb = fwd.view(np.uint32)"),
       ("rb = narrow(rev.view(np.uint32), case.dtype)", "rb = rev.view(np.uint32)"),
       ("(is_nan_bits(fb, case.dtype) & is_nan_bits(rb, case.dtype))",
        '(is_nan_bits(fb, "f32") & is_nan_bits(rb, "f32"))')]),
    # --- §3 reduce-scatter in a 16-bit dtype (§8.4) ---------------------------
    M("scatter-dtype-unrounded", "§3, §8", "a 16-bit reduce-scatter's shards are rounded once to the dtype",
      "hashed as their float32 sums",
      [("h.update(result_bytes(case, acc, policy))", "h.update(le_bytes(nan_policy_bits(acc, policy)))")]),
    M("scatter-dtype-narrow-before-mean", "§3, §8",
      "a 16-bit reduce-scatter's mean scales the float32 sum, then the one rounding",
      "rounds to the dtype, then scales and rounds again",
      [("acc = apply_mean(acc, case.world) if case.mean else acc",
        "acc = apply_mean(widen(narrow(acc.view(np.uint32), case.dtype), case.dtype).view(np.float32), "
        "case.world) if case.mean else acc")]),
    M("scatter-dtype-chunk-bytes", "§5, §8", "a 16-bit reduce-scatter's chunk is 65536 elements",
      "262144 bytes (131072 16-bit elements)",
      [("held = [plan[r] for r in range(case.world)]  # the shard rank r ends with\n"
        "    h = ChunkedSha(element_bytes=ELEMENT_BYTES[case.dtype])",
        "held = [plan[r] for r in range(case.world)]  # the shard rank r ends with\n"
        "    h = ChunkedSha()")]),
    M("key-collective-after-dtype", "§6", "the key says reduce-scatter after the contract",
      "after the dtype",
      [("f\"{self.contract}{collective}/{'mean' if self.mean else 'sum'}/W{self.world}/\"\n"
        "            f\"n{'+'.join(str(x) for x in self.arenas)}{dtype}/",
        "f\"{self.contract}/{'mean' if self.mean else 'sum'}/W{self.world}/\"\n"
        "            f\"n{'+'.join(str(x) for x in self.arenas)}{dtype}{collective}/")]),
    # --- §6 case key, EXPERIMENTS.md expansion --------------------------------
    M("key-sum-label", "§6", "key says sum or mean", "says add",
      [("'mean' if self.mean else 'sum'", "'mean' if self.mean else 'add'")]),
    M("key-permutation-spaces", "§6", "key writes [p0,p1,...] without spaces", "with spaces",
      [('",".join(str(x) for x in order)', '", ".join(str(x) for x in order)')]),
    M("key-rotate-reduced", "§4, §6", "key keeps rotate:K as written", "reduces K mod W",
      [("f\"s{self.seed}/{order_label(self.order)}\"",
        "f\"s{self.seed}/{order_label(self.order) if not str(self.order).startswith('rotate:') "
        "else 'rotate:' + str(int(self.order[7:]) % self.world)}\"")]),
    M("sweep-first-fastest", "EXPERIMENTS", "in a sweep the last parameter varies fastest",
      "the first varies fastest",
      [("for combo in itertools.product(*(v for _, v in axes)):",
        "for combo in (c[::-1] for c in itertools.product(*(v for _, v in reversed(axes)))):")]),
    M("sweep-id-brackets", "EXPERIMENTS", "a sweep with no multi-valued list is named by its id",
      "id[]",
      [("if varying else sid", "if True else sid")]),
    M("sweep-id-seed", "EXPERIMENTS", "sweep id part seed=<s>", "s=<s>",
      [('return f"seed={v}"', 'return f"s={v}"')]),
    M("sweep-id-mean", "EXPERIMENTS", "sweep id part mean=<true|false>", "mean / sum",
      [('return "mean=true" if v else "mean=false"', 'return "mean" if v else "sum"')]),
    # --- §7 order sensitivity ------------------------------------------------
    M("sensitivity-total-w", "§7", "the sample cap counts elements (sum of lengths)",
      "counts addends (W x sum)",
      [("total = sum(case.arenas)", "total = case.world * sum(case.arenas)")]),
    M("sensitivity-cap", "§7", "at most 2^20 elements checked", "2^21",
      [("SENSITIVITY_CAP = 1 << 20", "SENSITIVITY_CAP = 1 << 21")]),
    M("sensitivity-stride-floor", "§7", "S = ceil(total / 2^20)", "floor",
      [("stride = max(1, -(-total // SENSITIVITY_CAP))", "stride = max(1, total // SENSITIVITY_CAP)")]),
    M("sensitivity-global-origin", "§7", "each arena is sampled from its own index 0",
      "one stride across the concatenated arenas",
      [("origin = 0  # each arena is sampled from its own index 0",
        "origin = (-sum(case.arenas[:arena])) % stride")]),
    M("sensitivity-after-mean", "§7", "sensitivity compares the unscaled sums", "the scaled means",
      [("            # compared before any mean scaling, as the dtype's bits (SPEC §8)\n",
        "            if case.mean:\n                fwd, rev = apply_mean(fwd, w), apply_mean(rev, w)\n")]),
    M("sensitivity-nan-bits", "§7", "any NaN equals any NaN", "NaNs compared by bits",
      [(" | (is_nan_bits(fb, case.dtype) & is_nan_bits(rb, case.dtype))", "")]),
    M("sensitivity-delivery-order", "§7", "sensitivity reverses the chain (descending)",
      "uses the case's delivery order",
      [("rev = f.chain(list(range(w - 1, -1, -1)))", "rev = f.chain(case.sequence)")]),
]


@dataclass
class Outcome:
    mutation: Mutation
    rc: int
    caught_by: str      # "experiment: case id (key)" or ""
    vectors: str        # "n of N rows fail" or "all pass"
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        if self.mutation.observable:
            return self.rc == 1 and bool(self.caught_by)
        return self.rc == 0


def apply(source: str, m: Mutation) -> str:
    for old, new in m.edits:
        n = source.count(old)
        if n != 1:
            raise ValueError(f"mutation {m.id}: {old!r} occurs {n} times in verify_spec.py (expected once)")
        source = source.replace(old, new)
    return source


def golden_ids() -> dict[tuple[str, str], str]:
    ids = {}
    gdir = os.path.join(REPO, GOLDEN)
    for f in os.listdir(gdir):
        if f.endswith(".json"):
            with open(os.path.join(gdir, f), encoding="utf-8") as fh:
                doc = json.load(fh)
            for c in doc.get("cases", []):
                ids[(doc["experiment"], c["key"])] = c.get("id", "?")
    return ids


MISMATCH = re.compile(r"^mismatch: ([^:]+): (\S+)")
CASE_ID = re.compile(r"\(case `([^`]*)`\)")


def run_one(python: str, source: str, m: Mutation | None, ids, workdir: str) -> Outcome:
    name = m.id if m else "baseline"
    d = os.path.join(workdir, name)
    os.makedirs(d)
    path = os.path.join(d, "verify_spec.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(apply(source, m) if m else source)
    t0 = time.perf_counter()
    cmd = [python, path, "--no-vectors", "--strict", "--fail-fast", "--golden", os.path.join(REPO, GOLDEN),
           *(os.path.join(REPO, e) for e in EXPERIMENTS)]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=d)
    caught = ""
    for line in p.stdout.splitlines():
        mm = MISMATCH.match(line)
        if mm:
            exp, key = mm.group(1), mm.group(2).rstrip(":")
            named = CASE_ID.search(line)  # a key the golden lacks comes with its case id
            caught = f"{exp}: {named.group(1) if named else ids.get((exp, key), '?')}"
            break
    v = subprocess.run([python, "-c",
                        "import sys; sys.path.insert(0, sys.argv[1]); import numpy as np; "
                        "np.seterr(all='ignore'); import verify_spec as v; "
                        "n, f = v.check_vectors(sys.argv[2]); print(len(f), n)",
                        d, os.path.join(REPO, VECTORS)], capture_output=True, text=True)
    if v.returncode == 0:
        bad, total = v.stdout.split()
        vectors = "all pass" if bad == "0" else f"{bad} of {total} fail"
    else:
        vectors = "error"
    detail = "" if p.returncode in (0, 1) else (p.stderr.strip().splitlines() or ["?"])[-1]
    dummy = m or Mutation("baseline", "", "", "", [], observable=False)
    return Outcome(dummy, p.returncode, caught, vectors, time.perf_counter() - t0, detail)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/SPEC.md appendix)")
    ap.add_argument("--doc", metavar="FILE",
                    help="also fail unless FILE (docs/SPEC.md) holds exactly this table")
    ap.add_argument("--write-doc", metavar="FILE", help="replace the table in FILE with this run's")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutations")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="mutations run in parallel")
    ap.add_argument("--python", default=sys.executable, help="interpreter with numpy (default: this one)")
    args = ap.parse_args(argv)

    with open(VERIFIER, encoding="utf-8") as f:
        source = f.read()
    chosen = MUTATIONS
    if args.only:
        unknown = set(args.only) - {m.id for m in MUTATIONS}
        if unknown:
            print(f"error: unknown mutation(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        chosen = [m for m in MUTATIONS if m.id in args.only]
    try:
        for m in chosen:
            apply(source, m)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    ids = golden_ids()
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="mutate_spec.")
    try:
        base = run_one(args.python, source, None, ids, work)
        if base.rc != 0 or base.vectors != "all pass":
            print(f"baseline: the unmutated verifier does not pass (exit {base.rc}, vectors {base.vectors})"
                  f"{': ' + base.detail if base.detail else ''}; nothing is shown")
            return 1
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outcomes = list(pool.map(lambda m: run_one(args.python, source, m, ids, work), chosen))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    table = [TABLE_HEAD, TABLE_RULE]
    for o in outcomes:
        m = o.mutation
        caught = f"`{o.caught_by}`" if o.caught_by else ("none (by design)" if not m.observable else "**none**")
        cells = [m.rule, m.section, m.wrong, caught, o.vectors]
        table.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if args.markdown:
        print("\n".join(table))
    else:
        for o in outcomes:
            m = o.mutation
            status = "ok  " if o.ok else "FAIL"
            what = o.caught_by or ("not caught (expected: unobservable)" if not m.observable
                                   else f"NOT CAUGHT (exit {o.rc}{': ' + o.detail if o.detail else ''})")
            print(f"{status} {m.id:<28} {m.section:<12} {what:<58} vectors: {o.vectors:<12} {o.seconds:5.1f}s")
    bad = [o for o in outcomes if not o.ok]
    doc_ok = True
    if args.write_doc:
        write_table(args.write_doc, table)
        print(f"wrote the table into {args.write_doc}")
    if args.doc:
        doc_ok = check_table(args.doc, table)
    print(f"{len(outcomes)} mutations, {len(outcomes) - len(bad)} as expected, {len(bad)} not; "
          f"baseline passes; {time.perf_counter() - t0:.0f} s", file=sys.stderr if args.markdown else sys.stdout)
    return 1 if bad or not doc_ok else 0


TABLE_HEAD = "| rule | § | mutant | first golden case that fails | vectors |"
TABLE_RULE = "|---|---|---|---|---|"


def table_span(lines: list[str], path: str) -> tuple[int, int]:
    """[start, end) of the mutation table in a document's lines."""
    if lines.count(TABLE_HEAD) != 1:
        raise SystemExit(f"error: {path}: expected exactly one line {TABLE_HEAD!r}")
    start = lines.index(TABLE_HEAD)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return start, end


def write_table(path: str, table: list[str]) -> None:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start, end = table_span(lines, path)
    lines[start:end] = table
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.replace(tmp, path)


def check_table(path: str, table: list[str]) -> bool:
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    start, end = table_span(lines, path)
    have = lines[start:end]
    if have == table:
        print(f"{path}: the mutation table is current")
        return True
    print(f"{path}: the mutation table is out of date; rows that differ:")
    for row in sorted(set(have) ^ set(table), key=lambda r: (r not in table, r)):
        print(("  this run: " if row in table else "  document: ") + row)
    print(f"update it with: python3 tools/mutate_spec.py --write-doc {path}")
    return False


if __name__ == "__main__":
    sys.exit(main())
