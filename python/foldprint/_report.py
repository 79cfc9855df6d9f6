"""Running experiments and reading the report's verdict (docs/REPORT.md).

"Which contract is the framework's result?" is a value here
(`StepVerdict.matches`), never an exception: the CLI's exit 1 for a case
that differs from its `expect` file is a finding, read from the report.
Only exits 2, 3 and 4 (no verdict reached) raise.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from ._cli import FoldprintError, _call

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ArenaVerdict:
    """One arena (tensor) of a case against the `expect` file."""

    index: int
    name: Optional[str]  # the tensor's name, for safetensors rank files
    len: int
    differing: int
    max_ulp: Optional[int]  # largest ULP distance, NaNs left out
    ulp_histogram: Tuple[int, ...]  # [0] distance 0, [k] 2^(k-1) ..= 2^k - 1

    @property
    def equal(self) -> bool:
        return self.differing == 0


@dataclass(frozen=True)
class CaseVerdict:
    """One case: a contract's result, and whether `expect` equals it."""

    key: str
    id: str
    contract: str
    order: str
    dtype: str
    world: int
    expect_path: Optional[str]
    equal: Optional[bool]  # None: the case has no `expect`
    arenas: Tuple[ArenaVerdict, ...]
    collective: str = "all-reduce"
    # A reduce-scatter compared with one file per rank (`expect_ranks`):
    # each rank's arenas, element indices within its shard. `arenas` then
    # sums them per arena (lengths, differing counts, histograms).
    rank_arenas: Tuple[Tuple[ArenaVerdict, ...], ...] = ()

    @property
    def differing(self) -> int:
        return sum(a.differing for a in self.arenas)

    @property
    def elements(self) -> int:
        return sum(a.len for a in self.arenas)

    @property
    def max_ulp(self) -> Optional[int]:
        ulps = [a.max_ulp for a in self.arenas if a.max_ulp is not None]
        return max(ulps) if ulps else None


@dataclass(frozen=True)
class Skipped:
    key: str
    id: str
    reason: str


@dataclass(frozen=True)
class Report:
    """A `foldprint run` report, with the CLI's exit status (0 or 1)."""

    exit_code: int
    data: Dict[str, Any] = field(repr=False)
    path: Optional[Path] = None

    @property
    def ok(self) -> bool:
        """The run's own checks held (digests, rank copies, groups); a case
        differing from `expect` leaves this true."""
        return bool(self.data["summary"]["ok"])

    @property
    def failures(self) -> List[str]:
        return list(self.data["summary"].get("failures", []))

    @property
    def differs_from_expect(self) -> List[str]:
        return list(self.data["summary"].get("differs_from_expect", []))

    @property
    def git(self) -> str:
        return self.data["foldprint"]["git"]

    @property
    def cases(self) -> Tuple[CaseVerdict, ...]:
        return tuple(_case(c) for c in self.data["cases"])

    @property
    def skipped(self) -> Tuple[Skipped, ...]:
        return tuple(Skipped(s["key"], s["id"], s["reason"]) for s in self.data.get("skipped", []))


def _arenas(block: Dict[str, Any], names: List[str]) -> Tuple[ArenaVerdict, ...]:
    return tuple(
        ArenaVerdict(
            index=a["index"],
            name=names[a["index"]] if a["index"] < len(names) else None,
            len=a["len"],
            differing=a["differing"],
            max_ulp=a["max_ulp"],
            ulp_histogram=tuple(a.get("ulp_histogram", ())),
        )
        for a in block["arenas"]
    )


def _merged(per_rank: Tuple[Tuple[ArenaVerdict, ...], ...]) -> Tuple[ArenaVerdict, ...]:
    """Each arena's verdict over every rank's shard of it."""
    out = []
    for i, first in enumerate(per_rank[0] if per_rank else ()):
        parts = [r[i] for r in per_rank]
        ulps = [p.max_ulp for p in parts if p.max_ulp is not None]
        width = max(len(p.ulp_histogram) for p in parts)
        hist = tuple(sum(p.ulp_histogram[k] for p in parts if k < len(p.ulp_histogram))
                     for k in range(width))
        out.append(ArenaVerdict(index=first.index, name=first.name, len=sum(p.len for p in parts),
                                differing=sum(p.differing for p in parts),
                                max_ulp=max(ulps) if ulps else None, ulp_histogram=hist))
    return tuple(out)


