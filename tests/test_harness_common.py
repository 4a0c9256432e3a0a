"""``harness_common``, what the suite, the benchmarks and the RFC renderer share. (That the three import each other in
no cycle is a contract in ``pyproject.toml``, checked by ``lint-imports``.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import harness_common
from prototypes.patched import patch_sources
from tests.conformance.ddp import TEST_TIMEOUT_S, WORLD, launch


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
    clean = harness_common.code_revision(tmp_path)
    assert (clean["git_commit"], clean["git_dirty"]) == (head, False)
    (tmp_path / "prototypes/design.py").write_text("changed\n")
    changed = harness_common.code_revision(tmp_path)
    assert (changed["git_commit"], changed["git_dirty"]) == (head, True)
    # the digest of the designs' sources follows the working tree; no other group holds the file
    assert {group for group in clean["sources"] if clean["sources"][group] != changed["sources"][group]} == {"designs"}


def test_each_group_of_measured_sources_holds_files_and_leaves_out_the_harness_unit_tests() -> None:
    listed = {group: harness_common.git("ls-files", "--full-name", "--", *pathspecs).splitlines()
              for group, pathspecs in harness_common.MEASURED_SOURCES.items()}
    empty = [group for group, files in listed.items() if not files]
    assert not empty, f"groups that name no tracked file: {empty}"
    assert "benchmarks/test_s3_overhead.py" in listed["benchmarks"]
    assert "benchmarks/test_harness_unit.py" not in listed["benchmarks"]
    assert "tests/conformance/expected_failures/upstream.txt" in listed["suite"]
    # the patched package's sources are the series' own; the rest of patch/ checks it, and no file is in both
    root = Path(harness_common.REPO_ROOT)
    assert listed["patch"] == sorted(path.relative_to(root).as_posix() for path in patch_sources())
    assert {"patch/lightning_tests.py", "patch/tests_pytorch/loops/test_dataloader_iter_drain.py"} <= set(
        listed["patch-checks"])
    assert not set(listed["patch"]) & set(listed["patch-checks"])
    assert (listed["patch-cost"], "benchmarks/patch_cost.py" in listed["benchmarks"]) == (
        ["benchmarks/patch_cost.py"], False)


WORLDS_AT_ONCE = 12


def _meet_peers(design, rank: int, kind: str, pattern: tuple[int]) -> dict:
    """One rank of a launch test: the world indices its process group's ranks hold, gathered over that group."""
    import torch
    import torch.distributed as dist

    gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.tensor([float(pattern[0])]))
    return dict(error=None, worlds=[int(value.item()) for value in gathered])


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_many_two_rank_worlds_launched_at_once_each_meet_only_their_own_ranks() -> None:
    # Each world's store listens before its ranks start, so no world can lose its port to another's connections.
    runs = [("world", (index,)) for index in range(WORLDS_AT_ONCE)]
    launched = launch(None, [[run] for run in runs], fit=_meet_peers)
    for run in runs:
        outcome = launched[run]
        assert outcome["exitcodes"] == [0] * WORLD, outcome["output"]
        assert [rank["worlds"] for rank in outcome["ranks"]] == [[run[1][0]] * WORLD] * WORLD
