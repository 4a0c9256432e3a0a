"""Where a results file comes from: the versions, the commit of the measured code, and when.

Shared by the benchmarks and the conformance plugin (``tests/conformance/plugin.py``), so both results files record
their origin the same way. The code counts as changed (``git_dirty``) only when tracked files outside the results
and the pages rendered from them differ from the commit: writing ``rfc/results/`` and re-rendering
``rfc/generated/`` is what a measuring run does, not a change to what was measured.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_PATHS = ("rfc/results", "rfc/generated")  # written by measuring runs and the render tool


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    """``git ARGS`` in ``cwd``: its output, or "unknown" where git or the repository is missing."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_revision(root: Path = REPO_ROOT) -> dict[str, Any]:
    """``git_commit`` (HEAD) and ``git_dirty``: whether tracked files outside ``RESULT_PATHS`` differ from it."""
    excluded = [f":(exclude){path}" for path in RESULT_PATHS]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded, cwd=root)
    return {"git_commit": git("rev-parse", "HEAD", cwd=root), "git_dirty": changed != ""}


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def provenance() -> dict[str, Any]:
    """Python and library versions, the code revision and the time: the part of ``setup`` every results file has."""
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "pytorch_lightning": version("pytorch-lightning"),
        "torchdata": version("torchdata"),
        **code_revision(),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
