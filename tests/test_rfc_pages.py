"""The RFC's pages stay readable: each within its word budget, generated blocks included, and no prose sentence
over ``MAX_SENTENCE_WORDS`` words outside tables, code and generated blocks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# words as `wc -w` counts them, generated blocks included: what a reader of the page reads
DESIGN_PAGES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "rfc" / "designs").glob("*.md"))
WORD_BUDGETS = {"rfc/index.md": 5000, "rfc/specification.md": 6000, "rfc/glossary.md": 1000,
                **dict.fromkeys(DESIGN_PAGES, 1500)}
SENTENCE_CHECKED = ("rfc/index.md", "rfc/specification.md", "rfc/c17-alternatives.md", "rfc/glossary.md", *DESIGN_PAGES)
MAX_SENTENCE_WORDS = 40
GENERATED_BLOCK_RE = re.compile(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", re.DOTALL)
FENCE_RE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
# a sentence ends at . ! or ? before a capital, a code span, a link or an emphasis; a list item or heading ends one too
SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\[])")


def sentences(text: str) -> list[str]:
    """The prose sentences of a page: tables, headings, code and generated blocks left out."""
    text = FENCE_RE.sub("", GENERATED_BLOCK_RE.sub("", text))
    paragraphs, current = [], []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("|", "#", "<!--")) or re.match(r"^(- |\d+\. )", stripped):
            if current:
                paragraphs.append(" ".join(current))
            current = [re.sub(r"^(- |\d+\. )", "", stripped)] if re.match(r"^(- |\d+\. )", stripped) else []
            continue
        current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return [s for p in paragraphs for s in SENTENCE_END_RE.split(p) if s]


@pytest.mark.parametrize("page", sorted(WORD_BUDGETS))
def test_each_page_is_within_its_word_budget(page: str):
    words = len((ROOT / page).read_text().split())
    assert words <= WORD_BUDGETS[page], f"{page}: {words} words, over its budget of {WORD_BUDGETS[page]}"


@pytest.mark.parametrize("page", SENTENCE_CHECKED)
def test_no_prose_sentence_is_over_the_limit(page: str):
    long = [s for s in sentences((ROOT / page).read_text()) if len(s.split()) > MAX_SENTENCE_WORDS]
    assert not long, f"{page}: sentences over {MAX_SENTENCE_WORDS} words:\n" + "\n".join(s[:160] for s in long)


def test_a_long_sentence_is_found_and_a_table_is_not():
    long_sentence = "Every " + " ".join(["word"] * MAX_SENTENCE_WORDS) + "."
    page = f"# Title\n\n| {long_sentence} |\n\nShort one. {long_sentence}\n\n- An item. Another.\n"
    found = [s for s in sentences(page) if len(s.split()) > MAX_SENTENCE_WORDS]
    assert found == [long_sentence]
    assert "An item." in sentences(page) and "Another." in sentences(page)
