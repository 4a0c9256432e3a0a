"""An item of the RFC's list "What Lightning has to change" quoted where a design page leans on it.

An item's first sentence is its normative sentence: what Lightning must do. A design page that names an item ("item
13", "items 1 and 9") quotes that sentence in an inline block ``quote-item-<n>``, rendered from the list, instead
of retyping what the item says: when an item changes, the pages that rely on it change with it, and a page cannot
say something else in the item's name.

Every render checks, and fails naming the page and the item: each item a design page (``rfc/designs/``) names has
its ``quote-item-<n>`` block on that page, and each such block quotes an item of the list.
"""

from __future__ import annotations

import re
from pathlib import Path

from rendering.code_pointers import LIST_START, list_items
from rendering.markdown import display_path
from rendering.results import Inputs, RenderError

BLOCK_RE = re.compile(r"quote-item-(\d+)")
_MENTION_RE = re.compile(r"\bitems? (\d+(?:(?:, | and |, and )\d+)*)")
_GENERATED_RE = re.compile(r"<!-- BEGIN GENERATED: ([\w-]+) -->.*?<!-- END GENERATED: \1 -->", re.DOTALL)
_SENTENCE_END_RE = re.compile(r"\.\s(?=[A-Z`*(])")
DESIGN_PAGES = "designs"  # the folder of the design pages, under the RFC directory


def normative_sentence(item: str) -> str:
    """The first sentence of a list item (its text without the number and the generated blocks)."""
    text = re.sub(r"^\d+\. ", "", " ".join(_GENERATED_RE.sub("", item).split()))
    end = _SENTENCE_END_RE.search(text)
    return text[: end.start() + 1] if end else text


def the_list(rfc_dir: Path) -> dict[int, str]:
    """The items of the list on the RFC's pages (the page that holds ``LIST_START``)."""
    for page in sorted(rfc_dir.glob("*.md")):
        items = list_items(page.read_text(encoding="utf-8"))
        if items is not None:
            return items
    raise RenderError(f"no page in {display_path(rfc_dir)} holds the list {LIST_START}")


def block_quote_item(number: int):
    """The block ``quote-item-<n>``: item n's normative sentence, in italics after its number."""

    def block(inputs: Inputs, page_dir: Path) -> str:
        items = the_list(inputs.rfc_dir)
        if number not in items:
            raise RenderError(f"a block quote-item-{number} quotes no item of the list {LIST_START}")
        return f"item {number}: *{normative_sentence(items[number])}*"

    return block


def mentioned_items(text: str) -> set[int]:
    """The item numbers a page names in its own prose ("item 13", "items 1 and 9"), outside generated blocks."""
    prose = _GENERATED_RE.sub("", text)
    return {int(n) for m in _MENTION_RE.finditer(prose) for n in re.findall(r"\d+", m.group(1))}


def check(inputs: Inputs, pages: dict[Path, str]) -> list[str]:
    """Every design page naming an item without quoting it, each naming the page, the item and the fix."""
    designs = (inputs.rfc_dir / DESIGN_PAGES).resolve()
    problems = []
    for path, text in pages.items():
        if path.resolve().parent != designs:
            continue
        quoted = {int(n) for n in BLOCK_RE.findall(text)}
        for number in sorted(mentioned_items(text) - quoted):
            problems.append(
                f"{display_path(path)}: names item {number} without quoting it: write "
                f"<!-- BEGIN GENERATED: quote-item-{number} --><!-- END GENERATED: quote-item-{number} --> where the "
                "page relies on it, and re-render"
            )
    return problems
