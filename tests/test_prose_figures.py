"""No measurement typed into the RFC's or the site's prose: every figure comes from ``python rfc/render.py``.

A figure with a unit (s, ms, us, min, %, GiB, MiB, x) or a count of tests, runs, batches, rounds, pairs,
collectives, votes, all-reduces, broadcasts, patches, files or lines in
``rfc/**/*.md`` or ``docs/**/*.md`` outside a generated block (and outside ``rfc/generated/``, which is generated as a
whole) fails, naming the file, the line and the figure. A number that is a definition, not a measurement, is
allowed by ``ALLOWED``, each entry with why. The README's durations are those of the runs recorded in
``rfc/results/durations.json`` (``pytest --record-duration``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED_BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", re.DOTALL)
_NUMBER = r"(?<![\w.#])\d+(?:[.,]\d+)?"
# a count of communication spelled out: "one vote per step call" is as much a measurement as "1 vote"
_NUMBER_WORD = r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten)"
_COMMUNICATION = r"(?:collectives?|votes?|all-reduces?|broadcasts?|host (?:syncs?|reads?)|device-to-host syncs?)"
FIGURE_RE = re.compile(
    rf"{_NUMBER}\s?(?:%|(?:s|ms|us|µs|min|minutes?|seconds?|hours?|GiB|MiB|GB|MB|x|×)(?![\w-]))"  # with a unit
    rf"|{_NUMBER}\s?(?:\w+\s)?(?:tests?|runs?|batch(?:es)?|rounds?|pairs?|collectives?|votes?|all-reduces?"
    rf"|broadcasts?|patch(?:es)?|files?|lines?|attributes?|host syncs?|host reads?)\b"  # a count (one word between)
    rf"|{_NUMBER_WORD}\s(?:[\w-]+\s)?{_COMMUNICATION}\b"
    rf"|{_NUMBER}m{_NUMBER}s\b",  # a duration such as 15m18s
)

# (pattern the figure's line must match, why it is a definition and not a measurement)
ALLOWED: list[tuple[str, str]] = [
    (r"95 %", "the confidence level of every interval: a choice of the method, not a result"),
    (r"more than 10 %", "the tolerance of a point's measured ratio, a constant of the benchmarks "
                        "(harness_common.RATIO_TOLERANCE)"),
    (r"loader of 8 batches", "C7's worked example of the validation rule: its input, not a measurement"),
    (r"and 16 batches", "C7's worked example: the batch counts its definition gives, not a measurement"),
    (r"at most 100 lines", "the size rule for a class in prototypes/ (tests/designs/test_class_size.MAX_CLASS_LINES)"),
    (r"one all-reduce after each (?:step )?call", "what the vote is (patch/items/ranks.py), not a measurement; "
                                                 "test_c16_collectives.py counts it"),
    (r"about 20 ms of compute", "S7's second step, a constant of the benchmark "
                                "(benchmarks/test_s7_ddp_vote.COMPUTE_S)"),
    (r"get 10 seconds to exit", "the grace C12 gives torch's own workers and threads "
                                "(tests/conformance/harness/leftovers.assert_nothing_left)"),
]


def figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) for each typed figure in ``text`` outside generated blocks and not allowed."""
    blanked = GENERATED_BLOCK_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    lines = blanked.splitlines()
    found = []
    for m in FIGURE_RE.finditer(blanked):
        lineno = blanked.count("\n", 0, m.start()) + 1
        context = _spaced(" ".join(lines[max(0, lineno - 2):lineno + 2]))  # a figure may wrap onto the next line
        figure = _spaced(m.group(0))
        if not any(figure in allowed.group(0) for pattern, _ in ALLOWED for allowed in re.finditer(pattern, context)):
            found.append((lineno, figure))
    return found


