"""Per-test outcomes read from pytest's junit XML, counted, and compared between two runs of the same tests."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass

# Outcomes that mean the test body ran (a skipped test did not).
RAN = ("passed", "failed", "error", "xfailed")
# When one test id appears in several junit entries (a failure in the call and an error at teardown), the worst wins.
SEVERITY = {"skipped": 0, "xfailed": 1, "passed": 2, "failed": 3, "error": 4}


@dataclass(frozen=True)
class Outcome:
    outcome: str  # one of SEVERITY's keys
    message: str = ""  # the first line of the failure, error or skip reason


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0][:300] if (text or "").strip() else ""


def _case_outcome(case: ET.Element) -> Outcome:
    for tag in ("error", "failure"):
        element = case.find(tag)
        if element is not None:
            outcome = "error" if tag == "error" else "failed"
            return Outcome(outcome, _first_line(element.get("message")) or _first_line(element.text))
    skipped = case.find("skipped")
    if skipped is not None:
        outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        return Outcome(outcome, _first_line(skipped.get("message")))
    return Outcome("passed")


def parse_junit(xml_text: str) -> dict[str, Outcome]:
    """Per-test outcomes of one pytest junit XML report, keyed ``classname::name``."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome = _case_outcome(case)
        previous = outcomes.get(test_id)
        if previous is None or SEVERITY[outcome.outcome] > SEVERITY[previous.outcome]:
            outcomes[test_id] = outcome
    return outcomes


def count_outcomes(outcomes: dict[str, Outcome]) -> dict[str, int]:
    counts = {name: 0 for name in SEVERITY}
    for result in outcomes.values():
        counts[result.outcome] += 1
    counts["collected"] = len(outcomes)
    counts["ran"] = sum(counts[name] for name in RAN)
    return counts


def diff_outcomes(stock: dict[str, Outcome], patched: dict[str, Outcome]) -> list[dict[str, str]]:
    """Every test whose outcome differs between the runs ("absent" where one run lacks it), sorted by test id."""
    differences = []
    for test_id in sorted(stock.keys() | patched.keys()):
        before = stock[test_id].outcome if test_id in stock else "absent"
        after = patched[test_id].outcome if test_id in patched else "absent"
        if before != after:
            differences.append({"test": test_id, "stock": before, "patched": after, "classification": "unclassified"})
    return differences


def passed_on_both(stock: dict[str, Outcome], patched: dict[str, Outcome]) -> int:
    return sum(
        1 for test_id, result in stock.items() if result.outcome == "passed" and test_id in patched
        and patched[test_id].outcome == "passed"
    )