def _case(c: Dict[str, Any]) -> CaseVerdict:
    params = c["params"]
    names = [a["name"] for a in params.get("addends", {}).get("arenas", [])]
    block = c.get("expect")
    ranks = c.get("expect_ranks")
    arenas: Tuple[ArenaVerdict, ...] = ()
    rank_arenas: Tuple[Tuple[ArenaVerdict, ...], ...] = ()
    expect_path: Optional[str] = None
    equal: Optional[bool] = None
    if block is not None:
        arenas = _arenas(block, names)
        expect_path, equal = block["path"], bool(block["equal"])
    elif ranks:
        rank_arenas = tuple(_arenas(r, names) for r in ranks)
        arenas = _merged(rank_arenas)
        expect_path = ranks[0]["path"]
        equal = all(bool(r["equal"]) for r in ranks)
    return CaseVerdict(
        key=c["key"],
        id=c["id"],
        contract=params["contract"],
        order=str(params.get("order", "")),
        dtype=params.get("dtype", "f32"),
        world=params["world"],
        expect_path=expect_path,
        equal=equal,
        arenas=arenas,
        collective=params.get("collective", "all-reduce"),
        rank_arenas=rank_arenas,
    )


def run(experiment: PathLike, backend: str = "cpu", out: Optional[PathLike] = None,
        nan_policy: str = "canonical", launch: Optional[int] = None,
        emulate_hosts: bool = False, expect_gate: str = "all") -> Report:
    """`foldprint run EXPERIMENT --backend BACKEND`, its report read back.

    Exit 0 and 1 are verdicts and return a `Report` (`exit_code` says
    which); exit 2, 3, 4 or a signal raise a `FoldprintError` subclass
    carrying the CLI's stderr. `out` keeps the JSON report at that path;
    without it the report goes to a temporary file, removed after reading.
    `launch=N` runs it as N rank processes (`foldprint launch -n N`), as
    `--backend nccl` needs for one process per GPU or, with
    `emulate_hosts`, N ranks on the GPUs there are. `expect_gate` is
    `--expect-gate`: `"all"` (a difference from `expect` exits 1), `"none"`
    (a finding only, so no rank of a launched job exits 1 for it) or
    contract names such as `"fixed-order"`.
    """
    with tempfile.TemporaryDirectory(prefix="foldprint-") as tmp:
        dest = Path(out) if out is not None else Path(tmp) / "report.json"
        args = ["run", os.fspath(experiment), "--backend", backend,
                "--nan-policy", nan_policy, "--out", os.fspath(dest),
                "--expect-gate", expect_gate]
        if launch is not None:
            if isinstance(launch, bool) or not isinstance(launch, int) or launch < 1:
                raise ValueError(f"launch must be a positive number of ranks, not {launch!r}")
            args = ["launch", "-n", str(launch), *(["--emulate-hosts"] if emulate_hosts else []),
                    "--", *args]
        elif emulate_hosts:
            raise ValueError("emulate_hosts needs launch=N")
        done = _call(args, verdict_codes=(0, 1))
        try:
            with open(dest, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise FoldprintError(
                f"foldprint run exited {done.returncode} but its report {dest} cannot be read: {e}; "
                f"stderr: {done.stderr.strip()}",
                code=done.returncode, stderr=done.stderr,
            ) from e
        if data.get("format") != "foldprint-report" or data.get("version") != 1:
            raise FoldprintError(f"{dest} is not a version 1 foldprint report")
        return Report(exit_code=done.returncode, data=data,
                      path=None if out is None else dest)


@dataclass(frozen=True)
class StepVerdict:
    """One experiment (a recorded step): every case, and the answer to
    "which contract is the framework's result?"."""

    experiment: Path
    report: Report
    cases: Tuple[CaseVerdict, ...]
    skipped: Tuple[Skipped, ...]

    @property
    def matches(self) -> Tuple[str, ...]:
        """The contracts whose every case equals `expect`, bit for bit, in
        report order; empty when none does (or no case has `expect`)."""
        seen: Dict[str, bool] = {}
        for c in self.cases:
            eq = c.equal is True
            seen[c.contract] = seen.get(c.contract, True) and eq
        return tuple(k for k, v in seen.items() if v)

    @property
    def fixed_order(self) -> bool:
        """The framework's result is foldprint's fixed-order sum."""
        return "fixed-order" in self.matches

    @property
    def ok(self) -> bool:
        """The run's own checks held (not whether `expect` matched)."""
        return self.report.ok

    def case(self, contract: str) -> CaseVerdict:
        """The (first) case of `contract`."""
        for c in self.cases:
            if c.contract == contract:
                return c
        raise KeyError(f"{self.experiment}: no case of contract {contract!r} was run")

    @property
    def tensors(self) -> Tuple["TensorVerdict", ...]:
        """One verdict per tensor (a recorded bucket, or a reduce-scatter's
        flat input), in report order: each contract's comparison of it with
        `expect`. Contracts that were skipped (nccl-allreduce on the CPU
        oracle) are absent."""
        order: List[Tuple[int, Optional[str]]] = []
        per: Dict[Tuple[int, Optional[str]], Dict[str, ArenaVerdict]] = {}
        ranks: Dict[Tuple[int, Optional[str]], Dict[str, Tuple[ArenaVerdict, ...]]] = {}
        for c in self.cases:
            for i, a in enumerate(c.arenas):
                k = (a.index, a.name)
                if k not in per:
                    order.append(k)
                    per[k], ranks[k] = {}, {}
                if c.contract not in per[k]:
                    per[k][c.contract] = a
                    if c.rank_arenas:
                        ranks[k][c.contract] = tuple(r[i] for r in c.rank_arenas)
        return tuple(TensorVerdict(index=k[0], name=k[1], contracts=per[k], ranks=ranks[k])
                     for k in order)

    def tensor(self, name: str) -> "TensorVerdict":
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"{self.experiment}: no tensor {name!r} was compared")


