"""``harness_common``, what the suite, the benchmarks and the RFC renderer share. (That the three import each other in
no cycle is a contract in ``pyproject.toml``, checked by ``lint-imports``.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import harness_common


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True, timeout=30)


def test_the_code_counts_as_changed_only_outside_the_results_and_rendered_pages(tmp_path: Path) -> None:
    for path in ("prototypes/design.py", "rfc/results/conformance.json", "rfc/generated/matrix.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("committed\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "measured code")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    (tmp_path / "rfc/results/conformance.json").write_text("a new run\n")
    (tmp_path / "rfc/generated/matrix.md").write_text("re-rendered\n")
    assert harness_common.code_revision(tmp_path) == {"git_commit": head, "git_dirty": False}
    (tmp_path / "prototypes/design.py").write_text("changed\n")
    assert harness_common.code_revision(tmp_path) == {"git_commit": head, "git_dirty": True}
