"""foldprint from Python: write experiments over rank files, run the
installed `foldprint` binary on them, and read its verdict.

Nothing here imports torch (or numpy): the package drives the command-line
tool and reads its JSON report (docs/REPORT.md).
"""

from __future__ import annotations

from ._cli import (
    BadInput,
    BinaryNotFound,
    FoldprintError,
    InfrastructureFailure,
    MissingResource,
    binary,
    torch_nccl_library,
    version,
)
from ._experiment import CONTRACTS, DTYPES, write_experiment
from ._report import (
    ArenaVerdict,
    CaseVerdict,
    CheckResult,
    Report,
    Skipped,
    StepVerdict,
    TensorVerdict,
    check,
    run,
)

try:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _dist_version

    try:
        __version__ = _dist_version("foldprint")
    except PackageNotFoundError:  # imported from a source tree, not installed
        __version__ = "unknown"
except ImportError:  # pragma: no cover - Python < 3.8
    __version__ = "unknown"

__all__ = [
    "ArenaVerdict",
    "BadInput",
    "BinaryNotFound",
    "CONTRACTS",
    "CaseVerdict",
    "CheckResult",
    "DTYPES",
    "FoldprintError",
    "InfrastructureFailure",
    "MissingResource",
    "Report",
    "Skipped",
    "StepVerdict",
    "TensorVerdict",
    "binary",
    "check",
    "torch_nccl_library",
    "run",
    "version",
    "write_experiment",
]
