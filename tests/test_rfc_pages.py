"""The RFC's pages stay readable: each within its word budget, generated blocks included, no prose sentence over
``MAX_SENTENCE_WORDS`` words outside tables, code and generated blocks, and one vocabulary for what ships: each
glossary term defined once, the status words used as the glossary defines them, never a synonym."""

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


def sentences(text: str, generated: bool = False) -> list[str]:
    """The prose sentences of a page: tables, headings, code and (unless ``generated``) generated blocks left out."""
    text = FENCE_RE.sub("", text if generated else GENERATED_BLOCK_RE.sub("", text))
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


# The words that say whether a behaviour reaches a user (glossary: "Ships", "Opt-in"), and the synonyms that once let
# two pages say two things of one behaviour: each refused, with the word to use
REFUSED_STATUS_WORDS = {
    r"\bdeferred\b": "say what it is now: not in the stack (or opt-in, where a user can turn it on)",
    r"\bpostponed\b": "say what it is now: not in the stack",
    r"\b(?:on|enabled) by default\b": "write ships (glossary: Ships)",
    r"\boff by default\b": "write opt-in (glossary: Opt-in)",
}
VOCABULARY_CHECKED = (*SENTENCE_CHECKED, "docs/index.md")
# the pages of the prototypes, where the prefetch thread exists and is opt-in
PROTOTYPE_PAGES = tuple(DESIGN_PAGES)


def status_findings(text: str, prototype_page: bool = False) -> list[str]:
    """Sentences of ``text`` (generated blocks included) that use a refused status word, or, outside a prototype's
    page, call the prefetch thread opt-in without naming the prototype that has one: the stack has no thread."""
    found = []
    for sentence in sentences(text, generated=True):
        found += [f"{sentence[:120]!r}: {fix}" for pattern, fix in REFUSED_STATUS_WORDS.items()
                  if re.search(pattern, sentence, re.IGNORECASE)]
        if (not prototype_page and "opt-in" in sentence and "thread" in sentence
                and not re.search(r"prototype|prefetcher", sentence)):
            found.append(f"{sentence[:120]!r}: the stack has no thread; name the prototype whose thread is opt-in")
    return found


@pytest.mark.parametrize("page", VOCABULARY_CHECKED)
def test_what_ships_is_said_in_one_vocabulary(page: str):
    found = status_findings((ROOT / page).read_text(), prototype_page=page in PROTOTYPE_PAGES)
    assert not found, f"{page}:\n" + "\n".join(found)


def test_a_synonym_of_a_status_and_an_opt_in_thread_of_the_stack_are_found():
    assert status_findings("The thread is deferred to a later release.")
    assert status_findings("Drain calls are off by default.")
    assert status_findings("The stack's thread is opt-in.")
    assert not status_findings("The prototype's thread (`prefetcher[depth='auto']`) is opt-in. Drain calls are opt-in.")
    assert not status_findings("The opt-in thread loads ahead.", prototype_page=True)


def test_each_glossary_term_is_defined_once():
    terms = re.findall(r"^## (.+)$", (ROOT / "rfc" / "glossary.md").read_text(), re.MULTILINE)
    assert terms and len(terms) == len({term.lower() for term in terms}), f"a term defined twice: {terms}"
