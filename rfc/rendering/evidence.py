"""Whether each committed record still speaks for the code: the source digests a results file carries, against the
sources as they are now.

Every results file records, in its ``setup`` (``setups[*]`` for ``drain-rules.json``, ``runs[*].setup`` for
``durations.json``), a digest of each group of measured sources (``harness_common.MEASURED_SOURCES``: the designs, the
patched package's sources, the patch's checks, the suite, the benchmarks, the patch's cost, the shared harness).
``RECORDS`` says which groups each file measured and the command that makes it again. A file whose group has changed
since it ran, or that carries no digest, is out of date: ``rfc/render.py --check`` fails, naming the file, the groups
and the command. ``evidence_commits`` gives the commits the records ran at, for the first screen.
"""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from harness_common import source_digests
from rendering.defects import COMMAND as DEFECTS_COMMAND
from rendering.drain_rules import COMMAND as DRAIN_COMMAND
from rendering.lightning_tests import COMMAND as LIGHTNING_TESTS_COMMAND
from rendering.lightning_tests import COVERAGE_COMMAND, STACK_TESTS_COMMAND
from rendering.patch_series import COMMAND as SERIES_COMMAND
from rendering.patch_series import COST_COMMAND, MASTER_COMMAND, PREFIXES_COMMAND
from rendering.results import BENCHMARK_COMMAND, CONFORMANCE_COMMAND, load_json

_SUITE_RUN = ("designs", "patch", "suite", "harness")  # the suite runs the designs, the patched one included
# results file (a glob, first match wins) -> the groups of sources it measured, and the command that makes it
RECORDS: list[tuple[str, tuple[str, ...], str]] = [
    ("conformance-patched.json", _SUITE_RUN,
     "PATCHED_PY -m pytest tests/conformance --design patched --results rfc/results/conformance-patched.json"),
    ("conformance.json", _SUITE_RUN, CONFORMANCE_COMMAND),
    ("drain-rules.json", _SUITE_RUN, DRAIN_COMMAND),
    ("defects.json", (*_SUITE_RUN, "patch-checks"), DEFECTS_COMMAND),  # a reverted hunk is the release's (patch.stock)
    ("durations.json", ("designs", "suite", "harness"), "pytest --record-duration rfc/results/durations.json"),
    ("benchmarks-*-patched.json", ("designs", "patch", "benchmarks", "harness"),
     "BENCHMARKS_RESULTS=rfc/results/benchmarks-MACHINE-patched.json PATCHED_PY -m pytest"
     " benchmarks/test_s7_ddp_vote.py --benchmark-only"),
    ("benchmarks-*.json", ("designs", "patch", "benchmarks", "harness"), BENCHMARK_COMMAND),
    ("patch-cost*.json", ("patch", "patch-cost", "benchmarks", "harness"), COST_COMMAND),
    ("patch-series.json", ("patch",), SERIES_COMMAND),
    ("patch-prefixes-master.json", ("patch", "patch-checks"), MASTER_COMMAND),
    ("patch-prefixes.json", ("patch", "patch-checks"), PREFIXES_COMMAND),
    ("patch-coverage.json", ("patch", "patch-checks"), COVERAGE_COMMAND),
    ("lightning-stack-tests.json", ("patch", "patch-checks"), STACK_TESTS_COMMAND),
    ("lightning-tests.json", ("patch", "patch-checks"), LIGHTNING_TESTS_COMMAND),
]


def _setups(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "setup" in data:
        return [data["setup"]]
    if "setups" in data:  # one per column (drain-rules.json)
        return list(data["setups"].values())
    return [run["setup"] for run in data.get("runs", {}).values() if "setup" in run]


def _record(name: str) -> tuple[tuple[str, ...], str] | None:
    return next(((groups, command) for pattern, groups, command in RECORDS if fnmatch(name, pattern)), None)


def outdated_records(results_dir: Path, root: Path) -> list[str]:
    """One line per results file that no longer speaks for the code under ``root``: a group it measured changed
    since it ran, it carries no digest, or no entry of ``RECORDS`` says what it measured. None where ``root`` is in
    no git repository (results made up for a test): there is no code to compare with."""
    now = source_digests(root)
    if not now:
        return []
    problems = []
    for path in sorted(results_dir.glob("*.json")):
        record = _record(path.name)
        if record is None:
            problems.append(f"{path.name}: no entry in rendering.evidence.RECORDS says which sources it measured")
            continue
        groups, command = record
        setups = _setups(load_json(path))
        if not setups or any("sources" not in setup for setup in setups):
            problems.append(f"{path.name}: carries no source digest; re-run `{command}`")
            continue
        changed = sorted({group for setup in setups for group in groups if setup["sources"].get(group) != now[group]})
        if changed:
            commits = sorted({setup.get("git_commit", "unknown")[:12] for setup in setups})
            problems.append(f"{path.name}: {', '.join(changed)} changed since it ran (commit {', '.join(commits)});"
                            f" re-run `{command}`")
    return problems


def evidence_commits(results_dir: Path) -> list[tuple[str, bool, list[str]]]:
    """The commits the committed records ran at, each once: the one most of them ran at first, then in order of first
    appearance by file name. Each with whether all its records measured the very sources the first commit's did
    (every group's digest equal, and recorded), and the files that ran at it."""
    runs: dict[str, list[tuple[tuple[tuple[str, str], ...], str]]] = {}  # commit -> (digests, file) per setup
    for path in sorted(results_dir.glob("*.json")):
        for setup in _setups(load_json(path)):
            digests = tuple(sorted((setup.get("sources") or {}).items()))
            runs.setdefault(setup.get("git_commit", "unknown"), []).append((digests, path.name))
    commits = sorted(runs, key=lambda commit: -len(runs[commit]))  # stable: ties keep their first appearance
    sources = {commit: {digests for digests, _ in runs[commit]} for commit in commits}
    first = sources[commits[0]] if commits else set()
    the_same = len(first) == 1 and () not in first  # the first commit's records measured one set of recorded sources
    return [(commit, the_same and sources[commit] == first, list(dict.fromkeys(name for _, name in runs[commit])))
            for commit in commits]
