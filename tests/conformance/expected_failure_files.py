"""A design's expected-failure file, ``expected_failures/<design>.txt``: each gap named once, then the tests it fails.

    # comments start with '#'
    [gaps]
    <key>: <sentence: what the design lacks or does instead, and why>

    [expected failures]
    <key>: <what these tests observe, when it says more than the gap>
        <file>::<test>[<params without the design>]
    <key>
        <file>::<test>[<params without the design>]

A gap is defined once, by a key (lower case, digits and ``-``) and its sentence, and every group of expected failures
refers to one. A test's reason is the group's observation followed by its gap's sentence (``<observation>;
<sentence>``), or the sentence alone: that is what the xfail and the results JSON report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

GAPS_HEADER = "[gaps]"
FAILURES_HEADER = "[expected failures]"
_KEY = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class ExpectedFailure:
    """Why one test fails for a design: the gap's key and sentence, the reason the xfail reports (what the test
    observes, then the sentence), where the test id is listed."""

    gap: str
    sentence: str
    reason: str
    line: int


def expected_failures_path(suite_dir: Path, design_name: str, extra_dir: str | None = None) -> Path:
    """``<design>.txt`` in ``--expected-failures DIR`` if it is there, else in the suite's own directory."""
    if extra_dir and (Path(extra_dir) / f"{design_name}.txt").exists():
        return Path(extra_dir) / f"{design_name}.txt"
    return suite_dir / f"{design_name}.txt"


def load_expected_failures(path: Path) -> dict[str, ExpectedFailure]:
    """``{contract id: ExpectedFailure}`` from a design's file (none if it has no file).

    Errors, each naming the line: a line outside the two sections or the sections out of order, a malformed or
    repeated gap key, an empty sentence, a group naming an undefined gap, a group with no test id under it, a test id
    outside a group or listed twice, and a gap no group refers to.
    """
    if not path.exists():
        return {}

    def error(number: int, message: str) -> pytest.UsageError:
        return pytest.UsageError(f"{path}:{number}: {message}")

    gaps: dict[str, tuple[str, int]] = {}
    used: set[str] = set()
    entries: dict[str, ExpectedFailure] = {}
    section = None
    group: tuple[str, str, int] | None = None  # (gap key, reason, line)
    covered = 0

    def close_group() -> None:
        if group is not None and not covered:
            raise error(group[2], f"the group of gap {group[0]!r} covers no test id (indent the ids under it)")

    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.strip() in (GAPS_HEADER, FAILURES_HEADER):
            expected_header = GAPS_HEADER if section is None else FAILURES_HEADER if section == GAPS_HEADER else None
            if line.strip() != expected_header:
                raise error(number, f"sections out of order: {GAPS_HEADER} first, then {FAILURES_HEADER}, each once")
            section = line.strip()
            continue
        if section is None:
            raise error(number, f"{line.strip()!r} before the {GAPS_HEADER} section")
        key, _, text = line.strip().partition(":")
        key, text = key.strip(), text.strip()
        if section == GAPS_HEADER:
            if line[0].isspace() or not _KEY.fullmatch(key):
                raise error(number, f"a gap is '<key>: <sentence>' with a key of a-z, 0-9 and '-', not {line!r}")
            if not text:
                raise error(number, f"gap {key!r} has no sentence")
            if key in gaps:
                raise error(number, f"gap {key!r} is already defined on line {gaps[key][1]}")
            gaps[key] = (text, number)
        elif not line[0].isspace():
            close_group()
            if key not in gaps:
                raise error(number, f"gap {key!r} is not defined in the {GAPS_HEADER} section")
            if ":" in line and not text:
                raise error(number, f"an empty observation after gap {key!r} (drop the ':' or say what the tests see)")
            used.add(key)
            group, covered = (key, f"{text}; {gaps[key][0]}" if text else gaps[key][0], number), 0
        else:
            test_id = line.strip()
            if group is None:
                raise error(number, f"expected failure {test_id!r} names no gap (indent it under a '<gap key>' line)")
            if test_id in entries:
                raise error(number, f"{test_id!r} is already listed on line {entries[test_id].line}")
            entries[test_id] = ExpectedFailure(gap=group[0], sentence=gaps[group[0]][0], reason=group[1], line=number)
            covered += 1
    close_group()
    unused = sorted(set(gaps) - used)
    if unused:
        raise error(gaps[unused[0]][1], f"gap {unused[0]!r} explains no expected failure (delete it or refer to it)")
    return entries
