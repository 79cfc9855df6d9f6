"""foldprint.torch on gloo (CPU) at W = 3 and 4: the DDP recorder, the
fixed-order hook and the FSDP2 recorder, each against DDP's or FSDP's own
gradients and against an independent float32 fold written here with torch.

Skipped without torch. Each case starts W ranks (python/tests/torch_worker.py)
and needs the `foldprint` binary (FOLDPRINT_BIN, or installed).
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

import foldprint  # noqa: E402
import foldprint.torch as fpt  # noqa: E402

HERE = Path(__file__).resolve().parent
STEPS = 2
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def start(mode, out, world, dtype="f32"):
    done = subprocess.run([sys.executable, str(HERE / "torch_worker.py"), mode, str(out), str(world), dtype],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module", params=[(3, "f32"), (4, "f32"), (3, "bf16"), (4, "bf16"), (3, "f16")],
                ids=lambda p: f"W{p[0]}-{p[1]}")
def ddp_run(request, tmp_path_factory):
    world, dtype = request.param
    out = tmp_path_factory.mktemp(f"ddp-w{world}-{dtype}")
    return start("ddp", out, world, dtype), world, DTYPES[dtype]


@pytest.fixture(scope="module", params=[3, 4], ids=lambda w: f"W{w}")
def fsdp_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"fsdp-w{request.param}")
    return start("fsdp", out, request.param), request.param


# --- an independent fold, and bit comparisons ---------------------------------------

def bits(t):
    return t.contiguous().view(INT[t.dtype])


def fold(addends, order, mean=False):
    """docs/SPEC.md §3 in float32 over `order`, scaled by float32 1/W when
    `mean`, rounded once to the addends' dtype."""
    acc = addends[order[0]].to(torch.float32, copy=True)
    for r in order[1:]:
        acc = acc + addends[r].to(torch.float32)
    if mean:
        acc = acc * torch.tensor(1.0 / len(addends), dtype=torch.float32)
    return acc.to(addends[0].dtype)


def differing(a, b):
    return int((bits(a) != bits(b)).sum())


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def grads(out, name, step, rank):
    return fpt.load_safetensors(out / f"grads_{name}_step{step}_rank{rank}.safetensors")[0]


def unpack(flat, meta):
    """A bucket's parameters, from the recorder's metadata."""
    m = json.loads(meta)
    at, out = 0, {}
    for name, shape in zip(m["params"], m["shapes"]):
        n = 1
        for d in shape:
            n *= d
        out[name] = flat[at:at + n].reshape(shape)
        at += n
    assert at == flat.numel(), (at, flat.numel())
    return out


def step_files(d, world, addends="rank{}.safetensors"):
    ranks = [fpt.load_safetensors(d / addends.format(r))[0] for r in range(world)]
    return ranks


# --- the DDP recorder -------------------------------------------------------------------

def test_recording_leaves_ddps_gradients_as_they_are(ddp_run):
    out, world, dtype = ddp_run
    for step in range(STEPS):
        for r in range(world):
            plain, rec = grads(out, "plain", step, r), grads(out, "recorded", step, r)
            assert plain.keys() == rec.keys()
            for n in plain:
                assert same_bits(plain[n], rec[n]), f"step {step} rank {r} {n}"
    # prescale="divide" is torch's allreduce_hook, bit for bit; at W = 3 in
    # float32 it is not what DDP does without a hook (1/W multiplied).
    for r in range(world):
        hook, div, plain = (grads(out, v, 0, r) for v in ("torch_hook", "recorded_divide", "plain"))
        assert all(same_bits(hook[n], div[n]) for n in hook)
        moved = sum(differing(div[n], plain[n]) for n in plain)
        if world == 3 and dtype == torch.float32:
            assert moved > 0, "dividing by 3 and multiplying by 1/3 gave the same bits"
        if world == 4:
            assert moved == 0


def test_recorded_buckets_are_ddps_result_and_check_counts_the_fixed_order_drift(ddp_run):
    out, world, dtype = ddp_run
    root = out / "ddp"
    result = foldprint.check(root)
    assert [s.experiment.parent.name for s in result] == [f"step{k}" for k in range(STEPS)]
    assert result.ok
    seen_buckets = 0
    for step, verdict in enumerate(result):
        d = root / f"step{step}"
        text = (d / "experiment.toml").read_text()
        assert f"world = {world}\n" in text and 'expect = "allreduced.safetensors"' in text
        ranks = step_files(d, world)
        reduced, meta = fpt.load_safetensors(d / "allreduced.safetensors")
        assert set(reduced) == set(ranks[0]) and len(reduced) == len(verdict.tensors)
        # The all-reduced buckets are the gradients DDP left on every rank.
        plain = grads(out, "plain", step, 0)
        for name, flat in reduced.items():
            assert flat.dtype == dtype
            for p, g in unpack(flat, meta[name]).items():
                assert same_bits(g, plain[p]), f"step {step} {name} {p}"
        # Per bucket, foldprint's fixed-order verdict is the count an
        # independent fold finds.
        case = verdict.case("fixed-order")
        assert case.world == world and case.dtype == fpt._FP_DTYPES[dtype]
        for t in verdict.tensors:
            want = fold([r[t.name] for r in ranks], list(range(world)))
            assert t.contracts["fixed-order"].differing == differing(want, reduced[t.name])
            assert t.contracts["fixed-order"].len == want.numel()
            seen_buckets += 1
        assert [s.key for s in verdict.skipped if "nccl-allreduce" in s.key], "the CPU oracle runs no NCCL"
    assert seen_buckets > STEPS, "every step in one bucket: nothing per bucket was checked"