def _spaced(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def prose_pages() -> list[Path]:
    generated = ROOT / "rfc" / "generated"
    pages = [p for p in sorted((ROOT / "rfc").rglob("*.md")) if generated not in p.parents]
    return pages + sorted((ROOT / "docs").glob("**/*.md"), key=str) if (ROOT / "docs").is_dir() else pages


def _own_docs(path: Path) -> bool:
    return "rfc" not in path.relative_to(ROOT / "docs").parts if path.is_relative_to(ROOT / "docs") else True


@pytest.mark.parametrize("page", [p for p in prose_pages() if _own_docs(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measurement_is_typed_into_the_prose(page: Path):
    found = figures(page.read_text(encoding="utf-8"))
    assert not found, (
        f"{page.relative_to(ROOT)}: figures typed by hand (render them with a generated block, or, for a "
        "definition, add an entry with its reason to ALLOWED):\n"
        + "\n".join(f"  line {n}: {figure!r}" for n, figure in found)
    )


@pytest.mark.parametrize("typed", [
    "Stock Lightning evaluates 6 of 8 batches per run.",
    "The suite's steps (70 tests) and TorchRec's pipelines (12 runs).",
    "The thread costs 3.5 ms per batch, 12 % of the step.",
    "A run takes 15m18s on this machine; S3 uses 24 lockstep pairs over 9 rounds.",
    "Peak memory grows by 1.5 GiB at depth 8; the thread is 1.4x faster.",
    "A step call costs 2 collectives and 3 host syncs; the series has 16 patches adding 1936 lines in 27 files.",
])
def test_a_typed_figure_fails(typed: str):
    assert figures(f"# A page\n\nSome prose. {typed}\n")


def test_figures_in_generated_blocks_and_definitions_pass():
    page = ("# A page\n\n<!-- BEGIN GENERATED: standing -->\n6 of 8 batches, 3.5 ms\n<!-- END GENERATED: standing -->"
            "\n\nEach figure has its 95 % interval; a step pulls batch i + 1.\n")
    assert figures(page) == []


# --------------------------------------------------------------------------------------------------- paths
# a path of this repository in backticks: it starts at one of the repository's top-level folders
PATH_RE = re.compile(r"`((?:prototypes|tests|benchmarks|rfc|docs|patch|harness_common|\.ci)/[^`\s*<>{}]*)`")
PATH_PAGES = ["README.md", "patch/README.md", "benchmarks/README.md"]
# (path prefix, why a page may name it though this repository has none)
NOT_OURS: list[tuple[str, str]] = [
    ("tests/tests_pytorch", "Lightning's own test folder, in its repository (patch.lightning_tests runs it)"),
    ("tests/legacy", "Lightning's legacy-checkpoint folder, in its repository"),
    ("prototypes/my_design.py", "the example module docs/adding-a-design.md asks the reader to write"),
    ("tests/conformance/expected_failures/my_design.txt", "that example's expected-failure file"),
]


def missing_paths(text: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line number, path) for each repository path in backticks that names no file or folder under ``root``; a
    test id's ``::name[params]`` and a trailing ``/`` are not part of the path."""
    found = []
    for m in PATH_RE.finditer(text):
        path = m.group(1).split("::", 1)[0].rstrip("/.,")
        if not (root / path).exists() and not any(path.startswith(prefix) for prefix, _ in NOT_OURS):
            found.append((text.count("\n", 0, m.start()) + 1, path))
    return found


@pytest.mark.parametrize("page", [*(p for p in prose_pages() if _own_docs(p)), *(ROOT / p for p in PATH_PAGES)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_the_prose_names_exists(page: Path):
    found = missing_paths(page.read_text(encoding="utf-8"))
    assert not found, (
        f"{page.relative_to(ROOT)}: paths in backticks that name nothing in this repository (moved or renamed? "
        "fix the page, or the code if the page was right):\n" + "\n".join(f"  line {n}: {p}" for n, p in found)
    )


def test_a_missing_path_fails_and_an_existing_one_passes(tmp_path: Path):
    (tmp_path / "prototypes" / "prefetcher").mkdir(parents=True)
    (tmp_path / "prototypes" / "prefetcher" / "fetcher.py").touch()
    text = ("The rule lives in `prototypes/prefetcher/queue.py`; the fetcher in `prototypes/prefetcher/fetcher.py`"
            " and `prototypes/prefetcher/`; a test `prototypes/prefetcher/fetcher.py::test_x[a-b]`.")
    assert missing_paths(text, tmp_path) == [(1, "prototypes/prefetcher/queue.py")]


# --------------------------------------------------------------------------------------------------- claims
# a comparative claim, and what counts as naming its evidence in the same sentence: a target's row, a test, a table
CLAIM_RE = re.compile(r"\b(faster|slower|cheaper|beats?|beat|pays no|outperform\w*|costs? (?:less|more))\b", re.I)
EVIDENCE_RE = re.compile(r"row `|`test_|test_\w+\.py|targets table|\btable\b|\bS\d\b|measured|block", re.I)
# (pattern the sentence must match, why it needs no measurement beside it)
ALLOWED_CLAIMS: list[tuple[str, str]] = [
    (r"every attribute lookup .* slower", "CPython's documented cost of a lost inline layout, a mechanism the "
                                          "attribute-layout test guards, not a comparison of designs"),
    (r"asserted only that the asynchronous run beat", "prior art: what Lightning's old test asserted"),
    (r"it would cost more in hand-off than it saves", "the reason for the auto rule's threshold, whose measurements "
                                                      "are the S1, S3 and S6 tables the page names next"),
    (r"every lookup on\s+it is slower", "CPython's documented cost of a lost inline layout"),
]


def unsupported_claims(text: str) -> list[tuple[int, str]]:
    """(line, sentence) for each comparative claim outside generated blocks whose sentence names no evidence."""
    blanked = GENERATED_BLOCK_RE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found = []
    for paragraph in re.finditer(r"(?:[^\n]+\n?)+", blanked):
        offset = paragraph.start()
        for sentence in re.split(r"(?<=[.!?])\s+", paragraph.group(0)):
            spaced = _spaced(sentence)
            if (CLAIM_RE.search(spaced) and not EVIDENCE_RE.search(spaced)
                    and not any(re.search(pattern, spaced) for pattern, _ in ALLOWED_CLAIMS)):
                start = blanked.find(sentence, offset)
                found.append((blanked.count("\n", 0, start) + 1, spaced[:160]))
    return found


@pytest.mark.parametrize("page", [p for p in prose_pages() if _own_docs(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_comparative_claim_names_its_evidence(page: Path):
    found = unsupported_claims(page.read_text(encoding="utf-8"))
    assert not found, (
        f"{page.relative_to(ROOT)}: comparative claims that name no target, test or table (name the evidence in the "
        "sentence, render it, or drop the claim):\n" + "\n".join(f"  line {n}: {s}" for n, s in found)
    )


def test_a_claim_without_evidence_fails_and_one_with_it_passes():
    page = ("# A page\n\nThe patch pays no subclass's tax. The thread is faster at S1 L=C (targets table, row "
            "`S1-alternatives`).\n")
    assert [line for line, _ in unsupported_claims(page)] == [3]


# ---------------------------------------------------------------------------------- drift a review found, again
# Sentences that drifted from the code in these pages and were fixed, each typed back in as it was: every one must
# fail a check above (a count of votes typed by hand, a path to a module that was renamed, figures from one machine).
REVIEWED_DRIFT = {
    "a vote count": ("The ranks take one end-of-data vote per step call (the specification's C16).", figures, 1),
    "a renamed module": ("The auto rule lives in `prototypes/prefetcher/queue.py`.", missing_paths, 1),
    "figures from one machine": ("A design overrides more than 29 attributes; the series applies in 6.5 minutes.",
                                 figures, 2),
}


@pytest.mark.parametrize("drift", REVIEWED_DRIFT, ids=str)
def test_drift_a_review_found_fails_when_typed_back(drift: str):
    text, check, expected = REVIEWED_DRIFT[drift]
    assert len(check(f"# A page\n\nSome prose. {text}\n")) == expected


# --------------------------------------------------------------------------------------------------- durations
DURATIONS = ROOT / "rfc" / "results" / "durations.json"
# "`pytest tests/conformance` 9 min": a command in backticks and the minutes a recorded run of it took
DURATION_RE = re.compile(r"`(pytest[^`]*)`\s+(?:takes\s+)?(?:about\s+)?(\d+)\s+min\b")


def stated_durations(text: str) -> dict[str, int]:
    return {command: int(minutes) for command, minutes in DURATION_RE.findall(_spaced(text))}


def test_the_readmes_durations_are_the_recorded_runs():
    recorded = json.loads(DURATIONS.read_text())["runs"]
    stated = stated_durations((ROOT / "README.md").read_text(encoding="utf-8"))
    assert set(stated) == set(recorded), "the README states a duration for each recorded run, and only those"
    for command, minutes in stated.items():
        run = recorded[command]
        assert run["exit_status"] == 0, f"{command!r} was recorded from a failing run"
        assert minutes == round(run["seconds"] / 60), f"the README says {command!r} takes {minutes} min"


def test_a_typed_duration_is_read_with_its_command():
    assert stated_durations("Measured: `pytest tests/conformance` 9 min,\n`pytest` 15 min.") == {
        "pytest tests/conformance": 9, "pytest": 15}
