"""Run Lightning's own tests (``tests/tests_pytorch`` of a Lightning checkout) against an installed pytorch_lightning.

The repository's tests import the unified package (``lightning.pytorch``, ``lightning.fabric``); the PyPI package we run
is the standalone ``pytorch_lightning`` (with ``lightning_fabric``). As Lightning's CI does for the standalone package,
the test tree is copied into a temporary directory with those imports rewritten (``patch.lightning_test_tree``), and
pytest runs there, one process per selected test directory, with each interpreter given: the stock environment and, when
given, the patched one. Per-test outcomes come from pytest's junit XML (``patch.junit``); the JSON written holds the
versions, the checkout's commit, the counts of each run and every test whose outcome differs between the two runs,
classified by ``patch.lightning_test_differences``.

    python -m patch.lightning_tests --checkout PATH [--commit SHA] [--python STOCK_PY] [--patched-python PATCHED_PY]
        [--out rfc/results/lightning-tests.json] [--select loops trainer ...] [--timeout 120]
        [--install-test-requirements [--requirements FILE ...]] [--stack-tests]

``--stack-tests`` adds the tests the stack carries into Lightning's tests (``patch/tests_pytorch``) to the copied tree
and records, per test, its outcome on stock and patched (``stack_tests``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness_common import code_revision
from patch.junit import Outcome, count_outcomes, diff_outcomes, parse_junit, passed_on_both
from patch.lightning_test_differences import classify_report
from patch.lightning_test_tree import (
    STACK_TEST_MODULES,
    TEST_ROOT,
    UPDATED_TESTS,
    prepare_legacy_checkpoints,
    prepare_tree,
)

# The release's tests of what the RFC changes or relies on: loops, fetchers (under loops/), the trainer with its
# flags and connectors, checkpointing, logging, the tuner, callbacks and profilers; and of the packages the stack edits
# or runs under: core (the LightningModule's self.log), utilities (the batch size and warnings), strategies (DDP's
# vote and gradient sync) and models (whole training runs).
DEFAULT_SELECTION = (
    "loops", "trainer", "tuner", "callbacks", "profilers", "checkpointing", "loggers", "core", "models", "strategies",
    "utilities",
)

# What Lightning's CPU CI installs for its tests, less the distributed strategies' packages (DeepSpeed): the test
# tools and the extras some test modules import unconditionally (jsonargparse, omegaconf).
TEST_REQUIREMENTS = ("requirements/pytorch/test.txt", "requirements/pytorch/extra.txt")
PER_TEST_TIMEOUT_S = 120
RERUNS = 3  # each differing test runs this many times more on each build: a flake does not repeat

_VERSIONS_SCRIPT = (
    "import json, platform, torch, pytorch_lightning, lightning_fabric;"
    "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,"
    " 'pytorch_lightning': pytorch_lightning.__version__, 'lightning_fabric': lightning_fabric.__version__,"
    " 'pytorch_lightning_path': pytorch_lightning.__file__}))"
)
_INSTALLED_SCRIPT = (
    "import json, importlib.metadata as m;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()"
    " if d.metadata['Name']}))"
)


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str | None:
    """The normalised distribution name a requirements line installs (None for comments and options)."""
    line = line.split("#", 1)[0].strip()
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    return _normalised(match.group(0)) if match else None


def missing_requirements(requirement_lines: list[str], installed: dict[str, str]) -> list[str]:
    """The requirement lines whose package is not installed at all; installed ones keep their version."""
    return [
        line.split("#", 1)[0].strip() for line in requirement_lines
        if (name := requirement_name(line)) is not None and name not in installed
    ]


def _installed_distributions(python: str) -> dict[str, str]:
    output = subprocess.run([python, "-c", _INSTALLED_SCRIPT], capture_output=True, text=True, check=True).stdout
    return {_normalised(name): version for name, version in json.loads(output).items()}


def install_test_requirements(python: str, checkout: Path, requirement_files: list[str]) -> list[str]:
    """pip-install the packages of the checkout's requirement files that ``python``'s environment lacks.

    Every distribution already installed is held at its version by a constraints file, so installing them never
    swaps torch (pinned CPU build) or downgrades what the project runs with.
    """
    installed = _installed_distributions(python)
    lines = [line for name in requirement_files for line in (checkout / name).read_text(encoding="utf-8").splitlines()]
    missing = missing_requirements(lines, installed)
    if not missing:
        return []
    with tempfile.TemporaryDirectory() as scratch:
        requirements = Path(scratch, "missing.txt")
        requirements.write_text("\n".join(missing) + "\n", encoding="utf-8")
        constraints = Path(scratch, "installed.txt")
        constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))
        print(f"installing into {python}'s environment: {' | '.join(missing)}", flush=True)
        subprocess.run([python, "-m", "pip", "install", "-r", requirements, "-c", constraints], check=True)
    return missing


def interpreter_versions(python: str) -> dict[str, str]:
    output = subprocess.run([python, "-c", _VERSIONS_SCRIPT], capture_output=True, text=True, check=True).stdout
    return json.loads(output)


def pytest_command(python: str, directory: str, junit: Path, timeout_s: int) -> list[str]:
    return [
        python, "-m", "pytest", directory, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
        f"--timeout={timeout_s}", f"--junitxml={junit}", "-o", "junit_family=xunit1", "--color=no",
        # one module importing a package we lack must not stop its directory's other modules from running
        "--continue-on-collection-errors",
    ]


def run_selection(python: str, tree: Path, selection: list[str], label: str, timeout_s: int) -> dict:
    """Run pytest once per selected directory; returns the merged outcomes and each directory's wall time."""
    outcomes: dict[str, Outcome] = {}
    wall_s: dict[str, float] = {}
    # pytest's exit status per directory: a crash (no junit written) or an interrupted run shows here, not as outcomes
    exit_codes: dict[str, int] = {}
    # the tests must import the interpreter's installed packages, never a caller's source tree
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    for directory in selection:
        junit = tree / f"junit-{label}-{directory.replace('/', '_')}.xml"
        command = pytest_command(python, directory, junit, timeout_s)
        print(f"[{label}] {directory}: {' '.join(command)}", flush=True)
        started = time.monotonic()
        exit_codes[directory] = subprocess.run(command, cwd=tree / TEST_ROOT, env=env, check=False).returncode
        wall_s[directory] = round(time.monotonic() - started, 1)
        found = parse_junit(junit.read_text(encoding="utf-8")) if junit.exists() else {}
        print(f"[{label}] {directory}: {count_outcomes(found)} in {wall_s[directory]} s", flush=True)
        outcomes.update(found)
    return {"outcomes": outcomes, "wall_s": wall_s, "exit_codes": exit_codes}


