"""What each difference between Lightning's own tests on stock 2.6.6 and on the patched build is.

``python -m patch.lightning_tests`` lists every test whose outcome differs between the two runs; ``CLASSIFIED`` says
what each one is, and the runner writes it beside the difference:

- ``Deliberate(clause, why)``: the specification changes that behaviour on purpose (the clause of
  ``rfc/specification.md`` that says so), so the test asserts what the RFC replaces;
- ``Regression(item, why)``: the patch breaks something the specification keeps; ``item`` is the patch item
  (``patch/items/``) whose edit reads as the cause.

A key is a test id as the runner writes it (``tests_pytorch.<module>::<test>[<parameters>]``), or the id without its
parameters, which stands for every parametrisation of that test. A difference no entry names stays
``"unclassified"``; an entry that names no difference is stale and is reported, so the list keeps to what the last
run measured. To apply an edited list to a committed report without running the tests again:

    python -m patch.lightning_test_differences [rfc/results/lightning-tests.json]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Deliberate:
    """The specification changes the behaviour the test asserts; ``clause`` names where."""

    clause: str
    why: str


@dataclass(frozen=True)
class Regression:
    """The patch breaks what the test asserts, which the specification keeps; ``item`` is the suspected patch item."""

    item: int
    why: str


Classification = Deliberate | Regression

CLASSIFIED: dict[str, Classification] = {}


def entry_for(test_id: str, classified: dict[str, Classification]) -> tuple[str, Classification] | None:
    """The entry naming ``test_id`` (exactly, or its test without parameters) and its key, or None."""
    for key in (test_id, test_id.split("[", 1)[0]):
        if key in classified:
            return key, classified[key]
    return None


def classify(differences: list[dict], classified: dict[str, Classification] = CLASSIFIED) -> list[str]:
    """Write each difference's classification (and its clause or item, and why) in place; return the stale keys."""
    used = set()
    for difference in differences:
        for field in ("clause", "item", "why"):
            difference.pop(field, None)
        found = entry_for(difference["test"], classified)
        if found is None:
            difference["classification"] = "unclassified"
            continue
        key, entry = found
        used.add(key)
        if isinstance(entry, Deliberate):
            difference.update(classification="deliberate", clause=entry.clause, why=entry.why)
        else:
            difference.update(classification="regression", item=entry.item, why=entry.why)
    return sorted(set(classified) - used)


def classify_report(report: dict, classified: dict[str, Classification] = CLASSIFIED) -> list[str]:
    """Classify a runner report's differences and record the stale keys in it; return the stale keys."""
    stale = classify(report.get("differences", []), classified)
    report["classifications_without_a_difference"] = stale
    return stale


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "rfc/results/lightning-tests.json")
    report = json.loads(path.read_text(encoding="utf-8"))
    stale = classify_report(report)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    unclassified = [d["test"] for d in report.get("differences", []) if d["classification"] == "unclassified"]
    for test in unclassified:
        print(f"unclassified: {test}: add it to patch.lightning_test_differences.CLASSIFIED", file=sys.stderr)
    for key in stale:
        print(f"stale: {key} names no difference of {path}: remove it from CLASSIFIED", file=sys.stderr)
    return 1 if stale or unclassified else 0


if __name__ == "__main__":
    sys.exit(main())
