"""Lightning's own tests on stock pytorch-lightning and on the patched build (``rfc/results/lightning-tests.json``).

``python -m patch.lightning_tests`` writes the file: per run (``stock``, ``patched``) its versions and counts, the
tests passed on both, and every test whose outcome differs, classified by ``patch.lightning_test_differences`` as a
change the specification makes on purpose (its clause), a regression (the patch item read as its cause), or not yet
classified. The block shows the counts side by side and every difference with its classification.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.markdown import cell, code, commit_text, no_results, table
from rendering.results import Inputs, load_json

RESULTS_FILE = "lightning-tests.json"
COMMAND = (
    "python -m patch.lightning_tests --checkout LIGHTNING --python STOCK_PY --patched-python PATCHED_PY "
    "--install-test-requirements"
)
COUNTS = ("ran", "passed", "failed", "error", "skipped", "xfailed")
RUNS = ("stock", "patched")
TEST_PREFIX = "tests.tests_pytorch."  # every test id starts so (the runner's pytest root is the copied tests/)


def _what_it_is(difference: dict[str, Any]) -> str:
    kind = difference.get("classification", "unclassified")
    if kind == "deliberate":
        return f"deliberate ({difference['clause']})"
    if kind == "regression":
        return f"**regression** (item {difference['item']})"
    if kind == "not repeated":
        return "not repeated (a flake of the first run)"
    return "**unclassified**"


def _summary(results: dict[str, Any]) -> str:
    checkout = results.get("checkout") or {}
    selection = ", ".join(code(directory) for directory in results.get("selection") or [])
    differences = results.get("differences") or []
    kinds = {kind: sum(d.get("classification") == kind for d in differences)
             for kind in ("deliberate", "regression", "not repeated", "unclassified")}
    return (
        f"Lightning's own tests (`tests/tests_pytorch` at commit {code(str(checkout.get('commit', ''))[:12])}, "
        f"directories {selection}) ran {results['tests_run']} tests on stock pytorch-lightning{_series(results)}; "
        f"**{results.get('passed_on_both', 0)} passed on both** builds and **{len(differences)} differ**: "
        f"{kinds['deliberate']} deliberate (the specification changes what they assert), "
        f"{kinds['regression']} regressions, {kinds['not repeated']} not repeated when run again on both builds,"
        f" {kinds['unclassified']} not yet classified. {_limits(results)}"
    )


def _series(results: dict[str, Any]) -> str:
    """Which patch series the patched build carried, where the record says (older records do not)."""
    series = results.get("series")
    return f" and on the patched build of series {code(series.removeprefix('sha256:')[:12])}" if series else ""


def _limits(results: dict[str, Any]) -> str:
    """What the run could not cover: whose tests ran, and which past releases' checkpoints were absent."""
    legacy = results.get("legacy_checkpoints") or {}
    present, absent = legacy.get("versions_with_checkpoints") or [], legacy.get("versions_without_checkpoints") or []
    tests = ("The tests are the checkout's, not a 2.6.6 tag's (the repository has none; `patch/README.md` names the "
             "release whose sources the package matches)."
             + (f" *Note on this record:* {results['note']}." if results.get("note") else ""))
    if not absent:
        return tests
    loaded = (f"{len(present)} past releases' checkpoints loaded" if present else "no past release's checkpoint "
              "loaded")
    return (f"{tests} Legacy checkpoints: {loaded}, {len(absent)} listed releases' were absent, so "
            "`checkpointing/test_legacy_checkpoints.py` resumed only the one written by stock 2.6.6 in this run.")


def _counts_table(runs: dict[str, Any]) -> str:
    present = [name for name in RUNS if name in runs]
    rows = [[count] + [str(runs[name]["counts"].get(count, 0)) for name in present] for count in COUNTS]
    rows.append(["wall time (min)"] + [f"{runs[name]['wall_s'] / 60:.0f}" for name in present])
    return table(["tests", *present], rows, ["---"] + ["---:"] * len(present))


def _versions(runs: dict[str, Any]) -> str:
    parts = []
    for name in RUNS:
        if name in runs:
            versions = runs[name].get("versions") or {}
            parts.append(f"{name}: Python {versions.get('python')}, torch {versions.get('torch')}, "
                         f"pytorch-lightning {versions.get('pytorch_lightning')}")
    return "*Runs:* " + "; ".join(parts) + "."