def run_summary(python: str, run: dict) -> dict:
    outcomes = run["outcomes"]
    return {
        "python": python,
        "versions": interpreter_versions(python),
        "wall_s": round(sum(run["wall_s"].values()), 1),
        "wall_s_per_directory": run["wall_s"],
        "pytest_exit_code_per_directory": run["exit_codes"],
        "counts": count_outcomes(outcomes),
        "not_passed": {
            test_id: {"outcome": result.outcome, "message": result.message}
            for test_id, result in sorted(outcomes.items()) if result.outcome in ("failed", "error")
        },
    }


def _test_id(module: str) -> str:
    return f"tests.tests_pytorch.{module.removesuffix('.py').replace('/', '.')}"


def rerun_differences(interpreters: dict[str, str], tree: Path, differences: list[dict], timeout_s: int,
                      reruns: int = RERUNS) -> None:
    """Run each differing test ``reruns`` times more on each build and record the outcomes in its row (``reruns``):
    the classification tells a difference that does not repeat (a flake of the first run on a busy machine) from a
    change. The differing parametrisations of one test run together, one pytest process per test and attempt (a
    process's start costs more than most tests). A module's collection error (``::<module>``) has nothing to run
    alone."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    by_test: dict[str, list[dict]] = {}
    for row in differences:
        module, _, name = row["test"].partition("::")
        if module and name:
            node = f"{module.removeprefix('tests.tests_pytorch.').replace('.', '/')}.py::{name.split('[')[0]}"
            by_test.setdefault(node, []).append(row)
    for node, rows in by_test.items():
        for row in rows:
            row["reruns"] = {label: [] for label in interpreters}
        for label, python in interpreters.items():
            for attempt in range(reruns):
                junit = tree / f"rerun-{label}-{attempt}.xml"
                junit.unlink(missing_ok=True)
                subprocess.run(pytest_command(python, node, junit, timeout_s), cwd=tree / TEST_ROOT, env=env,
                               check=False, capture_output=True)
                found = parse_junit(junit.read_text()) if junit.is_file() else {}
                for row in rows:
                    row["reruns"][label].append(found[row["test"]].outcome if row["test"] in found else "absent")
        for row in rows:
            print(f"rerun {row['test']}: {row['reruns']}", flush=True)


def stack_test_ids() -> tuple[str, ...]:
    """The ids (as the runner's junit names them) of the tests the stack adds or updates:
    ``tests.tests_pytorch.<module>`` for a module it adds, ``<module>::<test>`` for a test of Lightning's it updates
    (each of its parametrisations). Computed once: a run asks for each of thousands of test ids."""
    return (*(_test_id(module) for module in STACK_TEST_MODULES), *_updated_test_ids())


@functools.cache
def _updated_test_ids() -> tuple[str, ...]:
    return tuple(f"{_test_id(updated.module)}::{updated.test}" for updated in UPDATED_TESTS)


def is_stack_test(test_id: str) -> bool:
    """Whether ``test_id`` is one of ``stack_test_ids``, or a test of a module or a parametrisation of a test there
    (``::<module>``: the module's collection error)."""
    test_id = test_id.removeprefix("::")
    return any(test_id == known or test_id.startswith((f"{known}::", f"{known}["))
               for known in stack_test_ids())


def updated_test_of(test_id: str) -> str | None:
    """The updated test of Lightning's (``<module>::<test>``) that ``test_id`` is a parametrisation of, or None."""
    return next((known for known in _updated_test_ids() if test_id == known or test_id.startswith(f"{known}[")),
                None)


def judge_stack_tests(stock: dict[str, Outcome], patched: dict[str, Outcome]) -> list[dict]:
    """Each test of the stack's modules and each parametrisation of a test of Lightning's it updates (``updated``),
    with its outcome on the two builds, and whether it shows the change: failed (or errored) on stock and passed on
    the stack."""
    rows = []
    for test_id in sorted(set(stock) | set(patched)):
        # a module's collection error (``::<module>``) stands for its tests, as they are read below
        if is_stack_test(test_id) and not test_id.startswith("::"):
            # a module that does not import on one build (it names what the stack adds) errs as a whole there
            module_error = stock.get(f"::{test_id.split('::')[0]}")
            before = stock[test_id].outcome if test_id in stock else module_error.outcome if module_error else "absent"
            after = patched[test_id].outcome if test_id in patched else "absent"
            rows.append(dict(test=test_id, stock=before, patched=after, updated=updated_test_of(test_id) is not None,
                             shows_the_change=before in ("failed", "error") and after == "passed"))
    return rows


def stack_tests_not_shown(rows: list[dict]) -> list[str]:
    """What the stack's tests fail to show: an added test that does not fail on stock and pass with the stack, a
    parametrisation of an updated test that fails with the stack, and an updated test none of whose parametrisations
    fails on stock (its update changed nothing the stack changes). Each with what is wrong."""
    wrong = [f"{row['test']}: does not fail on stock and pass with the stack" for row in rows
             if not row["updated"] and not row["shows_the_change"]]
    wrong += [f"{row['test']}: fails with the stack" for row in rows if row["updated"] and row["patched"] != "passed"]
    for test in sorted({updated_test_of(row["test"]) for row in rows if row["updated"]}):
        if not any(row["shows_the_change"] for row in rows if updated_test_of(row["test"]) == test):
            wrong.append(f"{test}: updated, but no parametrisation of it fails on stock")
    return wrong


def checkout_commit(checkout: Path, given: str | None) -> str:
    if given:
        return given
    found = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="a Lightning checkout (or export) of the release")
    parser.add_argument("--commit", help="the checkout's commit, where PATH is an export rather than a git work tree")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with stock pytorch_lightning")
    parser.add_argument("--patched-python", help="the interpreter with the patched pytorch_lightning")
    parser.add_argument("--out", type=Path, default=Path("rfc/results/lightning-tests.json"))
    parser.add_argument("--select", nargs="*", default=list(DEFAULT_SELECTION),
                        help="directories (or files) under tests/tests_pytorch")
    parser.add_argument("--timeout", type=int, default=PER_TEST_TIMEOUT_S, help="per-test timeout in seconds")
    parser.add_argument("--install-test-requirements", action="store_true",
                        help="pip-install the packages of the --requirements files each environment lacks")
    parser.add_argument("--stack-tests", action="store_true",
                        help="also run the tests the stack adds (patch/tests_pytorch): each must fail on stock and pass"
                             " patched")
    parser.add_argument("--rerun-differences", action="store_true",
                        help="only run the differences of the report at --out again (a report written before reruns"
                             " were part of a run) and classify them again")
    parser.add_argument("--requirements", nargs="+", default=list(TEST_REQUIREMENTS),
                        help="requirement files in the checkout that --install-test-requirements reads")
    return parser.parse_args(argv)


def rerun_report(args: argparse.Namespace, interpreters: dict[str, str]) -> int:
    """``--rerun-differences``: the report at ``--out``, its differences run again and classified again."""
    if not args.out.is_file():
        raise SystemExit(
            f"--rerun-differences runs again the differences of the report at --out, and there is none at {args.out}:"
            " run without --rerun-differences first (a run reruns its differences itself), or name that report."
        )
    report = json.loads(args.out.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="lightning-tests-") as scratch:
        prepare_tree(args.checkout, Path(scratch), bool(report.get("stack_tests")))
        rerun_differences(interpreters, Path(scratch), report["differences"], report["per_test_timeout_s"])
    stale = classify_report(report)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    unclassified = [d["test"] for d in report["differences"] if d["classification"] == "unclassified"]
    for test in unclassified:
        print(f"unclassified: {test}", flush=True)
    return 1 if stale or unclassified else 0


# The patched build's series and the digest of the sources it was generated from, or why it is not this checkout's.
_SERIES_SCRIPT = (
    "import json\n"
    "from prototypes.patched import unavailable_reason, installed_series\n"
    "reason = unavailable_reason()\n"
    "marker = installed_series()\n"
    "print(reason or json.dumps(dict(series=marker.SERIES, sources=marker.SOURCES)))\n"
    "raise SystemExit(1 if reason else 0)\n"
)


def patched_build_series(python: Path) -> dict[str, str] | str:
    """``{"series", "sources"}`` of the patched build ``python`` runs, or why it is not of this checkout's sources."""
    series = subprocess.run([python, "-c", _SERIES_SCRIPT], capture_output=True, text=True)
    if series.returncode != 0:
        return series.stdout.strip() or series.stderr.strip()
    return json.loads(series.stdout)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    interpreters = {"stock": args.python}
    if args.patched_python:
        interpreters["patched"] = args.patched_python
        # Why first: a record of the tests names the series the patched build carried, which must be this checkout's
        series = patched_build_series(args.patched_python)
        if isinstance(series, str):
            print(series, file=sys.stderr)
            return 2
    if args.rerun_differences:
        return rerun_report(args, interpreters)
    if args.install_test_requirements:
        for python in interpreters.values():
            install_test_requirements(python, args.checkout, args.requirements)
    report: dict = {
        "schema": 1,
        "checkout": {"path": str(args.checkout), "commit": checkout_commit(args.checkout, args.commit)},
        "selection": args.select,
        "per_test_timeout_s": args.timeout,
        **(series if args.patched_python else {}),
        "setup": code_revision(Path(__file__).parent),  # the revision of the runner and of the stack's tests
        "runs": {},
    }
    runs = {}
    with tempfile.TemporaryDirectory(prefix="lightning-tests-") as scratch:
        tree = Path(scratch)
        changed = prepare_tree(args.checkout, tree, args.stack_tests)
        print(f"rewrote the imports of {changed} files under {tree}", flush=True)
        # only the checkpointing tests load them, and writing the local one needs the test requirements
        if any(selected.split("/")[0] == "checkpointing" for selected in args.select):
            report["legacy_checkpoints"] = prepare_legacy_checkpoints(args.python, tree)
        stack_selection = [*STACK_TEST_MODULES, *sorted({updated.module for updated in UPDATED_TESTS})]
        selection = [*args.select, *(stack_selection if args.stack_tests else ())]
        for label, python in interpreters.items():
            runs[label] = run_selection(python, tree, selection, label, args.timeout)
            report["runs"][label] = run_summary(python, runs[label])
        if "patched" in runs:
            report["differences"] = diff_outcomes(runs["stock"]["outcomes"], runs["patched"]["outcomes"])
            # with --stack-tests the stack's own tests differ by design (judged below, not classified): the rest
            # run again
            rerun_differences(interpreters, tree, [row for row in report["differences"]
                                                   if not (args.stack_tests and is_stack_test(row["test"]))],
                              args.timeout)
    stock = runs["stock"]["outcomes"]
    report["tests_run"] = report["runs"]["stock"]["counts"]["ran"]
    if "patched" in runs:
        patched = runs["patched"]["outcomes"]
        report["passed_on_both"] = passed_on_both(stock, patched)
        if args.stack_tests:
            report["stack_tests"] = judge_stack_tests(stock, patched)
            report["differences"] = [row for row in report["differences"] if not is_stack_test(row["test"])]
        stale = classify_report(report) if args.select else []  # a run of the stack's tests alone judges no entry
        for key in stale:
            print(f"stale: {key} names no difference: remove it from patch.lightning_test_differences", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({label: run["counts"] for label, run in report["runs"].items()}), flush=True)
    unshown = stack_tests_not_shown(report.get("stack_tests", []))
    for line in unshown:
        print(line, flush=True)
    return 1 if unshown else 0


if __name__ == "__main__":
    sys.exit(main())
