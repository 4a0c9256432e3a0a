"""What the terminal shows of a conformance run: the header naming what ran, a warning the suite did not expect, and
the conformance matrix (``harness_common/terminal.py``), rendered from the committed ``rfc/results/conformance.json``
and from results with more designs and clauses than any run has had yet."""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from pathlib import Path

import pytest
import pytorch_lightning as pl

import harness_common
from harness_common.terminal import FAILED, plain, render_matrix
from tests.conformance import plugin
from tests.conformance.plugin import CLAUSES
from tests.test_harness import SUITE, registered, run_suite

pytest_plugins = ["pytester"]

COMMITTED = json.loads((Path(__file__).resolve().parent.parent / "rfc" / "results" / "conformance.json").read_text())
SUMMARIES = {name: entry["summary"] for name, entry in COMMITTED["designs"].items()}


def render(results: list[dict], width: int, summaries: dict[str, str] = SUMMARIES) -> list[str]:
    return [plain(line) for line in render_matrix(results, COMMITTED["clauses"], summaries, width)]


def rows(lines: list[str], label: str) -> list[list[str]]:
    """The cells of every table row whose label starts with ``label`` (one per block of columns)."""
    return [line[len(label):].split("  ") for line in lines if line.startswith(label)]


def cell(counts: Counter) -> str:
    return " ".join([str(counts["passed"])] + ([f"x{counts['xfailed']}"] if counts["xfailed"] else []))


def identical_variants(results: list[dict]) -> list[list[str]]:
    """Variants of one design grouped by their outcomes in every clause, in the results' order."""
    groups: dict[tuple, list[str]] = {}
    for variant in dict.fromkeys(r["variant"] for r in results):
        mine = [r for r in results if r["variant"] == variant]
        outcomes = sorted(Counter((r["clause"], r["outcome"]) for r in mine).items())
        groups.setdefault((mine[0]["design"], tuple(outcomes)), []).append(variant)
    return list(groups.values())


@pytest.mark.parametrize("width", [80, 100])
def test_the_committed_matrix_fits_and_collapses_identical_variants(width):
    results = COMMITTED["results"]
    lines = render(results, width)
    assert lines and max(map(len, lines)) <= width
    groups = identical_variants(results)
    assert any(len(group) > 1 for group in groups)  # the committed run has variants with identical outcomes
    header = next(line for line in lines if "batch_processor" in line and "upstream" in line)
    assert len(header.split()) == len(groups)  # a column per group
    legend = " ".join(" ".join(lines).split())
    for group in (g for g in groups if len(g) > 1):
        design = group[0].split("[")[0]
        assert f"{design}: " + ", ".join(v[len(design) + 1 : -1] for v in group) in legend
    for clause in {r["clause"] for r in results}:
        assert len(rows(lines, f"{clause} ")) == 1, clause
    # every column's total is its own tests' counts; the columns follow the designs' order in the summaries
    totals = [c.strip() for c in rows(lines, "all clauses")[0] if c.strip()]
    in_columns = sorted(groups, key=lambda group: list(SUMMARIES).index(group[0].split("[")[0]))
    assert totals == [cell(Counter(r["outcome"] for r in results if r["variant"] == group[0])) for group in in_columns]


def _many(designs: int, clauses: int) -> tuple[list[dict], dict[str, str], dict[str, str]]:
    titles = {f"C{n}": f"a clause with a rather long title, number {n}" for n in range(1, clauses + 1)}
    names = [f"design_with_a_long_name_{n}" for n in range(designs)]
    results = [dict(design=name, variant=name, clause=clause, outcome="xfailed" if (i + j) % 7 == 0 else "passed")
               for i, name in enumerate(names) for j, clause in enumerate(titles)]
    return results, titles, {name: f"summary of {name} " * 6 for name in names}


@pytest.mark.parametrize("width", [80, 100])
def test_any_number_of_designs_and_clauses_fits_in_blocks_of_columns(width):
    results, titles, summaries = _many(designs=14, clauses=40)
    lines = [plain(line) for line in render_matrix(results, titles, summaries, width)]
    assert max(map(len, lines)) <= width
    blocks = rows(lines, "all clauses")
    assert len(blocks) > 1  # 14 columns do not fit beside the clause titles in one table
    assert sum(len([c for c in block if c.strip()]) for block in blocks) == 14
    for n in range(14):  # each column's header names its design in full, broken over lines where it is too wide
        assert re.search(rf"(?<!\w)long_name_{n}\b", "\n".join(lines)), n
    assert all(len(rows(lines, f"{clause} ")) == len(blocks) for clause in titles)