def test_a_missing_rank_file_is_refused_not_a_smaller_world(ddp_run, tmp_path):
    out, world, _ = ddp_run
    d = tmp_path / "step"
    shutil.copytree(out / "ddp" / "step1", d)
    (d / f"rank{world - 1}.safetensors").unlink()
    with pytest.raises(foldprint.BadInput, match=f"rank{world - 1}.safetensors"):
        foldprint.run(d / "experiment.toml")


# --- the fixed-order hook -------------------------------------------------------------------

def test_fixed_order_hook_is_foldprints_fixed_order(ddp_run, tmp_path):
    out, world, dtype = ddp_run
    root = out / "fixed"
    result = foldprint.check(root)
    assert len(result) == STEPS and result.ok and result.fixed_order
    for step, verdict in enumerate(result):
        d = root / f"step{step}"
        assert verdict.tensors and all(t.matches == ("fixed-order",) for t in verdict.tensors)
        ranks = step_files(d, world)
        reduced, meta = fpt.load_safetensors(d / "allreduced.safetensors")
        for name, flat in reduced.items():
            assert same_bits(flat, fold([r[name] for r in ranks], list(range(world))))
            # What the hook returned is what DDP left in every rank's grads.
            for r in range(world):
                g = grads(out, "fixed", step, r)
                for p, v in unpack(flat, meta[name]).items():
                    assert same_bits(v, g[p])
        # Its inputs are DDP's scaled buckets: the same as the recorder's at
        # step 0, where both models still hold the same weights.
        if step == 0:
            rec = step_files(out / "ddp" / "step0", world)
            for r in range(world):
                assert rec[r].keys() == ranks[r].keys()
                assert all(same_bits(rec[r][k], ranks[r][k]) for k in rec[r])

    # Negative control: the same inputs with another order's sum as expect.
    d = tmp_path / "reversed"
    shutil.copytree(root / "step1", d)
    ranks = step_files(d, world)
    other = {n: fold([r[n] for r in ranks], list(range(world))[::-1]) for n in ranks[0]}
    want = {n: differing(other[n], fold([r[n] for r in ranks], list(range(world)))) for n in other}
    fpt.save_safetensors(d / "allreduced.safetensors", other)
    verdict = foldprint.check(d).steps[0]
    assert {t.name: t.contracts["fixed-order"].differing for t in verdict.tensors} == want
    assert verdict.fixed_order == (sum(want.values()) == 0)
    if dtype == torch.float32:
        # In 16 bits the one rounding often erases the order (SPEC §8.7).
        assert sum(want.values()) > 0, "the data does not change with the order of the ranks"
    # And one element one ULP off in every bucket is seen, in any dtype.
    bumped = {n: fold([r[n] for r in ranks], list(range(world))) for n in ranks[0]}
    for t in bumped.values():
        bits(t)[0] ^= 1
    fpt.save_safetensors(d / "allreduced.safetensors", bumped)
    verdict = foldprint.check(d).steps[0]
    assert not verdict.fixed_order and verdict.report.exit_code == 0, "a finding, never exit 1"
    assert all((a.differing, a.max_ulp) == (1, 1) for t in verdict.tensors
               for a in t.contracts.values())


def test_fixed_order_all_reduce_on_shards_that_split_unevenly(tmp_path):
    """W = 5 over lengths below, at and above W, n % W from 0 to 4, against
    the rank-order chain in float32 (torch_worker.py `uneven`)."""
    start("uneven", tmp_path, 5)
    assert (tmp_path / "uneven.ok").read_text() == "0 1 2 3 4 1001 4096"


def test_shard_plan_is_the_specs():
    assert fpt.shard_plan(7, 3) == [(0, 3), (3, 2), (5, 2)]
    assert fpt.shard_plan(2, 4) == [(0, 1), (1, 1), (2, 0), (2, 0)]
    assert fpt.shard_plan(12, 4) == [(0, 3), (3, 3), (6, 3), (9, 3)]


# --- the FSDP2 recorder -------------------------------------------------------------------------

