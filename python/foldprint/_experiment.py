"""Writing an experiment TOML over rank files (docs/EXPERIMENTS.md,
"Addends from files"), without a TOML library."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence, Union

CONTRACTS = ("fixed-order", "pairwise-tree", "arrival-order", "nccl-allreduce")
DTYPES = ("f32", "bf16", "f16")
COLLECTIVES = ("all-reduce", "reduce-scatter")

PathLike = Union[str, "os.PathLike[str]"]

# TOML basic strings: these must be escaped; every other control
# character (and DEL) as \uXXXX.
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(s: str) -> str:
    """`s` as a TOML basic string."""
    out = []
    for ch in s:
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise ValueError(f"{s!r} holds a lone surrogate, which TOML cannot hold")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _path_text(what: str, p: PathLike) -> str:
    text = os.fspath(p)
    if not isinstance(text, str):
        raise TypeError(f"{what} must be a str or path, not bytes")
    if not text:
        raise ValueError(f"{what} is empty")
    return text


def write_experiment(
    path: PathLike,
    *,
    name: str,
    addends: PathLike,
    world: int,
    expect: Optional[PathLike] = None,
    contracts: Sequence[str] = ("fixed-order",),
    dtype: Optional[str] = None,
    tensors: Optional[Sequence[str]] = None,
    mean: bool = False,
    collective: str = "all-reduce",
    id: str = "grads",
    description: Optional[str] = None,
) -> Path:
    """Write an experiment reducing W = `world` rank files and return its path.

    `addends` is a path template with `{rank}` (relative to the experiment
    file, as the CLI reads it), e.g. ``"step0/rank{rank}.safetensors"``;
    `expect` the framework's reduced result, compared bit for bit with each
    contract's. One case per contract. A `collective = "reduce-scatter"`
    experiment may name one `expect` file per rank (a template with
    `{rank}`), each holding that rank's shard. The file is written whole or not at
    all (a temporary file renamed over it).
    """
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    if not isinstance(id, str) or not id:
        raise ValueError("id must be a non-empty string")
    template = _path_text("addends", addends)
    if "{rank}" not in template:
        raise ValueError(f"addends {template!r} has no {{rank}} where the rank number goes")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= 65536:
        raise ValueError(f"world must be an integer in 1..=65536, not {world!r}")
    if isinstance(contracts, str):
        contracts = [contracts]
    contracts = list(contracts)
    if not contracts:
        raise ValueError("contracts is empty")
    for c in contracts:
        if c not in CONTRACTS:
            raise ValueError(f"unknown contract {c!r}; one of {', '.join(CONTRACTS)}")
    if len(set(contracts)) != len(contracts):
        raise ValueError(f"contracts {contracts} name one twice")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    if not isinstance(mean, bool):
        raise TypeError(f"mean must be a bool, not {mean!r}")
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")

    lines = [f"name = {toml_string(name)}"]
    if description is not None:
        lines.append(f"description = {toml_string(description)}")
    # A sweep takes world, dtype and mean only as lists: they go in
    # [defaults], so the one sweep's cases differ by contract alone.
    lines += ["", "[defaults]", f"world = {world}"]
    if dtype is not None:
        lines.append(f"dtype = {toml_string(dtype)}")
    if mean:
        lines.append("mean = true")
    if collective != "all-reduce":
        lines.append(f"collective = {toml_string(collective)}")
    lines += ["", "[[sweep]]", f"id = {toml_string(id)}", f"addends = {toml_string(template)}"]
    if tensors is not None:
        if isinstance(tensors, str):
            raise TypeError("tensors must be a sequence of names, not one string")
        lines.append(f"tensors = [{', '.join(toml_string(t) for t in tensors)}]")
    if expect is not None:
        lines.append(f"expect = {toml_string(_path_text('expect', expect))}")
    lines.append(f"contract = [{', '.join(toml_string(c) for c in contracts)}]")
    text = "\n".join(lines) + "\n"

    dest = Path(path)
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest
