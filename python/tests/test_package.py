"""The installed package, without torch: finding the binary, writing
experiments over rank files that numpy and safetensors wrote, running the
CPU oracle and reading its verdict.

Run from a checkout against the installed wheel (`pip install .`), as CI
does: `python -m pytest python/tests`.
"""

import json
import os
import re
import struct
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import foldprint

ROOT = Path(__file__).resolve().parents[2]
W = 3
# The delivery order of the negative control's sum: [0, 2, 1].
OTHER = (0, 2, 1)


def crate_version() -> str:
    text = (ROOT / "Cargo.toml").read_text(encoding="utf-8")
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version = "([^"]+)"', package, re.M).group(1)


# --- data whose sum changes with the order of the ranks ---------------------

def rank_addends(shape, seed):
    """W = 3 float32 arrays: rank 2 cancels rank 0, rank 1 is small, so
    (r0 + r1) + r2 loses r1's low bits and (r0 + r2) + r1 keeps them."""
    rng = np.random.default_rng(seed)
    big = (rng.uniform(1.0, 2.0, shape) * 2.0 ** rng.integers(12, 24, shape)).astype(np.float32)
    small = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    return [big, small, -big]


def fold(ranks, order=tuple(range(W))):
    """foldprint's chain (docs/SPEC.md §3) in `order`, in float32."""
    acc = ranks[order[0]].astype(np.float32)
    for r in order[1:]:
        acc = (acc + ranks[r].astype(np.float32)).astype(np.float32)
    return acc