def _differences_list(differences: list[dict[str, Any]]) -> str:
    """One line per test function, its differing parametrisations counted together where they share their outcomes
    and reason (a list, not a table: test ids do not wrap, and the page has a fixed width)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for d in differences:
        key = (d["test"].removeprefix(TEST_PREFIX).split("[")[0], d["stock"], d["patched"], _what_it_is(d),
               d.get("why", ""))
        groups.setdefault(key, []).append(d)
    lines = []
    for (test, stock, patched, what, why), rows in groups.items():
        cases = f" ({len(rows)} parametrisations)" if len(rows) > 1 else ""
        lines.append(f"- {code(test)}{cases}: {stock} on stock, {patched} patched; {what}: {cell(why)}")
    return "\n".join(lines)


def lightning_tests_block(results: dict[str, Any] | None) -> str:
    """The block's Markdown: a summary line, the counts per run, the versions, and every difference."""
    if not results or "runs" not in results:
        return no_results("results of Lightning's own tests", COMMAND)
    parts = [_summary(results), _counts_table(results["runs"]), _versions(results["runs"])]
    stale = results.get("classifications_without_a_difference") or []
    if stale:
        parts.append("> **Stale classifications:** " + ", ".join(code(key) for key in stale)
                     + " name no difference of this run.")
    differences = results.get("differences") or []
    if differences:
        parts.append(_differences_list(differences))
    return "\n\n".join(parts)


def block_lightning_tests(inputs: Inputs, page_dir: Path) -> str:
    """Lightning's own tests on stock and on the patched build, every difference classified."""
    path = inputs.results_dir / RESULTS_FILE
    return lightning_tests_block(load_json(path) if path.is_file() else None)


STACK_TESTS_FILE = "lightning-stack-tests.json"
STACK_TESTS_COMMAND = (
    "python -m patch.lightning_tests --checkout LIGHTNING --python STOCK_PY --patched-python PATCHED_PY --select"
    " --stack-tests --out rfc/results/lightning-stack-tests.json"
)


def block_lightning_stack_tests(inputs: Inputs, page_dir: Path) -> str:
    """The tests the stack adds to Lightning's tests, and Lightning's tests it updates: each one's outcome on stock and
    with the stack."""
    path = inputs.results_dir / STACK_TESTS_FILE
    if not path.is_file():
        return no_results("results of the tests the stack adds", STACK_TESTS_COMMAND)
    results = load_json(path)
    rows = results.get("stack_tests") or []
    added = [row for row in rows if not row.get("updated")]
    updated = [row for row in rows if row.get("updated")]
    showing = [row for row in added if row["shows_the_change"]]
    modules = sorted({row["test"].split("::")[0] for row in added})
    versions = results["runs"]["stock"]["versions"]
    summary = (
        f"The tests the stack adds to Lightning's `tests/tests_pytorch` (`patch/tests_pytorch/`, run among the tests"
        f" at commit `{results['checkout']['commit'][:12]}`: `{STACK_TESTS_COMMAND}`): {len(added)} tests in"
        f" {len(modules)} modules, of which **{len(showing)} fail on stock pytorch-lightning"
        f" {versions['pytorch_lightning']} and pass with the stack**."
    )
    if updated:
        tests = sorted({row["test"].split("[")[0] for row in updated})
        passing = [row for row in updated if row["patched"] == "passed"]
        changed = [row for row in updated if row["shows_the_change"]]
        summary += (
            f" Lightning's own tests the stack updates, as updated: {len(tests)} tests in {len(updated)}"
            f" parametrisations, of which **{len(passing)} pass with the stack** and {len(changed)} fail on stock (the"
            " others are parametrisations the change leaves alone)."
        )
    others = [row for row in added if not row["shows_the_change"]]
    others += [row for row in updated if row["patched"] != "passed"]
    if not others:
        return summary
    return summary + " Those that do not show their change:\n\n" + table(
        ["test", "stock", "with the stack"],
        [[code(row["test"].removeprefix(TEST_PREFIX)), row["stock"], row["patched"]] for row in others],
    )


COVERAGE_FILE = "patch-coverage.json"
COVERAGE_COMMAND = (
    "python -m patch.coverage --checkout LIGHTNING --patched-python PATCHED_PY --stock-python STOCK_PY"
    " --out rfc/results/patch-coverage.json"
)


def block_patch_coverage(inputs: Inputs, page_dir: Path) -> str:
    """How many of the statements the stack adds its own tests run, with every one they do not run."""
    path = inputs.results_dir / COVERAGE_FILE
    if not path.is_file():
        return no_results("coverage of the stack's added lines", COVERAGE_COMMAND)
    results = load_json(path)
    verdict = "met" if results["met"] else "**missed**"
    summary = (
        f"The stack's own tests (those above, `{COVERAGE_COMMAND}`, at {commit_text(results['setup'])}; the"
        f" series of the `patch/` sources `{results['sources'].removeprefix('sha256:')[:12]}`, which the default suite"
        f" checks are this checkout's) run **{results['run']} of the {results['added_statements']}"
        f" statements it adds** to pytorch_lightning ({results['share']:.1%}; target {results['target']:.0%}:"
        f" {verdict}). Those no test runs:"
    )
    rows = [[code(f["path"]), str(f["added_statements"]),
             cell(", ".join(str(m["line"]) for m in f["not_run"])) or "none"]
            for f in results["files"]]
    return summary + "\n\n" + table(["file", "added statements", "lines not run"], rows)
