"""The specification's defect table (``rfc/rendering/defects.py``), from synthetic catalogue results built here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "rfc"))  # where `python rfc/render.py` finds it

from rendering import defects as render_defects  # noqa: E402


def results(*defects: dict) -> dict:
    return dict(
        schema=1,
        setup=dict(machine="test-machine", python="3.11", git_commit="feedface" * 5 + "-dirty",
                   generated_at="2000-01-01T00:00:00+00:00"),
        clauses={"C1": "Selection", "C2": "Items", "C3": "Exactly once, in order"},
        defects=list(defects),
    )


def defect(name: str, clause: str, caught: bool = True, **extra) -> dict:
    return dict(dict(name=name, clause=clause, design="alpha", options={}, what=f"breaks {clause} | badly", ran=3,
                     failed=[f"test_{clause.lower()}.py::test_x[sized]"] if caught else [], caught=caught), **extra)


def test_one_row_per_defect_in_clause_order_with_the_tests_that_caught_it():
    block = render_defects.defects_block(results(
        defect("late", "C3"), defect("early", "C1", options={"depth": 0}), defect("middle", "C2")))
    rows = [line for line in block.splitlines() if line.startswith("| C") and not line.startswith("| Clause")]
    assert [row.split("|")[2].strip() for row in rows] == ["`early`", "`middle`", "`late`"]
    assert rows[0] == ("| C1 Selection | `early` | `alpha[depth=0]` | breaks C1 \\| badly "
                       "| `test_c1.py::test_x[sized]` |")
    assert "**3 of 3**" in block and "clauses with a caught defect: 3 of 3." in block
    assert "machine `test-machine`" in block and "commit `feedfacefeed` (with uncommitted changes)" in block


def test_a_missed_defect_and_an_uncovered_clause_are_said_in_bold_and_by_name():
    block = render_defects.defects_block(results(defect("caught", "C1"), defect("missed", "C2", caught=False)))
    assert "| C2 Items | `missed` | `alpha` | breaks C2 \\| badly | **missed** (3 tests passed) |" in block
    assert "**1 of 2**" in block and "(none yet for C2, C3)" in block


def test_no_results_give_the_command_that_makes_them():
    for empty in (None, results()):
        assert render_defects.COMMAND in render_defects.defects_block(empty)