@dataclass(frozen=True)
class TensorVerdict:
    """One tensor of a step against `expect`, per contract."""

    index: int
    name: Optional[str]
    contracts: Dict[str, ArenaVerdict]
    # A reduce-scatter compared per rank: each contract's verdict on every
    # rank's shard of this tensor, in rank order (`contracts` sums them).
    ranks: Dict[str, Tuple[ArenaVerdict, ...]] = field(default_factory=dict)

    @property
    def matches(self) -> Tuple[str, ...]:
        """The contracts whose result equals `expect` on this tensor."""
        return tuple(k for k, a in self.contracts.items() if a.equal)

    @property
    def len(self) -> int:
        return next(iter(self.contracts.values())).len if self.contracts else 0


@dataclass(frozen=True)
class CheckResult:
    steps: Tuple[StepVerdict, ...]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.steps)

    @property
    def fixed_order(self) -> bool:
        """Every step's `expect` is the fixed-order sum (the CI gate)."""
        return bool(self.steps) and all(s.fixed_order for s in self.steps)

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)


def check(directory: PathLike, backend: str = "cpu", launch: Optional[int] = None,
          emulate_hosts: bool = False) -> CheckResult:
    """Run every `*.toml` experiment under `directory` (recursively, in path
    order) and return a verdict per step (`StepVerdict.tensors`: per tensor
    or bucket, which contracts equal the framework's result). A directory
    with no experiment, or an experiment the CLI refuses, raises.
    `launch` and `emulate_hosts` are `run`'s. A step's difference from
    its `expect` is its verdict, never a failed rank (`--expect-gate none`);
    gate CI on `CheckResult.fixed_order`."""
    root = Path(directory)
    if not root.is_dir():
        raise FoldprintError(f"{root} is not a directory")
    files = sorted(p for p in root.rglob("*.toml") if p.is_file())
    if not files:
        raise FoldprintError(f"no *.toml experiment under {root}")
    steps = []
    for exp in files:
        report = run(exp, backend=backend, launch=launch, emulate_hosts=emulate_hosts,
                     expect_gate="none")
        steps.append(StepVerdict(experiment=exp, report=report,
                                 cases=report.cases, skipped=report.skipped))
    return CheckResult(tuple(steps))
