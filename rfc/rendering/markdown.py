"""Markdown pieces every block uses: escaped table cells, code spans, tables, setup lines, number formatting."""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness_common import SETUP_HIDDEN, SETUP_LABELS

_CODE_SPAN_RE = re.compile(r"(`+)(.+?)\1")


def cell(value: Any) -> str:
    """Text safe inside a Markdown table cell: no cell breaks, no stray HTML or emphasis; `code` stays code."""
    text = str(value).replace("\n", " ").strip()
    out, last = [], 0
    for m in _CODE_SPAN_RE.finditer(text):
        out.append(_escape_prose(text[last:m.start()]))
        out.append(m.group(0))  # Python-Markdown's tables keep a pipe inside a code span in its cell
        last = m.end()
    out.append(_escape_prose(text[last:]))
    return "".join(out)


def _escape_prose(text: str) -> str:
    text = text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*").replace("_", "\\_")
    return text.replace("&", "&amp;").replace("<", "&lt;")


def code(text: str) -> str:
    text = str(text).replace("\n", " ")
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(headers: list[str], rows: Iterable[list[str]], align: list[str] | None = None) -> str:
    align = align or ["---"] * len(headers)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# A long identifier in a table cell (a test id, a path) may wrap after its separators, between its words; the site's
# CSS breaks no identifier inside a word, so a design's id stays whole and a table of test ids still fits the page.
LONG_IDENTIFIER = 24  # characters: as long as a design's id with its options, `prefetcher[depth='auto']`
_SEPARATORS_RE = re.compile(r"[:/._\-\[\]()',=]+")
_AS_ENTITY = {c: f"&#{ord(c)};" for c in "&<>\"'|*_`[]\\"}  # what Markdown or a table would read inside the HTML


def _wrappable_code(text: str) -> str:
    """``text`` as an HTML code element with a line break opportunity (``<wbr>``) after each run of separators."""
    pieces, last = [], 0
    for m in _SEPARATORS_RE.finditer(text):
        pieces.append(text[last:m.end()])
        last = m.end()
    pieces.append(text[last:])
    escaped = ["".join(_AS_ENTITY.get(c, c) for c in piece) for piece in pieces if piece]
    return "<code>" + "<wbr>".join(escaped) + "</code>"


def wrappable_tables(text: str) -> str:
    """``text`` with each long identifier in a table row's code spans made wrappable between its words."""
    def span(m: re.Match) -> str:
        body = m.group(2)
        long = any(len(word) > LONG_IDENTIFIER for word in body.split())
        return _wrappable_code(body) if m.group(1) == "`" and long else m.group(0)

    return "\n".join(_CODE_SPAN_RE.sub(span, line) if line.startswith("|") else line for line in text.split("\n"))


def slugify(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` gives a heading: ``C3 Exactly once`` -> ``c3-exactly-once``."""
    text = re.sub(r"[`*]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def no_results(what: str, command: str) -> str:
    return f"> **No {what} yet:** run `{command}`, commit the JSON, then re-render with `python rfc/render.py`."


def commit_text(setup: dict[str, Any]) -> str | None:
    commit = str(setup.get("git_commit") or "")
    if not commit:
        return None
    dirty = commit.endswith("-dirty") or setup.get("git_dirty") is True
    commit = commit.removesuffix("-dirty")
    return f"commit {code(commit[:12])}" + (" (with uncommitted changes)" if dirty else "")


# How the page notes begin: a results file's setup line and the warnings about its run (see ``once_per_page``).
SETUP_START = "*Setup ("
NOT_MEASURED_START = "> **Not a measurement:**"
RUN_WARNS_START = "> **The run warns:**"
RUN_FAILED_START = "> **The run did not pass:**"
PAGE_NOTE_STARTS = (SETUP_START, NOT_MEASURED_START, RUN_WARNS_START, RUN_FAILED_START)


