"""A design's expected-failure file (``tests/conformance/expected_failure_files.py``): each gap named once, every
malformed file an error naming its line, and the reason each test reports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conformance import expected_failure_files

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "adding-a-design.md"

GAPS = "[gaps]\nlost: the design loses batches\n\n[expected failures]\n"


@pytest.mark.parametrize(
    "text, error",
    [
        ("lost: x\n", r":1: 'lost: x' before the \[gaps\] section"),
        ("[expected failures]\n[gaps]\n", r":1: sections out of order"),
        ("[gaps]\nLost batches: x\n", r":2: a gap is '<key>: <sentence>'"),
        ("[gaps]\nlost:\n", r":2: gap 'lost' has no sentence"),
        ("[gaps]\nlost: x\nlost: y\n", r":3: gap 'lost' is already defined on line 2"),
        (GAPS + "dropped\n    test_c02_items.py::test_x\n", r":5: gap 'dropped' is not defined"),
        (GAPS + "lost:\n    test_c02_items.py::test_x\n", r":5: an empty observation after gap 'lost'"),
        (GAPS + "lost\n\nlost: more\n    test_c02_items.py::test_x\n",
         r":5: the group of gap 'lost' covers no test id"),
        (GAPS + "    test_c02_items.py::test_x\n", r":5: expected failure 'test_c02_items.py::test_x' names no gap"),
        (GAPS + "lost\n    test_c02_items.py::test_x\n    test_c02_items.py::test_x\n",
         r":7: 'test_c02_items.py::test_x' is already listed on line 6"),
        ("[gaps]\nlost: x\nunused: y\n[expected failures]\nlost\n    test_c02_items.py::test_x\n",
         r":3: gap 'unused' explains no expected failure"),
    ],
    ids=["before-sections", "sections-out-of-order", "bad-key", "empty-sentence", "gap-defined-twice",
         "undefined-gap", "empty-observation", "group-without-ids", "id-without-gap", "id-listed-twice", "unused-gap"],
)
def test_a_malformed_expected_failure_file_is_an_error(tmp_path, text, error):
    path = tmp_path / "toy.txt"
    path.write_text(text)
    with pytest.raises(pytest.UsageError, match=re.escape(str(path)) + error):
        expected_failure_files.load_expected_failures(path)


def test_each_test_reports_its_groups_observation_and_its_gaps_sentence(tmp_path):
    path = tmp_path / "toy.txt"
    path.write_text(GAPS + "lost: every third batch is missing\n    test_c03.py::test_a\n\n"
                    "lost\n    test_c03.py::test_b\n")
    entries = expected_failure_files.load_expected_failures(path)
    assert {test: (entry.gap, entry.reason) for test, entry in entries.items()} == {
        "test_c03.py::test_a": ("lost", "every third batch is missing; the design loses batches"),
        "test_c03.py::test_b": ("lost", "the design loses batches"),
    }


def test_the_guides_expected_failure_example_is_a_valid_file(tmp_path):
    blocks = [text for text in re.findall(r"```text\n(.*?)```", GUIDE.read_text(), re.S) if "[gaps]" in text]
    assert len(blocks) == 1, "the guide shows the expected-failure format in one text block"
    path = tmp_path / "my_design.txt"
    path.write_text(blocks[0])
    entries = expected_failure_files.load_expected_failures(path)
    assert {entry.gap for entry in entries.values()} == {"progress-counts-step-calls", "raw-loader-batches"}
