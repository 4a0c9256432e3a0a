"""``patch.prefixes``' bookkeeping: the list of commits known to fail, and what a run says against it. The smoke
runs themselves are a step of CI (``.ci/run``): seventeen interpreters, too long for the default suite."""

from __future__ import annotations

from patch import prefixes
from patch.items import ITEMS


def _rows(failing: dict[int, str]) -> list[dict]:
    return [dict(item=n, passed=n not in failing, last_line=failing.get(n, "")) for n in (1, 2, 3)]


def test_the_list_of_known_failures_names_items_of_the_series_each_with_a_reason():
    expected = prefixes.expected_failures()
    assert set(expected) <= {item.number for item in ITEMS}
    assert all(reason for reason in expected.values()), expected


def test_the_list_is_read_by_item_with_its_reason_and_comments_skipped(tmp_path):
    listed = tmp_path / "failures.txt"
    listed.write_text("# why this file\n\n3: reads what item 4 adds: a colon in the reason\n")
    assert prefixes.expected_failures(listed) == {3: "reads what item 4 adds: a colon in the reason"}


def test_a_run_that_matches_the_list_says_nothing():
    assert prefixes.differences(_rows({2: "AttributeError"}), {2: "reads what item 3 adds"}) == []


def test_a_listed_commit_that_passes_and_an_unlisted_one_that_fails_are_both_named():
    found = prefixes.differences(_rows({3: "ImportError: cycle"}), {2: "reads what item 3 adds"})
    assert found == [
        f"item 2's commit now passes the smoke run: remove its line from {prefixes.EXPECTED_FAILURES.name}",
        f"item 3's commit fails the smoke run (ImportError: cycle) and is not in {prefixes.EXPECTED_FAILURES.name}",
    ]
