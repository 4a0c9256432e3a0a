"""The suite's strength: each defect of the catalogue (``tests/conformance/defects.py``) fails its clause's tests.

Each case applies one defect to a real design, runs only the named tests of that clause against it in-process
with pytester, and fails if they all pass (a defect the suite misses). Write the outcomes the RFC renders with::

    python -m tests.test_defect_catalogue rfc/results/defects.json
"""

from __future__ import annotations

import ast
import json
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import harness_common

# Why imported here: megatron-core registers with torch when imported, and pytester restores sys.modules after each
# in-process run, so a second run importing it afresh would fail on the registration; imported once, it stays
import tests.conformance.megatron_pipeline  # noqa: F401
from prototypes import DESIGNS
from prototypes.patched import installed_series
from tests.conformance import plugin
from tests.conformance.defects import CATALOGUE, Defect
from tests.conformance.defects.patch_hunks import PATCH_HUNK_DEFECTS

pytest_plugins = ["pytester"]

SUITE = Path(plugin.__file__).parent
FAILED = ("failed", "error")


def run_defect(pytester: pytest.Pytester, defect: Defect, results: Path) -> dict[str, Any]:
    """Run the defect's tests against the broken design; what ran, in which clauses, and which tests failed."""
    with defect.applied() as design:
        outcome = pytester.runpytest(
            "-p", "no:cacheprovider", "--design", design.name, "--results", str(results),
            *(("-k", defect.select) if defect.select else ()),
            *(str(SUITE / test) for test in defect.tests),
        )
    ran = json.loads(results.read_text())["results"] if results.is_file() else []
    return dict(
        name=defect.name, clause=defect.clause, design=defect.design, options=dict(defect.options),
        what=defect.what, tests=list(defect.tests), select=defect.select, exit_code=int(outcome.ret),
        ran=len(ran), clauses=sorted({r["clause"] for r in ran}),
        failed=sorted({r["test_id"] for r in ran if r["outcome"] in FAILED}),
    )


def check_caught(pytester: pytest.Pytester, defect: Defect, results: Path, record_property) -> None:
    """Run the defect's tests against the broken design and fail where the suite misses it."""
    record = run_defect(pytester, defect, results)
    record_property("defect", record)
    assert record["ran"], f"no conformance test ran for {defect.tests} -k {defect.select!r}"
    assert record["clauses"] == [defect.clause], f"the defect's tests belong to {record['clauses']}"
    assert record["failed"], (
        f"the suite missed the defect: {defect.design} that {defect.what} passed all {record['ran']} tests of"
        f" {defect.clause} it ran ({', '.join(defect.tests)})"
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("defect", CATALOGUE, ids=lambda d: f"{d.clause}-{d.name}")
def test_the_suite_catches_the_defect_in_its_clause(pytester, defect, tmp_path, record_property):
    """A prototype with one defect: caught in its clause. Runs on stock Lightning, which the prototypes are written
    against: on the patched package, the patch's own behaviour can stand in for what a defect breaks."""
    if installed_series() is not None:
        pytest.skip("the prototypes' defects are judged on stock Lightning; this environment's pytorch_lightning is"
                    " the patched build (run the catalogue with the stock environment's python)")
    check_caught(pytester, defect, tmp_path / "results.json", record_property)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("defect", PATCH_HUNK_DEFECTS, ids=lambda d: f"{d.clause}-{d.name}")
def test_the_suite_catches_a_reverted_patch_hunk(pytester, defect, tmp_path, record_property):
    """The patched design with one of the patch's hunks undone: caught in the clause its item serves. Runs where the
    patched Lightning is installed (CI runs it in that environment)."""
    reason = DESIGNS[defect.design].unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    check_caught(pytester, defect, tmp_path / "results.json", record_property)


def test_the_catalogue_covers_every_clause_with_named_defects():
    names = Counter(d.name for d in (*CATALOGUE, *PATCH_HUNK_DEFECTS))
    assert not [n for n, count in names.items() if count > 1], names
    per_clause = Counter(d.clause for d in CATALOGUE)
    assert set(per_clause) == set(plugin.CLAUSES), f"clauses without a defect: {set(plugin.CLAUSES) - set(per_clause)}"
    assert all(test.startswith(f"test_c{int(d.clause[1:]):02d}_") for d in CATALOGUE for test in d.tests)


def test_no_conformance_module_binds_a_function_a_defect_replaces():
    # A defect replaces a module's function; a test module that imported it by name keeps the original wherever the
    # test module was imported before the defect (the default suite imports every conformance module first)
    replaced = {(owner.__name__, name) for owner, name in (d.patches for d in (*CATALOGUE, *PATCH_HUNK_DEFECTS))
                if isinstance(owner, types.ModuleType)}
    bound = sorted(
        f"{path.relative_to(SUITE)}: from {node.module} import {alias.name}"
        for path in SUITE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if (node.module, alias.name) in replaced
    )
    assert not bound, f"import the module and call through it instead: {bound}"


class _Records:
    """Collects each catalogue case's record (its ``user_properties``) and whether the suite caught the defect."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.records += [
                dict(value, caught=report.passed) for key, value in report.user_properties if key == "defect"
            ]


def main(argv: list[str]) -> int:
    """``python -m tests.test_defect_catalogue PATH [pytest args]``: run the catalogue, write its outcomes to PATH.

    Where PATH holds outcomes already (the stock environment's, say), the defects run now replace theirs and the rest
    are kept: the patched environment adds the reverted hunks' outcomes to the same file."""
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    path, records = Path(argv[0]), _Records()
    status = pytest.main([__file__, "-p", "no:cacheprovider", "-q", *argv[1:]], plugins=[records])
    order = {d.name: position for position, d in enumerate((*CATALOGUE, *PATCH_HUNK_DEFECTS))}
    run_now = {r["name"] for r in records.records}
    kept = json.loads(path.read_text()) if path.is_file() else {}
    # a defect no longer in the catalogue leaves the file with it
    earlier = [r for r in kept.get("defects", []) if r["name"] not in run_now and r["name"] in order]
    # the setup is the catalogue's run's; a run of the reverted patch hunks alone adds its records to it
    catalogue_ran = any(r["name"] in {d.name for d in CATALOGUE} for r in records.records)
    setup = harness_common.conformance_setup() if catalogue_ran or "setup" not in kept else kept["setup"]
    payload = dict(
        schema=1, setup=setup, clauses=plugin.CLAUSES,
        defects=sorted([*earlier, *records.records], key=lambda r: order[r["name"]]),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"{len(records.records)} defects, {sum(r['caught'] for r in records.records)} caught: written to {path}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