def test_fsdp_recorder_shards_are_fsdps_and_check_gives_a_verdict_per_rank(fsdp_run):
    out, world = fsdp_run
    root = out / "fsdp"
    result = foldprint.check(root)
    assert len(result) == STEPS and result.ok
    for step, verdict in enumerate(result):
        d = root / f"step{step}"
        text = (d / "experiment.toml").read_text()
        assert 'collective = "reduce-scatter"' in text and f"world = {world}\n" in text
        assert 'expect = "rs_out_rank{rank}.safetensors"' in text
        ins = step_files(d, world, "rs_in_rank{}.safetensors")
        outs = [fpt.load_safetensors(d / f"rs_out_rank{r}.safetensors") for r in range(world)]
        assert set(ins[0]) == {"0", "2", "root"}
        # FSDP2 reduces f32 with ReduceOp.AVG: the experiment is a mean.
        assert "mean = true" in text
        assert all(json.loads(m)["op"] == "avg" for m in outs[0][1].values())
        case = verdict.case("fixed-order")
        assert case.collective == "reduce-scatter" and len(case.rank_arenas) == world
        for name in ins[0]:
            n = ins[0][name].numel()
            assert n % world == 0
            want = fold([r[name] for r in ins], list(range(world)), mean=True)
            for r in range(world):
                shard = outs[r][0][name]
                assert shard.numel() == n // world
                (arena,) = [a for a in case.rank_arenas[r] if a.name == name]
                assert arena.len == n // world
                mine = want[r * (n // world):(r + 1) * (n // world)]
                assert arena.differing == differing(mine, shard), f"step {step} {name} rank {r}"
                assert verdict.tensor(name).ranks["fixed-order"][r] == arena
            merged = verdict.tensor(name).contracts["fixed-order"]
            assert merged.len == n and merged.differing == differing(want, torch.cat(
                [outs[r][0][name] for r in range(world)]))
        # The output shards are the gradients FSDP left on each rank.
        for r in range(world):
            local = grads(out, "fsdp", step, r)
            for group, param in (("0", "0.weight"), ("2", "2.weight"), ("root", "4.weight")):
                g = local[param].reshape(-1)
                assert same_bits(outs[r][0][group][: g.numel()], g), f"{group} rank {r}"


# --- the NCCL library handed to the CLI ---------------------------------------------------------

def test_the_cli_gets_torchs_nccl_when_torch_is_imported(monkeypatch):
    from foldprint import _cli

    monkeypatch.delenv("FOLDPRINT_NCCL_LIBRARY", raising=False)
    lib = fpt.nccl_library()
    if lib is None:
        pytest.skip("this torch has no NCCL")
    assert lib.name.startswith("libnccl.so") and lib.is_file()
    assert _cli._child_env()["FOLDPRINT_NCCL_LIBRARY"] == str(lib)
    monkeypatch.setenv("FOLDPRINT_NCCL_LIBRARY", "/elsewhere/libnccl.so.2")
    assert _cli._child_env() is None, "a library the user named is left alone"


# --- safetensors without the safetensors package ------------------------------------------------

def test_safetensors_files_are_the_formats(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    t = {"a": torch.randn(5, 3).bfloat16(), "b": torch.randn(7), "c": torch.zeros(0).half(),
         "d": torch.tensor([-0.0, float("nan"), float("inf"), 1e-45])}
    fpt.save_safetensors(tmp_path / "ours.safetensors", t, {"a": "meta"})
    theirs = st.load_file(str(tmp_path / "ours.safetensors"))
    assert theirs.keys() == t.keys() and all(same_bits(t[k], theirs[k]) for k in t)
    st.save_file(t, str(tmp_path / "theirs.safetensors"), {"k": "v"})
    back, meta = fpt.load_safetensors(tmp_path / "theirs.safetensors")
    assert meta == {"k": "v"} and all(same_bits(t[k], back[k]) for k in t)
    with pytest.raises(ValueError, match="f32, bf16 and f16"):
        fpt.save_safetensors(tmp_path / "f64.safetensors", {"x": torch.zeros(2, dtype=torch.float64)})
    assert not (tmp_path / "f64.safetensors").exists()


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(TypeError, match="DistributedDataParallel model, not Linear"):
        fpt.record(torch.nn.Linear(2, 2), tmp_path, steps=[0])
    with pytest.raises(TypeError, match="DistributedDataParallel model, not Linear"):
        fpt.fixed_order(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="step numbers are integers >= 0"):
        fpt.DDPRecorder(tmp_path, steps=[0, -1])
    with pytest.raises(ValueError, match="prescale 'mean'"):
        fpt.DDPRecorder(tmp_path, steps=[0], prescale="mean")
    with pytest.raises(ValueError, match="no fully_shard module"):
        fpt.record_fsdp(torch.nn.Linear(2, 2), tmp_path, steps=[0])
