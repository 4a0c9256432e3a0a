"""``patch.coverage``: which lines the stack adds, how the added statements are judged, and the committed record:
for the series these ``patch/`` sources generate, with the target met."""

from __future__ import annotations

import json
from pathlib import Path

from patch.coverage import TARGET, added_lines, judge
from prototypes.patched import BUILD_COMMAND, SERIES_MODULE, patch_sources_digest

RECORD = Path(__file__).resolve().parent.parent / "rfc" / "results" / "patch-coverage.json"


def _package(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    return root


def test_added_lines_are_the_inserted_and_changed_lines_of_each_file_and_every_line_of_a_new_one(tmp_path):
    stock = _package(tmp_path / "stock", {"loops/a.py": "x = 1\ny = 2\nz = 3\n", "same.py": "k = 0\n"})
    patched = _package(tmp_path / "patched", {
        "loops/a.py": "x = 1\nw = 0\ny = 5\nz = 3\n", "same.py": "k = 0\n", "loops/new.py": "a = 1\nb = 2\n",
        f"{SERIES_MODULE}.py": "SERIES = 'x'\n",
    })
    assert added_lines(stock, patched) == {"loops/a.py": [2, 3], "loops/new.py": [1, 2]}


def test_only_added_statements_count_and_each_one_not_run_is_listed_with_its_text(tmp_path):
    added = {"loops/a.py": [2, 3, 4], "loops/b.py": [1]}
    analysis = {
        str(tmp_path / "loops/a.py"): {"statements": [1, 2, 4], "missing": [1, 4]},  # line 3: a comment
        str(tmp_path / "loops/b.py"): {"statements": [], "missing": []},  # a docstring only
    }
    sources = {"loops/a.py": ["old()", "new()", "# why", "    unreached()"], "loops/b.py": ['"""Doc."""']}
    verdict = judge(added, analysis, tmp_path, sources)
    assert verdict["added_statements"] == 2 and verdict["run"] == 1 and verdict["share"] == 0.5
    assert verdict["files"] == [{"path": "loops/a.py", "added_statements": 2,
                                 "not_run": [{"line": 4, "text": "unreached()"}]}]
    assert verdict["met"] is (0.5 >= TARGET) is False


def test_the_committed_coverage_is_of_this_checkouts_series_and_meets_the_target():
    record = json.loads(RECORD.read_text(encoding="utf-8"))
    assert record["sources"] == patch_sources_digest(), (
        f"{RECORD.name} was measured on a series generated from other patch/ sources: rebuild the patched environment"
        f" (`{BUILD_COMMAND}`) and run `python -m patch.coverage` (patch/README.md) to measure this one"
    )
    assert record["met"] and record["share"] >= TARGET
    assert record["run"] == record["added_statements"] - sum(len(f["not_run"]) for f in record["files"])
