"""The code pointers of the RFC's list "What Lightning has to change", read from the ``[RFC n]`` tags in the code.

A tag is ``[RFC n]`` in a comment on the lines directly above a class or function (above its decorators), or in its
docstring: that class or function implements item n, or a part of it. Each item of the list (``rfc/index.md``)
ends with ``*Code:*`` and an inline block ``code-item-<n>``, rendered as ``module.Class.method`` (relative to
``prototypes``) for every definition tagged with n. An item whose change has no code in the prototypes (it is
documentation, or only Lightning itself can make it) says ``*No prototype code:*`` and why, instead.

Every render checks, and fails naming the item or the tag (so ``render --check`` does too):

- each item has a tag and its block, or says "no prototype code" and has no tag;
- each tag names an item of the list, and sits where a tag belongs (above a definition or in its docstring): an
  ``[RFC n]`` anywhere else in the code would read as a pointer and point nowhere;
- a ``code-item-<n>`` block sits in item n.

The code is the ``prototypes`` package next to the RFC directory (``<rfc-dir>/../prototypes``).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from rendering.markdown import code, display_path
from rendering.results import Inputs, load_json

TAG_RE = re.compile(r"\[RFC (\d+)\]")
LIST_START = "**What Lightning has to change**"
NO_CODE = "*No prototype code:*"
BLOCK_RE = re.compile(r"code-item-(\d+)")
_ITEM_RE = re.compile(r"(\d+)\. ")
_MARKER_RE = re.compile(r"<!-- BEGIN GENERATED: (code-item-(\d+)) -->")


@dataclass(frozen=True)
class Tag:
    """``[RFC item]`` on the definition ``pointer`` (``module.Class.method``), written at line ``line`` of
    ``where`` (``prototypes/<file>:<line>``)."""

    item: int
    module: str
    pointer: str
    line: int
    where: str


def code_dir(inputs: Inputs) -> Path:
    return inputs.rfc_dir.parent / "prototypes"


def read_tags(root: Path) -> tuple[list[Tag], list[str]]:
    """The tags under ``root``, and a problem for each ``[RFC n]`` that is not a tag (not above a definition or in
    its docstring)."""
    files = sorted(root.rglob("*.py")) if root.is_dir() else []
    return _read_tags(root, tuple((path, path.stat().st_mtime_ns) for path in files))


@functools.cache
def _read_tags(root: Path, files: tuple[tuple[Path, int], ...]) -> tuple[list[Tag], list[str]]:
    # Why cached on the files and their times: every code-item block reads the tags, and parsing the package for each
    # of them would make a render several seconds slower
    tags: list[Tag] = []
    misplaced: list[str] = []
    for path, _ in files:
        text = path.read_text(encoding="utf-8")
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        attached = _definition_lines(ast.parse(text), text.splitlines(), module)
        where_prefix = f"{root.name}/{path.relative_to(root).as_posix()}"
        for number, line in enumerate(text.splitlines(), start=1):
            for match in TAG_RE.finditer(line):
                where = f"{where_prefix}:{number}"
                if number in attached:
                    tags.append(Tag(int(match.group(1)), module, attached[number], number, where))
                else:
                    misplaced.append(
                        f"{where}: {match.group(0)} is not a tag: put it in a comment directly above the class or "
                        "function that implements the item, or in its docstring"
                    )
    return tags, misplaced


def _definition_lines(tree: ast.Module, lines: list[str], module: str) -> dict[int, str]:
    """``{line: "module.Class.method"}`` for the comment lines directly above each definition and its docstring."""
    attached: dict[int, str] = {}

    def visit(node: ast.AST, qualname: str) -> None:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, qualname)
                continue
            name = f"{qualname}.{child.name}" if qualname else child.name
            pointer = f"{module}.{name}"
            line = min([child.lineno, *(decorator.lineno for decorator in child.decorator_list)]) - 1
            while line >= 1 and lines[line - 1].lstrip().startswith("#"):
                attached[line] = pointer
                line -= 1
            if ast.get_docstring(child) is not None:
                docstring = child.body[0]
                lines_of_docstring = range(docstring.lineno, (docstring.end_lineno or docstring.lineno) + 1)
                attached.update(dict.fromkeys(lines_of_docstring, pointer))
            visit(child, name)

    visit(tree, "")
    return attached


def list_items(text: str) -> dict[int, str] | None:
    """The items of the list that follows ``LIST_START`` in a page, by number (None when the page has no list)."""
    start = text.find(LIST_START)
    if start < 0:
        return None
    items: dict[int, list[str]] = {}
    current: list[str] | None = None
    for line in text[start:].splitlines()[1:]:
        match = _ITEM_RE.match(line)
        if match:
            current = items.setdefault(int(match.group(1)), [])
            current.append(line)
        elif current is not None:
            if line.strip() and not line[0].isspace():
                break  # the first paragraph after the list
            current.append(line)
    return {number: "\n".join(lines) for number, lines in items.items()}


def check(inputs: Inputs, pages: dict[Path, str]) -> list[str]:
    """Every way the list and the tags disagree, each naming the item or the tag and the fix; empty when they
    agree."""
    tags, problems = read_tags(code_dir(inputs))
    lists = {path: items for path, text in pages.items() if (items := list_items(text)) is not None}
    for path, text in pages.items():
        items_here = lists.get(path) or {}
        in_items = 0
        for number, item in items_here.items():
            for name, of in _MARKER_RE.findall(item):
                in_items += 1
                if int(of) != number:
                    problems.append(
                        f"{display_path(path)}: item {number} holds block {name}, which belongs in item {of}"
                    )
        if len(_MARKER_RE.findall(text)) > in_items:
            problems.append(
                f"{display_path(path)}: a code-item block outside the list's items; each belongs in its item"
            )
    if len(lists) > 1:
        problems.append(f"the list {LIST_START} is on more than one page: {', '.join(map(display_path, lists))}")
    if not lists:
        if tags:
            problems.append(f"no RFC page holds the list {LIST_START}, yet the code has {len(tags)} [RFC n] tags")
        return problems
    page, items = next(iter(lists.items()))
    where = display_path(page)
    by_item: dict[int, list[Tag]] = {}
    for tag in tags:
        by_item.setdefault(tag.item, []).append(tag)
        if tag.item not in items:
            problems.append(
                f"{tag.where}: [RFC {tag.item}] on `{tag.pointer}` names no item of the list in {where} "
                f"(items {min(items)}-{max(items)}): fix the number or remove the tag"
            )
    for number, text in items.items():
        tagged, no_code = by_item.get(number, []), NO_CODE in text
        block = f"<!-- BEGIN GENERATED: code-item-{number} -->"
        if no_code and tagged:
            problems.append(
                f"{where}: item {number} says {NO_CODE!r}, but {tagged[0].where} tags `{tagged[0].pointer}` with "
                f"[RFC {number}]: remove the tag, or replace the note with the item's code pointers"
            )
        elif not no_code and not tagged:
            problems.append(
                f"{where}: item {number} has no [RFC {number}] tag in the code: tag the class or function that "
                f"implements it (a comment `# [RFC {number}]` on the line above it), or say '{NO_CODE} <why>' in the "
                "item"
            )
        elif tagged and block not in text:
            problems.append(
                f"{where}: item {number} does not show its code: end it with `*Code:* {block}"
                f"<!-- END GENERATED: code-item-{number} -->`"
            )
    return problems


def no_code_of_its_own(item: dict) -> str:
    """What the patch of an item made elsewhere holds: its CHANGELOG entry, or nothing."""
    return "no code of its own (its CHANGELOG entry)" if item["files"] else "no edits of its own"


def block_code_item(number: int):
    """The block ``code-item-<n>``: where the stack makes item n, then how many prototype definitions are tagged
    ``[RFC n]`` and in which modules (``grep -rn "RFC n" prototypes`` lists them)."""

    def block(inputs: Inputs, page_dir: Path) -> str:
        tags, _ = read_tags(code_dir(inputs))
        tagged = [t for t in tags if t.item == number]
        modules = sorted({t.module.split(".")[0] for t in tagged})
        pointers = (f"in the prototypes, {len({t.pointer for t in tagged})} definitions tagged `[RFC {number}]` in "
                    + ", ".join(code(m) for m in modules) if tagged else "")
        # an item only Lightning can make (no prototype code) may still be made by the patch
        return "; ".join(part for part in (_in_the_patch(inputs, number), pointers) if part)

    return block


PATCH_SUMMARY = "patch-series.json"  # written by `python -m patch.series --summary rfc/results/patch-series.json`


def _in_the_patch(inputs: Inputs, number: int) -> str:
    """Where the patch series makes item ``number`` (the module here and the lines it adds to and removes from
    Lightning), or that the series does not make it yet; nothing without a series summary."""
    path = inputs.results_dir / PATCH_SUMMARY
    if not path.is_file():
        return ""
    summary = load_json(path)
    item = next((item for item in summary["items"] if item["number"] == number), None)
    if item is None:
        return "the stack: not in the series yet"
    if item["code"] is None:
        return f"the stack: {no_code_of_its_own(item)}, {item['part']}"
    files = (
        ", ".join(f"{code(f['path'])} +{f['added']} \u2212{f['removed']}" for f in item["files"])
        if len(item["files"]) <= 3
        else f"+{item['added']} \u2212{item['removed']} lines in {len(item['files'])} files"
    )
    part = f", so far {item['part']}" if item.get("part") else ""
    return f"the stack{part}: {code(item['code'])} ({files})"
