"""Finding the `foldprint` binary and calling it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional, Sequence

ENV_BIN = "FOLDPRINT_BIN"
_EXE = "foldprint.exe" if os.name == "nt" else "foldprint"


class FoldprintError(Exception):
    """The CLI reached no verdict: bad input (2), a missing resource (3), an
    infrastructure failure (4) or a signal. `code` is its exit status
    (negative: killed by that signal), `stderr` what it printed there."""

    def __init__(self, message: str, code: Optional[int] = None, stderr: str = "",
                 command: Sequence[str] = ()):
        super().__init__(message)
        self.code = code
        self.stderr = stderr
        self.command = list(command)


class BinaryNotFound(FoldprintError):
    """No `foldprint` binary where the package looks for one."""


class BadInput(FoldprintError):
    """Exit 2: usage, a malformed experiment, a missing or bad rank file."""


class MissingResource(FoldprintError):
    """Exit 3: no GPU, driver, library, memory or disk; rerun elsewhere."""


class InfrastructureFailure(FoldprintError):
    """Exit 4: NCCL, a dead peer, the watchdog; rerun."""


_BY_CODE = {2: BadInput, 3: MissingResource, 4: InfrastructureFailure}


def _scripts_dirs() -> List[Path]:
    """Where this interpreter's installs put commands: the environment's
    scripts directory, the interpreter's own directory (a venv used without
    activating it), and the user scheme's (`pip install --user`)."""
    dirs = []
    for path in (
        sysconfig.get_path("scripts"),
        os.path.dirname(sys.executable),
        sysconfig.get_path("scripts", f"{os.name}_user"),
    ):
        if path and Path(path) not in dirs:
            dirs.append(Path(path))
    return dirs


def _runnable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def binary() -> Path:
    """The `foldprint` binary this package runs: `$FOLDPRINT_BIN` when set
    (it must be an executable file), else the one installed beside this
    interpreter's scripts, else the first on PATH."""
    named = os.environ.get(ENV_BIN)
    if named:
        path = Path(named)
        if not _runnable(path):
            raise BinaryNotFound(f"{ENV_BIN}={named} is not an executable file")
        return path
    for d in _scripts_dirs():
        if _runnable(d / _EXE):
            return d / _EXE
    found = shutil.which("foldprint")
    if found:
        return Path(found)
    looked = ", ".join(str(d) for d in _scripts_dirs())
    raise BinaryNotFound(
        f"no foldprint binary: not in {looked}, nor on PATH; install the package "
        f"(`pip install .` in a checkout) or set {ENV_BIN} to the binary"
    )


ENV_NCCL = "FOLDPRINT_NCCL_LIBRARY"


def torch_nccl_library() -> Optional[Path]:
    """The libnccl that PyTorch loaded into this process, when it is
    imported: the one mapped here (/proc/self/maps), else the wheel's
    `nvidia/nccl/lib/libnccl.so.2` beside the torch package. None when
    torch is not imported or has no NCCL. Never imports torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1]
                if os.path.basename(path).startswith("libnccl.so") and os.path.isfile(path):
                    return Path(path)
    except OSError:
        pass  # not Linux: look beside the package
    where = getattr(torch, "__file__", None)
    if where:
        wheel = Path(where).resolve().parent.parent / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
        if wheel.is_file():
            return wheel
    return None


def _child_env() -> Optional[dict]:
    """The CLI's environment: this one, plus `FOLDPRINT_NCCL_LIBRARY` set to
    PyTorch's own NCCL when torch is imported here and it is not set, so the
    `nccl-allreduce` control runs the NCCL the job ran."""
    if os.environ.get(ENV_NCCL):
        return None
    lib = torch_nccl_library()
    if lib is None:
        return None
    return {**os.environ, ENV_NCCL: str(lib)}


def _call(args: Sequence[str], verdict_codes=(0,)) -> subprocess.CompletedProcess:
    """Run the binary with `args`; an exit status outside `verdict_codes`
    raises with the CLI's own stderr."""
    command = [str(binary()), *map(str, args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              env=_child_env())
    except OSError as e:
        raise FoldprintError(f"cannot start {command[0]}: {e}", command=command) from e
    if done.returncode in verdict_codes:
        return done
    code = done.returncode
    stderr = done.stderr.strip()
    what = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    raise _BY_CODE.get(code, FoldprintError)(
        f"`{' '.join(command)}` failed ({what}): {stderr or '(nothing on stderr)'}",
        code=code,
        stderr=done.stderr,
        command=command,
    )


def version() -> str:
    """The binary's version, e.g. `0.1.0` (its `--version` line)."""
    out = _call(["--version"]).stdout.split()
    if len(out) < 2 or out[0] != "foldprint":
        raise FoldprintError(f"unexpected `foldprint --version` output: {' '.join(out)!r}")
    return out[1]