def f32_to_bf16_bits(x):
    """Round-to-nearest-even float32 -> bfloat16 bits (no NaN in our data)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(h):
    return (h.astype(np.uint32) << 16).view(np.float32)


def ordinal(bits, width):
    sign = np.int64(1) << (width - 1)
    b = bits.astype(np.int64)
    mag = b & (sign - 1)
    return np.where(b & sign, -mag, mag)


def differences(a_bits, b_bits, width):
    """(elements differing, max ULP distance) of two bit arrays."""
    diff = a_bits != b_bits
    if not diff.any():
        return 0, None
    ulp = np.abs(ordinal(a_bits, width) - ordinal(b_bits, width))
    return int(diff.sum()), int(ulp[diff].max())


def save_bf16_safetensors(path, tensors):
    """A safetensors file of bf16 tensors from their raw bits, written by
    hand (numpy has no bfloat16 without ml_dtypes)."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        bits = np.ascontiguousarray(tensors[name], dtype="<u2")
        raw = bits.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(bits.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# --- the binary ---------------------------------------------------------------

def test_the_binary_is_the_installed_one_and_its_version_is_the_crates(monkeypatch):
    monkeypatch.delenv("FOLDPRINT_BIN", raising=False)
    # The wheel's module, not the checkout's source.
    assert ROOT / "python" not in Path(foldprint.__file__).resolve().parents
    found = foldprint.binary()
    scripts = Path(sysconfig.get_path("scripts")).resolve()
    assert found.resolve().parent in (scripts, Path(sys.executable).resolve().parent), found
    assert foldprint.version() == crate_version()
    assert foldprint.__version__ == crate_version()


def test_foldprint_bin_overrides_and_a_bad_one_is_named(monkeypatch, tmp_path):
    monkeypatch.delenv("FOLDPRINT_BIN", raising=False)
    real = foldprint.binary()
    monkeypatch.setenv("FOLDPRINT_BIN", str(real))
    assert foldprint.binary() == real
    missing = tmp_path / "no-such-foldprint"
    monkeypatch.setenv("FOLDPRINT_BIN", str(missing))
    with pytest.raises(foldprint.BinaryNotFound, match="no-such-foldprint"):
        foldprint.binary()


def test_import_does_not_import_torch():
    import subprocess

    code = "import sys, foldprint; assert 'torch' not in sys.modules; assert 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_foldprint_torch_without_torch_says_what_it_needs():
    import subprocess

    # sys.modules["torch"] = None makes `import torch` fail, torch installed or not.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import foldprint\n"
        "try:\n"
        "    import foldprint.torch\n"
        "except ImportError as e:\n"
        "    assert 'foldprint.torch needs PyTorch' in str(e), e\n"
        "    print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "refused"


# --- writing experiments --------------------------------------------------------

def test_write_experiment_escapes_strings(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    odd = 'a "quoted" \\ back\tslash\nnew\x01line\x7f ü'
    p = foldprint.write_experiment(
        tmp_path / "e.toml", name="odd", description=odd, addends="r/rank{rank}.npy",
        world=3, expect='x"y.npy', contracts=["fixed-order", "pairwise-tree"], dtype="bf16",
    )
    doc = tomllib.loads(p.read_text(encoding="utf-8"))
    assert doc["description"] == odd
    assert doc["defaults"] == {"world": 3, "dtype": "bf16"}
    assert doc["sweep"] == [{"id": "grads", "addends": "r/rank{rank}.npy", "expect": 'x"y.npy',
                             "contract": ["fixed-order", "pairwise-tree"]}]


def test_write_experiment_of_a_reduce_scatter(tmp_path):
    tomllib = pytest.importorskip("tomllib")
    p = foldprint.write_experiment(
        tmp_path / "rs.toml", name="rs", addends="in{rank}.safetensors", world=4,
        expect="out{rank}.safetensors", mean=True, collective="reduce-scatter",
    )
    doc = tomllib.loads(p.read_text(encoding="utf-8"))
    assert doc["defaults"] == {"world": 4, "mean": True, "collective": "reduce-scatter"}


@pytest.mark.parametrize("bad", [
    dict(addends="rank.npy"),            # no {rank}
    dict(collective="all-gather"),
    dict(world=0),
    dict(world=True),
    dict(contracts=["fast-order"]),
    dict(contracts=[]),
    dict(dtype="fp8"),
])
def test_write_experiment_refuses_bad_arguments(tmp_path, bad):
    args = dict(name="s", addends="rank{rank}.npy", world=3)
    args.update(bad)
    with pytest.raises((ValueError, TypeError)):
        foldprint.write_experiment(tmp_path / "e.toml", **args)
    assert not (tmp_path / "e.toml").exists()


# --- running the CPU oracle on rank files ------------------------------------------

def write_npy_step(d, seed, expect_order):
    d.mkdir(parents=True, exist_ok=True)
    ranks = rank_addends((1000,), seed)
    for r, a in enumerate(ranks):
        np.save(d / f"rank{r}.npy", a)
    np.save(d / "allreduced.npy", fold(ranks, expect_order))
    return ranks


def test_npy_expect_of_rank_order_is_fixed_order_and_another_order_differs(tmp_path):
    ranks = write_npy_step(tmp_path / "same", 1, tuple(range(W)))
    exp = foldprint.write_experiment(
        tmp_path / "same.toml", name="same", addends="same/rank{rank}.npy", world=W,
        expect="same/allreduced.npy", contracts=["fixed-order", "pairwise-tree", "nccl-allreduce"],
    )
    rep = foldprint.run(exp, backend="cpu")
    assert rep.exit_code == 0 and rep.ok, rep.failures
    fixed = [c for c in rep.cases if c.contract == "fixed-order"]
    assert len(fixed) == 1 and fixed[0].equal is True and fixed[0].differing == 0
    assert fixed[0].world == W and fixed[0].dtype == "f32" and fixed[0].max_ulp is None
    # The CPU oracle has no NCCL: that contract is skipped, said so, and never matches.
    assert [s.id for s in rep.skipped] and all("nccl" in s.key for s in rep.skipped)
    if os.environ.get("FOLDPRINT_TEST_GIT_REV"):
        assert rep.git == os.environ["FOLDPRINT_TEST_GIT_REV"]

    # Negative control: the framework summed in another order.
    write_npy_step(tmp_path / "other", 1, OTHER)
    want_diff, want_ulp = differences(fold(ranks).view(np.uint32), fold(ranks, OTHER).view(np.uint32), 32)
    assert want_diff > 0
    exp = foldprint.write_experiment(
        tmp_path / "other.toml", name="other", addends="other/rank{rank}.npy", world=W,
        expect="other/allreduced.npy", contracts=["fixed-order"],
    )
    out = tmp_path / "other.json"
    rep = foldprint.run(exp, backend="cpu", out=out)
    assert rep.exit_code == 1 and rep.ok, "a differing expect is a finding, not a failed run"
    assert json.loads(out.read_text())["summary"]["differs_from_expect"] == rep.differs_from_expect
    (case,) = rep.cases
    assert case.equal is False
    assert (case.differing, case.max_ulp) == (want_diff, want_ulp)
    assert case.arenas[0].len == 1000 and sum(case.arenas[0].ulp_histogram) == want_diff


def test_safetensors_f32_names_each_tensor(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    shapes = {"layer.weight": (8, 25), "layer.bias": (13,)}
    per = {n: rank_addends(s, seed) for seed, (n, s) in enumerate(shapes.items())}
    for r in range(W):
        st.save_file({n: per[n][r] for n in shapes}, str(tmp_path / f"rank{r}.safetensors"))
    # The framework: bias in rank order, weight in another order.
    st.save_file({"layer.bias": fold(per["layer.bias"]), "layer.weight": fold(per["layer.weight"], OTHER)},
                 str(tmp_path / "allreduced.safetensors"))
    exp = foldprint.write_experiment(tmp_path / "step.toml", name="step", addends="rank{rank}.safetensors",
                                     world=W, expect="allreduced.safetensors")
    rep = foldprint.run(exp)
    (case,) = rep.cases
    by_name = {a.name: a for a in case.arenas}
    assert set(by_name) == set(shapes)
    assert by_name["layer.bias"].equal
    w = per["layer.weight"]
    want = differences(fold(w).view(np.uint32).ravel(), fold(w, OTHER).view(np.uint32).ravel(), 32)
    assert want[0] > 0
    assert (by_name["layer.weight"].differing, by_name["layer.weight"].max_ulp) == want
    assert rep.exit_code == 1 and case.equal is False


def bf16_step(d, writer):
    """bf16 rank files and two expect files: the rank-order result (one
    rounding of the float32 chain) and another order's."""
    d.mkdir(parents=True, exist_ok=True)
    bits = [f32_to_bf16_bits(a) for a in rank_addends((500,), 7)]
    widened = [bf16_bits_to_f32(b) for b in bits]
    results = {"fixed": f32_to_bf16_bits(fold(widened)), "other": f32_to_bf16_bits(fold(widened, OTHER))}
    for r, b in enumerate(bits):
        writer(d / f"rank{r}.safetensors", {"g": b})
    for k, b in results.items():
        writer(d / f"{k}.safetensors", {"g": b})
    return results


def raw_writer(path, tensors):
    save_bf16_safetensors(path, tensors)


def ml_dtypes_writer(path, tensors):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    st = pytest.importorskip("safetensors.numpy")
    st.save_file({n: b.view(ml_dtypes.bfloat16) for n, b in tensors.items()}, str(path))


@pytest.mark.parametrize("writer", [raw_writer, ml_dtypes_writer], ids=["raw-bytes", "ml_dtypes"])
def test_bf16_rank_files_reduce_in_bf16(tmp_path, writer):
    results = bf16_step(tmp_path, writer)
    want = differences(results["fixed"], results["other"], 16)
    assert want[0] > 0
    for k in results:
        foldprint.write_experiment(tmp_path / f"{k}.toml", name=k, addends="rank{rank}.safetensors",
                                   world=W, expect=f"{k}.safetensors", dtype="bf16")
    same = foldprint.run(tmp_path / "fixed.toml")
    (case,) = same.cases
    assert case.dtype == "bf16" and case.equal and same.exit_code == 0
    other = foldprint.run(tmp_path / "other.toml")
    (case,) = other.cases
    assert (case.differing, case.max_ulp) == want and other.exit_code == 1


def test_check_gives_a_verdict_per_step(tmp_path):
    grads = tmp_path / "grads"
    for step, order in (("step0", tuple(range(W))), ("step1", OTHER)):
        write_npy_step(grads / step, 10, order)
        foldprint.write_experiment(grads / f"{step}.toml", name=step, addends=f"{step}/rank{{rank}}.npy",
                                   world=W, expect=f"{step}/allreduced.npy",
                                   contracts=["fixed-order", "pairwise-tree"])
    result = foldprint.check(grads)
    assert [s.experiment.name for s in result] == ["step0.toml", "step1.toml"]
    s0, s1 = result.steps
    assert s0.fixed_order and s0.matches[0] == "fixed-order"
    assert not s1.fixed_order and "fixed-order" not in s1.matches
    assert s1.case("fixed-order").differing > 0
    assert result.ok and not result.fixed_order
    # A finding is no failed run: check never sees exit 1 for it, while a
    # CI gate on fixed-order does (negative control).
    assert s1.report.exit_code == 0
    assert foldprint.run(grads / "step1.toml", expect_gate="fixed-order").exit_code == 1
    assert foldprint.run(grads / "step0.toml", expect_gate="fixed-order").exit_code == 0


def test_a_bad_experiment_raises_with_the_clis_message(tmp_path):
    write_npy_step(tmp_path / "s", 3, tuple(range(W)))
    exp = foldprint.write_experiment(tmp_path / "bad.toml", name="bad", addends="s/rank{rank}.npy",
                                     world=W + 1, expect="s/allreduced.npy")
    with pytest.raises(foldprint.BadInput) as e:
        foldprint.run(exp)
    assert e.value.code == 2
    assert "rank3.npy: not found" in e.value.stderr and "rank3.npy: not found" in str(e.value)
    with pytest.raises(foldprint.BadInput):
        foldprint.check(tmp_path)


def test_a_reduce_scatter_gives_a_verdict_per_rank(tmp_path):
    ranks = rank_addends((1000,), 5)
    for r, a in enumerate(ranks):
        np.save(tmp_path / f"in{r}.npy", a)
    # The docs/SPEC.md §2 plan of 1000 over 3: 334, 333, 333. Rank 1's
    # framework summed in another order.
    bounds = [0, 334, 667, 1000]
    fixed, other = fold(ranks), fold(ranks, OTHER)
    for r in range(W):
        src = other if r == 1 else fixed
        np.save(tmp_path / f"out{r}.npy", src[bounds[r]:bounds[r + 1]])
    want = differences(fixed[334:667].view(np.uint32), other[334:667].view(np.uint32), 32)
    assert want[0] > 0
    exp = foldprint.write_experiment(tmp_path / "rs.toml", name="rs", addends="in{rank}.npy", world=W,
                                     expect="out{rank}.npy", collective="reduce-scatter")
    rep = foldprint.run(exp)
    (case,) = rep.cases
    assert case.collective == "reduce-scatter" and case.equal is False and rep.exit_code == 1
    assert [[a.len for a in r] for r in case.rank_arenas] == [[334], [333], [333]]
    assert [(r[0].differing, r[0].max_ulp) for r in case.rank_arenas] == [(0, None), want, (0, None)]
    assert (case.arenas[0].len, case.differing, case.max_ulp) == (1000, want[0], want[1])
