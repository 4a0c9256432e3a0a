"""The verdict summary that ends ``pytest --benchmark-only`` (``summary.py``), rendered from the committed
``rfc/results/benchmarks-x86_64-linux-2cpu.json`` as it is and with the intervals and verdicts of the results schema
added."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from benchmarks import summary
from benchmarks.results import RESULTS_DIR
from harness_common.terminal import plain

pytest_plugins = ["pytester"]

COMMITTED_PATH = RESULTS_DIR / "benchmarks-x86_64-linux-2cpu.json"
COMMITTED = json.loads(COMMITTED_PATH.read_text())
VERDICTS = ("met", "missed", "inconclusive", "not judged")


def with_intervals_and_verdicts(document: dict) -> dict:
    """The committed results in the schema's full form: an interval around each value (none for the counts S4
    records), the four verdicts in turn, and a reason for each result not judged."""
    document = copy.deepcopy(document)
    results = [r for target in document["targets"].values() for r in target["results"]]
    for n, result in enumerate(results):
        value = result["value"]
        result["interval"] = [round(value * 0.97, 4), round(value * 1.03, 4)] if isinstance(value, float) else None
        result["verdict"] = VERDICTS[n % len(VERDICTS)]
        if result["verdict"] == "not judged":
            result["reason"] = "the measured load ratio is outside the point's tolerance, so the point is not the one" \
                               " the target names"
    return document


def rendered(document: dict, width: int, complete: bool = True) -> list[str]:
    return [plain(line) for line in summary.render_summary(document, COMMITTED_PATH, width, complete)]


def result_rows(lines: list[str]) -> list[list[str]]:
    """The cells of each result row: indented, below a target's heading."""
    return [line.split("  ") for line in lines if line.startswith(summary.INDENT) and line.rstrip().endswith(
        ("met", "missed", "inconclusive", "not judged"))]


@pytest.mark.parametrize("document", [COMMITTED, with_intervals_and_verdicts(COMMITTED)], ids=["committed", "full"])
@pytest.mark.parametrize("width", [80, 100])
def test_every_judged_result_has_a_row_within_the_width(document, width):
    lines = rendered(document, width)
    assert max(map(len, lines)) <= width
    results = [r for target in document["targets"].values() for r in target["results"]]
    rows = result_rows(lines)
    assert len(rows) == len(results) > 0
    for row, result in zip(rows, results, strict=True):
        cells = [c.strip() for c in row if c.strip()]
        assert cells[0] == result["design"]
        assert cells[-1] == summary.verdict(result)
        assert summary.number(result["value"]) in cells and summary.interval(result) in cells
    written = next(line for line in lines if line.startswith("results written to "))
    assert Path(written.removeprefix("results written to ")).resolve() == COMMITTED_PATH.resolve()


def test_verdicts_come_from_met_when_absent_and_are_counted():
    document = copy.deepcopy(COMMITTED)  # as a results file written before verdicts: `met` alone
    for target in document["targets"].values():
        for result in target["results"]:
            for key in ("verdict", "interval", "reason"):
                result.pop(key, None)
    results = [r for target in document["targets"].values() for r in target["results"]]
    met = sum(r["met"] for r in results)
    lines = rendered(document, 100)
    assert f"verdicts: {met} met, {len(results) - met} missed" in lines


def test_the_full_schema_shows_intervals_reasons_and_colours():
    document = with_intervals_and_verdicts(COMMITTED)
    lines = summary.render_summary(document, COMMITTED_PATH, 80, True)
    text = "\n".join(plain(line) for line in lines)
    assert text.count("not judged: the measured load ratio") == sum(
        r["verdict"] == "not judged" for t in document["targets"].values() for r in t["results"])
    first = next(r for t in document["targets"].values() for r in t["results"] if r["interval"])
    assert f"[{first['interval'][0]:.4f}, {first['interval'][1]:.4f}]" in text
    markup = {text: style for line in lines for text, style in line if text in VERDICTS}
    assert markup["missed"] == dict(red=True, bold=True) and markup["met"] == dict(green=True)


def test_a_partial_run_says_so_and_names_the_targets_it_did_not_measure():
    document = copy.deepcopy(COMMITTED)
    for name in ("S1", "S1-alternatives", "S6"):
        document["targets"][name]["results"] = []
    text = " ".join(" ".join(rendered(document, 80, complete=False)).split())
    assert "no design measured in this run for: S1, S1-alternatives, S6" in text
    assert "(a partial run: not every scenario)" in text
    assert "S1: overlap efficiency" not in text


def test_pytest_benchmarks_tables_print_only_when_asked_for(pytester):
    benchmarks = str(Path(summary.__file__).parent)
    quiet = pytester.parseconfigure(benchmarks, "--benchmark-only")
    tables = pytester.parseconfigure(benchmarks, "--benchmark-only", "--benchmark-tables")
    assert quiet._benchmarksession.quiet and not tables._benchmarksession.quiet
