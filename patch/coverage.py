"""How much of the code the stack adds to Lightning its own tests run.

    python -m patch.coverage --checkout PATH [--commit SHA] --patched-python PY --stock-python PY
        [--out rfc/results/patch-coverage.json]

The added lines are the difference between the patched and the stock pytorch_lightning as the two interpreters have
them installed (every ``.py`` file of the package, the series marker module left out); of those, the ones
``coverage`` counts as statements are what the stack adds to run. The stack's own tests (the modules it adds under
``tests/tests_pytorch`` and Lightning's tests it updates, laid out as ``patch.lightning_tests`` lays them out) run on
the patched interpreter under ``coverage`` with subprocesses measured too (the DDP test's spawned ranks); an added
statement that none of them runs is listed with its file, line and text. The target: at least ``TARGET`` of the
added statements run.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness_common import code_revision
from patch.junit import count_outcomes, parse_junit
from patch.lightning_test_tree import STACK_TEST_MODULES, TEST_ROOT, UPDATED_TESTS, prepare_tree
from patch.lightning_tests import checkout_commit, patched_build_series, pytest_command
from prototypes.patched import SERIES_MODULE

TARGET = 0.90
PACKAGE = "pytorch_lightning"

_PACKAGE_DIR_SCRIPT = "import os, pytorch_lightning; print(os.path.dirname(pytorch_lightning.__file__))"
# Run by the patched interpreter (coverage is installed there): each measured file's statements and those not run.
_ANALYSIS_SCRIPT = """
import json, sys, coverage
data = coverage.Coverage(data_file=sys.argv[1])
data.load()
result = {}
for path in json.loads(sys.argv[2]):
    _, statements, _, missing, _ = data.analysis2(path)
    result[path] = {"statements": statements, "missing": missing}
print(json.dumps(result))
"""
_COVERAGE_RC = """
[run]
source = {package}
parallel = true
concurrency = thread, multiprocessing
patch = subprocess
sigterm = true
data_file = {data_file}
"""


def added_lines(stock: Path, patched: Path) -> dict[str, list[int]]:
    """Per file of the patched package (relative path), the numbers of the lines it adds or changes against stock."""
    added: dict[str, list[int]] = {}
    for path in sorted(patched.rglob("*.py")):
        relative = path.relative_to(patched).as_posix()
        if relative == f"{SERIES_MODULE}.py":
            continue
        new = path.read_text(encoding="utf-8").splitlines()
        old_path = stock / relative
        old = old_path.read_text(encoding="utf-8").splitlines() if old_path.is_file() else []
        lines = [
            number + 1
            for tag, _, _, start, end in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()
            if tag in ("insert", "replace")
            for number in range(start, end)
        ]
        if lines:
            added[relative] = lines
    return added


def run_stack_tests(python: str, tree: Path, timeout_s: int) -> tuple[dict, Path]:
    """The stack's tests on ``python`` under coverage; returns their outcome counts and the combined data file."""
    data_file = tree / ".coverage"
    rc = tree / ".coveragerc"
    rc.write_text(_COVERAGE_RC.format(package=PACKAGE, data_file=data_file), encoding="utf-8")
    selection = [*STACK_TEST_MODULES, *(f"{updated.module}::{updated.test}" for updated in UPDATED_TESTS)]
    junit = tree / "junit-coverage.xml"
    options = pytest_command(python, "", junit, timeout_s)[4:]  # the runner's pytest options, its directory left out
    command = [python, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", *selection, *options]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run(command, cwd=tree / TEST_ROOT, env=env, check=False)
    subprocess.run([python, "-m", "coverage", "combine", f"--rcfile={rc}"], cwd=tree / TEST_ROOT, env=env,
                   check=True, capture_output=True)
    outcomes = parse_junit(junit.read_text(encoding="utf-8")) if junit.is_file() else {}
    return count_outcomes(outcomes), data_file


def judge(added: dict[str, list[int]], analysis: dict[str, dict], package: Path,
          sources: dict[str, list[str]]) -> dict:
    """Per file: the added statements and those no test ran (line and text); the totals and the verdict."""
    files, total, run = [], 0, 0
    for relative, lines in added.items():
        measured = analysis.get(str(package / relative), {"statements": [], "missing": []})
        statements = sorted(set(lines) & set(measured["statements"]))
        missed = sorted(set(statements) & set(measured["missing"]))
        if not statements:
            continue
        total += len(statements)
        run += len(statements) - len(missed)
        files.append(dict(path=relative, added_statements=len(statements), not_run=[
            dict(line=number, text=sources[relative][number - 1].strip()) for number in missed
        ]))
    share = run / total if total else 1.0
    return dict(files=files, added_statements=total, run=run, share=round(share, 4), target=TARGET,
                met=share >= TARGET)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True, help="a Lightning checkout (or export) of the tests")
    parser.add_argument("--commit", help="the checkout's commit, where PATH is an export rather than a git work tree")
    parser.add_argument("--patched-python", required=True, help="an interpreter of the patched build, with coverage")
    parser.add_argument("--stock-python", required=True, help="an interpreter with stock pytorch_lightning")
    parser.add_argument("--out", type=Path, default=Path("rfc/results/patch-coverage.json"))
    parser.add_argument("--timeout", type=int, default=120, help="per-test timeout in seconds")
    args = parser.parse_args(argv)

    series = patched_build_series(args.patched_python)
    if isinstance(series, str):
        print(series, file=sys.stderr)
        return 2
    packages = {label: Path(subprocess.run([python, "-c", _PACKAGE_DIR_SCRIPT], capture_output=True, text=True,
                                           check=True).stdout.strip())
                for label, python in (("stock", args.stock_python), ("patched", args.patched_python))}
    added = added_lines(packages["stock"], packages["patched"])
    sources = {relative: (packages["patched"] / relative).read_text(encoding="utf-8").splitlines()
               for relative in added}
    with tempfile.TemporaryDirectory(prefix="patch-coverage-") as scratch:
        tree = Path(scratch)
        prepare_tree(args.checkout, tree, with_stack_tests=True)
        counts, data_file = run_stack_tests(args.patched_python, tree, args.timeout)
        paths = [str(packages["patched"] / relative) for relative in added]
        analysis = json.loads(subprocess.run([args.patched_python, "-c", _ANALYSIS_SCRIPT, str(data_file),
                                              json.dumps(paths)], capture_output=True, text=True, check=True).stdout)
    report = dict(schema=1, **series, setup=code_revision(),
                  checkout=dict(path=str(args.checkout), commit=checkout_commit(args.checkout, args.commit)),
                  tests=counts, **judge(added, analysis, packages["patched"], sources))
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"{report['run']} of {report['added_statements']} added statements run ({report['share']:.1%}; target "
          f"{TARGET:.0%}: {'met' if report['met'] else 'missed'}); tests: {counts}; written to {args.out}")
    return 0 if report["met"] and not counts.get("failed") and not counts.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())
