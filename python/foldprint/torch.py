"""foldprint for PyTorch jobs: record what DDP and FSDP2 reduce, and reduce
DDP's buckets in foldprint's fixed order.

    import foldprint.torch
    rec = foldprint.torch.record(ddp_model, "grads/", steps=[0, 100])
    ...train...
    print(foldprint.check("grads/"))

- `record(ddp_model, out_dir, steps)` registers a DDP comm hook that reduces
  each bucket exactly as DDP does without a hook (the bucket scaled by 1/W,
  then an all-reduce SUM), and on the listed steps saves every bucket's
  input as reduced and its all-reduced output, with an experiment per step.
- `fixed_order(ddp_model)` (or `fixed_order_hook`) reduces each bucket in foldprint's fixed order
  (docs/SPEC.md §2-§3): an all-to-all of the §2 shards, a float32 fold over
  source ranks 0..W-1, one rounding to the bucket's dtype, an all-gather.
- `record_fsdp(model, out_dir, steps)` records the reduce-scatter of every
  `fully_shard` parameter group: each rank's flat input and output shard.

Files are written whole or not at all (a temporary file renamed over the
name). Every rank writes its own files under `out_dir`: on several nodes,
point it at a shared file system or collect the rank files afterwards.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

try:
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - exercised without torch
    raise ImportError(
        "foldprint.torch needs PyTorch (`pip install torch`); the rest of the "
        "foldprint package works without it"
    ) from e

from ._cli import torch_nccl_library
from ._experiment import write_experiment

__all__ = [
    "DDPRecorder",
    "FSDPRecorder",
    "FixedOrderState",
    "fixed_order",
    "fixed_order_all_reduce",
    "fixed_order_hook",
    "load_safetensors",
    "nccl_library",
    "record",
    "record_fsdp",
    "save_safetensors",
    "shard_plan",
]

PathLike = Union[str, "os.PathLike[str]"]

# foldprint's dtypes, as safetensors names them.
_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_ST_BY_NAME = {v: k for k, v in _ST_DTYPES.items()}
_FP_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
# The contracts a recorded step is compared with by default.
DEFAULT_CONTRACTS = ("fixed-order", "nccl-allreduce")
PRESCALES = ("builtin", "divide")


def nccl_library() -> Optional[Path]:
    """The libnccl PyTorch loaded in this process (what `foldprint.run` and
    `foldprint.check` hand the CLI as FOLDPRINT_NCCL_LIBRARY unless it is
    set)."""
    return torch_nccl_library()


# --- safetensors, written and read with torch alone ---------------------------

def _replace_atomically(dest: Path, data: bytes) -> None:
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_safetensors(path: PathLike, tensors: Dict[str, "torch.Tensor"],
                     metadata: Optional[Dict[str, str]] = None) -> Path:
    """Write `tensors` (f32, bf16 or f16, any device) as a safetensors file,
    in their own dtype, atomically. Needs no safetensors or numpy package."""
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs: List[bytes] = []
    at = 0
    for name in sorted(tensors):
        t = tensors[name].detach()
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r} is {t.dtype}; foldprint reads f32, bf16 and f16")
        t = t.to("cpu").contiguous()
        raw = bytearray(t.numel() * t.element_size())
        if raw:
            torch.frombuffer(raw, dtype=torch.uint8).copy_(t.reshape(-1).view(torch.uint8))
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(bytes(raw))
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    dest = Path(path)
    _replace_atomically(dest, len(text).to_bytes(8, "little") + text + b"".join(blobs))
    return dest


def load_safetensors(path: PathLike) -> Tuple[Dict[str, "torch.Tensor"], Dict[str, str]]:
    """The tensors (on the CPU) and metadata of a file `save_safetensors`
    wrote (or any safetensors file of f32, bf16 and f16 tensors)."""
    data = Path(path).read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    size = int.from_bytes(data[:8], "little")
    if 8 + size > len(data):
        raise ValueError(f"{path}: header of {size} bytes runs past the end of the file")
    header = json.loads(data[8:8 + size].decode("utf-8"))
    body = bytearray(data[8 + size:])
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, h in header.items():
        if h["dtype"] not in _ST_BY_NAME:
            raise ValueError(f"{path}: tensor {name!r} is {h['dtype']}, not F32, BF16 or F16")
        a, b = h["data_offsets"]
        dtype = _ST_BY_NAME[h["dtype"]]
        raw = torch.frombuffer(body, dtype=torch.uint8)[a:b] if b > a else torch.empty(0, dtype=torch.uint8)
        out[name] = raw.view(dtype).reshape(h["shape"]).clone()
    return out, meta


# --- the shard plan and the fixed-order all-reduce --------------------------------

def shard_plan(n: int, world: int) -> List[Tuple[int, int]]:
    """docs/SPEC.md §2: (start, len) of each rank's shard of n elements;
    the first n % W ranks own one more element."""
    base, extra = divmod(n, world)
    plan, start = [], 0
    for r in range(world):
        length = base + (1 if r < extra else 0)
        plan.append((start, length))
        start += length
    return plan


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _group_rank(group) -> int:
    return dist.get_rank(group)


def fixed_order_all_reduce(tensor: "torch.Tensor", group=None) -> "torch.Tensor":
    """All-reduce `tensor` in place, summed in foldprint's fixed order, and
    return it: bit for bit `foldprint run` of contract `fixed-order` (sum)
    over every rank's `tensor` (docs/SPEC.md §3, §8.4).

    Rank r receives every rank's copy of shard r of the §2 plan (an
    all-to-all), folds them in float32 over source ranks 0..W-1 starting
    from rank 0's value, rounds once to the tensor's dtype, and the shards
    are gathered back (an all-gather, each shard padded to the longest)."""
    if tensor.dtype not in _FP_DTYPES:
        raise ValueError(f"fixed_order_all_reduce reduces f32, bf16 and f16, not {tensor.dtype}")
    if not tensor.is_contiguous():
        raise ValueError("fixed_order_all_reduce needs a contiguous tensor")
    world, rank = _group_size(group), _group_rank(group)
    flat = tensor.view(-1)
    n = flat.numel()
    if world == 1 or n == 0:
        return tensor
    plan = shard_plan(n, world)
    mine = plan[rank][1]
    slots = torch.empty(world * mine, dtype=tensor.dtype, device=tensor.device)
    dist.all_to_all_single(slots, flat, output_split_sizes=[mine] * world,
                           input_split_sizes=[length for _, length in plan], group=group)
    slots = slots.view(world, mine)
    # The chain starts from rank 0's value (not +0.0), then adds sources
    # 1..W-1 in order; a 16-bit slot widens exactly in the mixed add.
    acc = slots[0].to(torch.float32, copy=True)
    for s in range(1, world):
        acc.add_(slots[s])
    shard = acc.to(tensor.dtype)
    longest = plan[0][1]
    if longest * world == n:
        dist.all_gather_into_tensor(flat, shard, group=group)
        return tensor
    send = torch.zeros(longest, dtype=tensor.dtype, device=tensor.device)
    send[:mine] = shard
    gathered = torch.empty(world * longest, dtype=tensor.dtype, device=tensor.device)
    dist.all_gather_into_tensor(gathered, send, group=group)
    gathered = gathered.view(world, longest)
    extra = n % world
    head = extra * longest  # the ranks that own one more element
    flat[:head].copy_(gathered[:extra].reshape(-1))
    flat[head:].copy_(gathered[extra:, : longest - 1].reshape(-1))
    return tensor


# --- recording steps --------------------------------------------------------------------

def _steps(steps: Iterable[int]) -> frozenset:
    if isinstance(steps, (str, bytes)):
        raise TypeError("steps must be a list of step numbers")
    out = set()
    for s in steps:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"steps holds {s!r}; step numbers are integers >= 0")
        out.add(s)
    return frozenset(out)


def _prescale(buffer: "torch.Tensor", world: int, how: str) -> None:
    # DDP without a comm hook multiplies each gradient by 1/W as it copies
    # it into the bucket (a float32 1/W for an f32 bucket); its Python
    # `allreduce_hook` divides by W instead. At W = 3 the two differ.
    if how == "builtin":
        buffer.mul_(1.0 / world)
    else:
        buffer.div_(world)


class _StepFiles:
    """One rank's recording of the listed steps: the step counter, the
    tensors of the step being recorded, and writing them out at its end."""

    def __init__(self, out_dir: PathLike, steps: Iterable[int], group, kind: str,
                 contracts: Sequence[str]):
        self.out_dir = Path(out_dir)
        self.steps = _steps(steps)
        self.group = group
        self.kind = kind
        self.contracts = tuple(contracts)
        self.step = -1
        self.written: List[Path] = []  # step directories this rank completed
        self._inputs: Dict[str, "torch.Tensor"] = {}
        self._outputs: Dict[str, "torch.Tensor"] = {}
        self._meta: Dict[str, str] = {}
        self._warned = False

    @property
    def world(self) -> int:
        return _group_size(self.group)

    @property
    def rank(self) -> int:
        return _group_rank(self.group)

    @property
    def recording(self) -> bool:
        return self.step in self.steps

    def begin(self) -> None:
        if self._inputs:  # a step that never reached its end
            self.finish()
        self.step += 1

    def add(self, name: str, inp: "torch.Tensor", out: "torch.Tensor", meta: Dict) -> None:
        if inp.dtype not in _FP_DTYPES:
            if not self._warned:
                warnings.warn(f"foldprint: {name} is {inp.dtype}; only f32, bf16 and f16 "
                              "buckets are recorded", stacklevel=3)
                self._warned = True
            return
        while name in self._inputs:
            name += "+"
        self._inputs[name] = inp
        self._outputs[name] = out
        self._meta[name] = json.dumps(meta, separators=(",", ":"))

    def step_dir(self, step: int) -> Path:
        return self.out_dir / f"step{step}"


class DDPRecorder(_StepFiles):
    """The state of `record`'s comm hook (and of a recording
    `FixedOrderState`): `step` is the step being reduced (-1 before the
    first), `written` the step directories this rank completed.

    Steps are counted by the hook: a call for the bucket of index 0 starts
    a step, so step k is the k-th backward pass whose gradients DDP
    reduced (steps under `no_sync()` reduce nothing and are not counted)."""

    def __init__(self, out_dir, steps, group=None, prescale="builtin",
                 contracts: Sequence[str] = DEFAULT_CONTRACTS, kind="ddp", names=None):
        super().__init__(out_dir, steps, group, kind, contracts)
        if prescale not in PRESCALES:
            raise ValueError(f"prescale {prescale!r}: one of {', '.join(PRESCALES)}")
        self.prescale = prescale
        self._names = names or {}

    def bucket_names(self, bucket) -> List[str]:
        return [self._names.get(id(p), f"?{i}") for i, p in enumerate(bucket.parameters())]

    def finish(self) -> None:
        """Write the step: this rank's inputs, and on rank 0 the reduced
        outputs and the experiment(s)."""
        if not self._inputs:
            return
        d = self.step_dir(self.step)
        d.mkdir(parents=True, exist_ok=True)
        save_safetensors(d / f"rank{self.rank}.safetensors", self._inputs, self._meta)
        if self.rank == 0:
            save_safetensors(d / "allreduced.safetensors", self._outputs, self._meta)
            _write_experiments(d, f"{self.kind}-step{self.step}", self._inputs, self.world,
                               "rank{rank}.safetensors", "allreduced.safetensors",
                               self.contracts, "all-reduce", {},
                               f"{self.kind} buckets of step {self.step}, W = {self.world}")
        self.written.append(d)
        self._inputs, self._outputs, self._meta = {}, {}, {}


def _write_experiments(d: Path, name: str, tensors: Dict[str, "torch.Tensor"], world: int,
                       addends: str, expect: str, contracts: Sequence[str], collective: str,
                       means: Dict[str, bool], description: str) -> None:
    """`experiment.toml` over every tensor; tensors of several dtypes (or
    reduce-scatters of several ops) get one experiment per kind, each
    naming its tensors."""
    kinds: Dict[Tuple[str, bool], List[str]] = {}
    for n, t in tensors.items():
        kinds.setdefault((_FP_DTYPES[t.dtype], means.get(n, False)), []).append(n)
    for (dtype, mean), names in kinds.items():
        file = "experiment.toml" if len(kinds) == 1 else \
            f"experiment-{dtype}{'-mean' if mean else ''}.toml"
        write_experiment(d / file, name=name, description=description, addends=addends,
                         world=world, expect=expect, contracts=list(contracts), dtype=dtype,
                         tensors=None if len(kinds) == 1 else sorted(names), mean=mean,
                         collective=collective, id="buckets" if collective == "all-reduce" else "shards")


def _param_names(ddp_model) -> Dict[int, str]:
    module = getattr(ddp_model, "module", ddp_model)
    return {id(p): n for n, p in module.named_parameters()}


def _completed(tensor: "torch.Tensor"):
    fut = torch.futures.Future(devices=[tensor.device] if tensor.is_cuda else None)
    fut.set_result(tensor)
    return fut


def _bucket_meta(state: DDPRecorder, bucket) -> Dict:
    params = bucket.parameters()
    return {"index": bucket.index(), "params": state.bucket_names(bucket),
            "shapes": [list(p.shape) for p in params]}


def _recording_allreduce_hook(state: DDPRecorder, bucket):
    """DDP's own reduction (scale by 1/W, all-reduce SUM), recorded on the
    listed steps."""
    if bucket.index() == 0:
        state.begin()
    buf = bucket.buffer()
    _prescale(buf, state.world, state.prescale)
    if not state.recording:
        return (dist.all_reduce(buf, group=state.group, async_op=True)
                .get_future().then(lambda fut: fut.value()[0]))
    inp = buf.detach().to("cpu", copy=True)
    dist.all_reduce(buf, group=state.group)
    state.add(f"bucket{bucket.index()}", inp, buf.detach().to("cpu", copy=True),
              _bucket_meta(state, bucket))
    if bucket.is_last():
        state.finish()
    return _completed(buf)


def record(ddp_model, out_dir: PathLike, steps: Iterable[int], *, process_group=None,
           prescale: str = "builtin", contracts: Sequence[str] = DEFAULT_CONTRACTS) -> DDPRecorder:
    """Register a comm hook on `ddp_model` (a DistributedDataParallel) that
    reduces exactly as DDP does and, on each step in `steps`, writes

        out_dir/step{k}/rank{r}.safetensors    rank r's buckets as reduced
                                               (already scaled by 1/W)
        out_dir/step{k}/allreduced.safetensors the all-reduced buckets (rank 0)
        out_dir/step{k}/experiment.toml        world = W, expect = the above

    one tensor per bucket, `bucket{i}`, in the bucket's dtype, with its
    parameters' names and shapes in the file's metadata under that name.

    `prescale="builtin"` scales like DDP with no hook registered (a multiply
    by 1/W); `"divide"` like `torch.distributed.algorithms.ddp_comm_hooks.
    default_hooks.allreduce_hook` (a division by W). DDP takes one comm hook:
    call this instead of registering another."""
    _need_ddp(ddp_model, "record")
    state = DDPRecorder(out_dir, steps, group=process_group, prescale=prescale,
                        contracts=contracts, names=_param_names(ddp_model))
    ddp_model.register_comm_hook(state, _recording_allreduce_hook)
    return state


def _need_ddp(model, what: str) -> None:
    if not hasattr(model, "register_comm_hook"):
        raise TypeError(f"{what} needs a DistributedDataParallel model, not {type(model).__name__}")
    if not dist.is_initialized():
        raise RuntimeError(f"{what}: torch.distributed is not initialized (init_process_group)")


class FixedOrderState(DDPRecorder):
    """The state of `fixed_order_hook`: the process group, DDP's scaling
    (`prescale`, as in `record`) and, with `record_to` and `steps`, the
    steps whose buckets are recorded as `record` does (the expect file is
    then the fixed-order result)."""

    def __init__(self, process_group=None, prescale: str = "builtin",
                 record_to: Optional[PathLike] = None, steps: Iterable[int] = (),
                 contracts: Sequence[str] = DEFAULT_CONTRACTS, ddp_model=None,
                 side_stream: bool = True):
        super().__init__(record_to if record_to is not None else ".", steps if record_to else (),
                         group=process_group, prescale=prescale, contracts=contracts,
                         kind="fixed-order", names=_param_names(ddp_model) if ddp_model else None)
        # On CUDA, reduce on a stream of its own, so the backward pass goes
        # on while a bucket is exchanged (DDP waits for the result at the end
        # of the backward). False: on the backward's stream.
        self.side_stream = side_stream
        self._streams: Dict["torch.device", "torch.cuda.Stream"] = {}

    def stream(self, device) -> "torch.cuda.Stream":
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]


# The state of `fixed_order_hook` registered with None or a process group.
_PLAIN_STATES: Dict[int, Tuple[object, FixedOrderState]] = {}


def _plain_state(group) -> FixedOrderState:
    held = _PLAIN_STATES.get(id(group))
    if held is None or held[0] is not group:
        held = (group, FixedOrderState(process_group=group))
        _PLAIN_STATES[id(group)] = held
    return held[1]


def fixed_order(ddp_model, *, record_to: Optional[PathLike] = None, steps: Iterable[int] = (),
                process_group=None, prescale: str = "builtin",
                contracts: Sequence[str] = DEFAULT_CONTRACTS) -> FixedOrderState:
    """Make `ddp_model` reduce in foldprint's fixed order (`fixed_order_hook`)
    and, with `record_to`, record the listed steps as `record` does (the
    expect file then holds the fixed-order result). DDP takes one comm
    hook: use this instead of `record`, not with it."""
    _need_ddp(ddp_model, "fixed_order")
    state = FixedOrderState(process_group=process_group, prescale=prescale, record_to=record_to,
                            steps=steps, contracts=contracts, ddp_model=ddp_model)
    ddp_model.register_comm_hook(state, fixed_order_hook)
    return state


def fixed_order_hook(state, bucket):
    """A DDP comm hook reducing each bucket in foldprint's fixed order:

        ddp.register_comm_hook(None, foldprint.torch.fixed_order_hook)
        ddp.register_comm_hook(FixedOrderState(record_to="grads/", steps=[0]), fixed_order_hook)

    The bucket is first scaled by 1/W as DDP does (`FixedOrderState.prescale`),
    then summed by `fixed_order_all_reduce`: what it returns is, bit for bit,
    `foldprint run` with contract fixed-order (sum, not mean) over the
    scaled buckets, whatever NCCL's algorithm, protocol or version. `state`
    is a FixedOrderState, a process group, or None (the default group)."""
    if not isinstance(state, FixedOrderState):
        state = _plain_state(state)
    if bucket.index() == 0:
        state.begin()
    buf = bucket.buffer()
    _prescale(buf, state.world, state.prescale)
    inp = buf.detach().to("cpu", copy=True) if state.recording else None
    if buf.is_cuda and state.side_stream:
        side = state.stream(buf.device)
        side.wait_stream(torch.cuda.current_stream(buf.device))
        with torch.cuda.stream(side):
            out = _fixed_order_bucket(state, bucket, buf, inp)
            # The future's value is ready on this stream: DDP's wait for it
            # makes its own stream wait here.
            return _completed(out)
    return _completed(_fixed_order_bucket(state, bucket, buf, inp))


def _fixed_order_bucket(state: FixedOrderState, bucket, buf, inp):
    fixed_order_all_reduce(buf, group=state.group)
    if inp is not None:
        state.add(f"bucket{bucket.index()}", inp, buf.detach().to("cpu", copy=True),
                  _bucket_meta(state, bucket))
        if bucket.is_last():
            state.finish()
    return buf


# --- FSDP2 ----------------------------------------------------------------------------------

def _fsdp_api():
    try:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter
    except ImportError as e:  # pragma: no cover - older torch
        raise ImportError(f"record_fsdp needs FSDP2 (torch >= 2.6, fully_shard): {e}") from e
    return FSDPModule, ReduceScatter, DefaultReduceScatter


def _op_name(op) -> str:
    for name in ("SUM", "AVG"):
        if op == getattr(dist.ReduceOp, name):
            return name.lower()
    return str(op)


class FSDPRecorder(_StepFiles):
    """The state of `record_fsdp`. Steps are counted by forward passes of
    the model given to `record_fsdp` run with gradients enabled: step k is
    the k-th such forward and the backward after it. A step's files are
    written at the end of its backward (and by `close()`)."""

    def __init__(self, out_dir, steps, group, contracts):
        super().__init__(out_dir, steps, group, "fsdp", contracts)
        self._means: Dict[str, bool] = {}
        self._queued = -1

    def add_shard(self, name, inp, out, op, meta) -> None:
        op_name = _op_name(op)
        if op_name not in ("sum", "avg"):
            if not self._warned:
                warnings.warn(f"foldprint: {name} reduce-scatters with {op_name}; only sum and "
                              "avg are recorded", stacklevel=3)
                self._warned = True
            return
        self.add(name, inp, out, {**meta, "op": op_name})
        self._means[name] = op_name == "avg"
        if self._queued != self.step:
            # Write the step once the whole backward has reduced.
            self._queued = self.step
            torch.autograd.Variable._execution_engine.queue_callback(self.finish)

    def finish(self) -> None:
        if not self._inputs:
            return
        d = self.step_dir(self.step)
        d.mkdir(parents=True, exist_ok=True)
        save_safetensors(d / f"rs_in_rank{self.rank}.safetensors", self._inputs, self._meta)
        save_safetensors(d / f"rs_out_rank{self.rank}.safetensors", self._outputs, self._meta)
        if self.rank == 0:
            _write_experiments(d, f"fsdp-step{self.step}", self._inputs, self.world,
                               "rs_in_rank{rank}.safetensors", "rs_out_rank{rank}.safetensors",
                               self.contracts, "reduce-scatter", self._means,
                               f"FSDP2 reduce-scatters of step {self.step}, W = {self.world}")
        self.written.append(d)
        self._inputs, self._outputs, self._meta, self._means = {}, {}, {}, {}

    def close(self) -> None:
        """Write a step still held (a backward that ended without FSDP's
        callbacks running)."""
        self.finish()


def record_fsdp(model, out_dir: PathLike, steps: Iterable[int], *,
                contracts: Sequence[str] = DEFAULT_CONTRACTS) -> FSDPRecorder:
    """Record, on each step in `steps`, the reduce-scatter of every
    `fully_shard` parameter group under `model` (FSDP2):

        out_dir/step{k}/rs_in_rank{r}.safetensors   rank r's flat inputs
        out_dir/step{k}/rs_out_rank{r}.safetensors  rank r's output shards
        out_dir/step{k}/experiment.toml             collective = "reduce-scatter",
                                                    expect = "rs_out_rank{rank}.safetensors"

    one tensor per parameter group, named after its module (`root` for the
    top one), exactly the tensors FSDP passed to and got from its
    reduce-scatter: after any pre-division, before any post-division. With
    FSDP's default for f32 and bf16 (ReduceOp.AVG, NCCL's ncclAvg) the
    experiment sets `mean = true`; with a SUM (f16, or
    `set_force_sum_reduction_for_comms(True)`) it does not.
    The reduce-scatter itself is FSDP's own, called unchanged."""
    FSDPModule, ReduceScatter, DefaultReduceScatter = _fsdp_api()
    recorder: Optional[FSDPRecorder] = None
    by_id = {id(p): n for n, p in model.named_parameters()}
    for fqn, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        if recorder is None:
            recorder = FSDPRecorder(out_dir, steps, group._reduce_scatter_process_group, contracts)
        names = [by_id.get(id(p.sharded_param), "?") for p in group.fsdp_params]
        comm = _recording_reduce_scatter(ReduceScatter, group._reduce_scatter_comm, recorder,
                                         fqn or "root", names)
        module.set_custom_reduce_scatter(comm)
    if recorder is None:
        raise ValueError("record_fsdp: no fully_shard module with parameters under the model")

    def count_step(_module, _args):
        if torch.is_grad_enabled():
            recorder.begin()

    model.register_forward_pre_hook(count_step)
    return recorder


def _recording_reduce_scatter(base, inner, recorder: FSDPRecorder, name: str, params: List[str]):
    class RecordingReduceScatter(base):
        """FSDP's reduce-scatter, its input and output copied on the
        recorded steps."""

        def allocate(self, size, *, dtype, device):
            return inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            if not recorder.recording:
                return inner(output_tensor, input_tensor, group, op, async_op)
            inp = input_tensor.detach().to("cpu", copy=True)
            work = inner(output_tensor, input_tensor, group, op, False)
            out = output_tensor.detach().to("cpu", copy=True)
            recorder.add_shard(name, inp, out, op, {"params": params})
            return work

    return RecordingReduceScatter()
