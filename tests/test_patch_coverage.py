"""``patch.coverage``: which lines the stack adds, and how the added statements are judged."""

from __future__ import annotations

from pathlib import Path

from patch.coverage import TARGET, added_lines, judge
from prototypes.patched import SERIES_MODULE


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
