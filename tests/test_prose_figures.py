"""No measurement typed into the RFC's or the site's prose: every figure comes from ``python rfc/render.py``.

A figure with a unit (s, ms, us, min, %, GiB, MiB, x) or a count of tests, runs, batches, rounds or pairs in
``rfc/**/*.md`` or ``docs/**/*.md`` outside a generated block (and outside ``rfc/generated/``, which is generated as a
whole) fails, naming the file, the line and the figure. A number that is a definition, not a measurement, is
allowed by ``ALLOWED``, each entry with why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GENERATED_BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", re.DOTALL)
_NUMBER = r"(?<![\w.#])\d+(?:[.,]\d+)?"
FIGURE_RE = re.compile(
    rf"{_NUMBER}\s?(?:%|(?:s|ms|us|µs|min|GiB|MiB|GB|MB|x|×)(?![\w-]))"  # a number with a unit
    rf"|{_NUMBER}\s?(?:\w+\s)?(?:tests?|runs?|batch(?:es)?|rounds?|pairs?)\b"  # a count (maybe one word between)
    rf"|{_NUMBER}m{_NUMBER}s\b",  # a duration such as 15m18s
)

# (pattern the figure's line must match, why it is a definition and not a measurement)
ALLOWED: list[tuple[str, str]] = [
    (r"95 %", "the confidence level of every interval: a choice of the method, not a result"),
    (r"more than 10 %", "the tolerance of a point's measured ratio, a constant of the benchmarks "
                        "(harness_common.RATIO_TOLERANCE)"),
    (r"loader of 8 batches", "C7's worked example of the validation rule: its input, not a measurement"),
    (r"and 16 batches", "C7's worked example: the batch counts its definition gives, not a measurement"),
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
])
def test_a_typed_figure_fails(typed: str):
    assert figures(f"# A page\n\nSome prose. {typed}\n")


def test_figures_in_generated_blocks_and_definitions_pass():
    page = ("# A page\n\n<!-- BEGIN GENERATED: standing -->\n6 of 8 batches, 3.5 ms\n<!-- END GENERATED: standing -->"
            "\n\nEach figure has its 95 % interval; a step pulls batch i + 1.\n")
    assert figures(page) == []