def setup_line(setup: dict[str, Any], source: str, mode: str | None = None) -> str:
    """One line: machine, versions, commit, when; from a results file's ``setup``."""
    parts = []
    for key, label in SETUP_LABELS:
        if key in setup and setup[key] not in (None, ""):
            parts.append(f"{label} {code(setup[key])}" if key == "machine" else f"{label} {setup[key]}")
    known = {k for k, _ in SETUP_LABELS} | SETUP_HIDDEN
    for key in sorted(set(setup) - known):  # anything the producer adds later still shows
        if isinstance(setup[key], (str, int, float)) and not isinstance(setup[key], bool) and setup[key] != "":
            parts.append(f"{key} {setup[key]}")
    commit = commit_text(setup)
    if commit:
        parts.append(commit)
    if setup.get("generated_at"):
        parts.append(f"run {setup['generated_at']}")
    if mode:
        parts.append(f"mode {code(mode)}")
    line = f"{SETUP_START}{source}):* " + "; ".join(parts) + "."
    if mode and mode != "measure":
        line += (f"\n\n{NOT_MEASURED_START} this file comes from a `{mode}` run, not a `measure` run; re-run "
                 "the benchmarks in measure mode (see `benchmarks/README.md`) before reading figures from it.")
    return line


def conformance_setup(data: dict[str, Any]) -> str:
    """The setup line of each conformance results file the render merged (``conformance.json`` first)."""
    setups = data.get("setups") or {"conformance.json": data["setup"]}
    return "\n\n".join(setup_line(setup, source) for source, setup in setups.items())


def bench_setup(data: dict[str, Any], kind: str) -> str:
    notes = data.get("notes") or {}
    mode = notes.get("mode") if isinstance(notes.get("mode"), str) else None
    line = setup_line(data.get("setup") or {}, f"benchmarks-{kind}.json", mode)
    loads = [value for pair in (notes.get("loadavg_1min_per_point") or {}).values() if isinstance(pair, list)
             for value in pair if is_number(value)]
    if loads:  # what ran beside the benchmarks: the machine's load, this run's own threads included
        cores = (data.get("setup") or {}).get("cpu_count") or "?"
        line += (f" What ran beside it: the 1-minute load average, read before and after each point, was "
                 f"{min(loads):.1f} to {max(loads):.1f} on {cores} cores (the run's own processes and threads "
                 "included).")
    if isinstance(notes.get("warning"), str) and notes["warning"].strip():
        line += f"\n\n{RUN_WARNS_START} {cell(notes['warning'])}"
    status = notes.get("pytest_exitstatus")
    if isinstance(status, int) and not isinstance(status, bool) and status != 0:
        line += (f"\n\n{RUN_FAILED_START} pytest exited with status {status}, so at least one of the "
                 "benchmarks' own assertions failed in that run.")
    return line


def once_per_page(blocks: list[str]) -> list[str]:
    """The blocks of one page, in page order, without page notes an earlier block already shows.

    A page note is a paragraph made by ``setup_line`` or ``bench_setup`` (the setup line of a results file, or a
    warning about its run). Each block renders its own notes so that it reads on its own; on a page the first
    occurrence stays and later identical ones go, so a reader meets each setup line and each warning once.
    """
    seen: set[str] = set()
    out = []
    for block in blocks:
        kept = []
        for paragraph in block.split("\n\n"):
            if paragraph.startswith(PAGE_NOTE_STARTS):
                if paragraph in seen:
                    continue
                seen.add(paragraph)
            kept.append(paragraph)
        out.append("\n\n".join(kept))
    return out


def fmt_number(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "–"
        k = key.lower()
        if "diff" in k:
            return f"{value:.3g}"
        if k.endswith("_mb") or k.endswith("_mib"):
            return f"{value:.1f}"
        if any(w in k for w in ("efficiency", "speedup", "overhead", "ratio", "_over_")):
            return f"{value:.2f}"
        mag = abs(value)
        if mag >= 100:
            return f"{value:.0f}"
        if mag >= 10:
            return f"{value:.1f}"
        if mag >= 1:
            return f"{value:.2f}"
        return f"{value:.3f}"
    if value is None:
        return "–"
    return cell(value)


def relative_link(target: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(target, page_dir)).as_posix()


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies under it, else as given: how messages name files."""
    try:
        rel = Path(os.path.relpath(path)).as_posix()
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if rel.startswith("../") else rel


def is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