def test_failed_cells_are_marked_and_named():
    results = [dict(r) for r in COMMITTED["results"]]
    broken = next(r for r in results if r["variant"] == "prefetcher[depth=2]" and r["clause"] == "C3")
    broken["outcome"] = "failed"
    lines = render_matrix(results, COMMITTED["clauses"], SUMMARIES, 100)
    marked = [text.strip() for line in lines for text, markup in line if markup == FAILED]
    c3 = Counter(r["outcome"] for r in results if r["variant"] == "prefetcher[depth=2]" and r["clause"] == "C3")
    assert f"{c3['passed']} F1" in marked  # the clause's cell
    assert plain(lines[-1]) == "failed: C3 prefetcher[depth=2]"
    # the variant that failed has a column of its own; the others still share one
    others = len({r["variant"] for r in results if r["design"] == "prefetcher"}) - 1
    assert others >= 2, "the committed results need three prefetcher variants for this check"
    shared = f"{others} variants"
    assert "depth=2" in next(plain(line) for line in lines if plain(line).lstrip().startswith(shared))
    assert not [text for line in render_matrix(COMMITTED["results"], CLAUSES, SUMMARIES, 100)
                for text, markup in line if markup == FAILED]


def test_only_what_ran_is_shown_and_nothing_when_nothing_ran():
    subset = [r for r in COMMITTED["results"] if r["clause"] == "C4" and r["design"] in ("upstream", "callback")]
    lines = render(subset, 80)
    assert [line.split()[0] for line in lines if re.match(r"C\d+ |all clauses", line)] == ["C4", "all"]
    assert not [line for line in lines if "prefetcher" in line or "batch_processor" in line]
    skipped = [dict(r, outcome="skipped") for r in COMMITTED["results"]]
    assert render(skipped, 100) == [] and render([], 100) == []


def test_the_header_names_the_designs_the_versions_and_the_commit(pytester):
    outcome = run_suite(pytester, "--design", "upstream,prefetcher[depth=4]", "--collect-only")
    outcome.stdout.fnmatch_lines([
        "conformance designs: upstream, prefetcher[depth=4]",
        "python *, torch *, pytorch-lightning *, torchdata *, torchrec *",
        f"commit {harness_common.code_revision()['git_commit']}*",
    ])


class WarningTrainer(pl.Trainer):
    def fit(self, *args, **kwargs):
        warnings.warn("the toy design warns where the suite expects nothing", UserWarning, stacklevel=2)
        return super().fit(*args, **kwargs)


@pytest.mark.timeout(300)
def test_a_warning_the_suite_did_not_expect_still_reaches_the_summary(pytester):
    # The suite silences the Lightning warnings it provokes on purpose where it provokes them: anything else shows.
    with registered("toy_warning", "stock Lightning that warns in every fit", lambda kwargs: WarningTrainer(**kwargs)):
        outcome = run_suite(pytester, "--design", "toy_warning", "-k", "test_batch_idx_restarts",
                            targets=(str(SUITE / "test_c02_items.py"),))
    outcome.assert_outcomes(passed=2, warnings=2)
    outcome.stdout.fnmatch_lines(["*warnings summary*", "*UserWarning: the toy design warns where the suite expects*"])


@pytest.mark.timeout(300)
def test_a_run_shows_each_clause_as_it_starts_and_a_long_ones_heartbeat(pytester, monkeypatch):
    monkeypatch.setattr(plugin._Progress, "HEARTBEAT_S", 0)  # every test after a clause's first is a heartbeat
    c5 = next(SUITE.glob("test_c05_*.py"))
    selected = "test_batch_idx_restarts or test_stop_iteration_in_step_runs_epoch_end"
    outcome = run_suite(pytester, "--progress", "on", "--design", "upstream", "-k", selected,
                        targets=(str(SUITE / "test_c02_items.py"), str(c5)))
    lines = outcome.stdout.lines
    clause_lines = [line for line in lines if re.match(r"\[\d+/\d+ \d+:\d\d\] C\d+ \w", line)]
    total = outcome.parseoutcomes().get("passed", 0) + outcome.parseoutcomes().get("xfailed", 0)
    assert clause_lines[0].startswith(f"[0/{total} 0:00] C2 Items: 2 tests; upstream"), lines
    assert any(re.match(rf"\[2/{total} \d+:\d\d\] C5 End of data: \d+ tests; upstream", line) for line in lines)
    words = " ".join(outcome.stdout.str().split())
    assert f"[1/{total} " in words and "C2 running upstream: test_c02_items.py::test_batch_idx_restarts" in words
    assert max(len(line) for line in lines if re.match(r"\[\d+/\d+ |           \S", line)) <= 100

    for quiet in ("-q", "--progress=auto"):  # under -q; by default, in a log without a terminal (as here)
        run = run_suite(pytester, quiet, "--design", "upstream", "-k", "test_batch_idx_restarts",
                        targets=(str(SUITE / "test_c02_items.py"),))
        assert run.ret == 0 and not [line for line in run.stdout.lines if re.match(r"\[\d+/\d+ ", line)]


def test_outcomes_follow_the_registrys_order_of_designs_and_variants():
    designs = harness_common.select_designs(None)
    state = plugin._State(designs)
    for position, design in enumerate(reversed(designs)):  # reported in the reverse order, and by name
        state.tests[f"t{position}"] = dict(design=design.name, variant=design.id, test_id="t.py::t", clause="C2")
        state.outcomes[f"t{position}"] = "passed"
    assert [result["variant"] for result in plugin.outcomes(state)] == [design.id for design in designs]
