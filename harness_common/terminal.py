"""What the terminal shows at the end of a run: lines of marked-up text fitted to a width, and the conformance matrix.

A line is a list of ``(text, markup)`` segments; ``markup`` holds the terminal writer's keywords (``red=True``,
``bold=True``), so colour follows pytest's own rules (``--color``, ``NO_COLOR``, ``PY_COLORS``) and the plain text
is what a test measures. The benchmarks' verdict summary (``benchmarks/summary.py``) is written with the same parts.
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

Segment = tuple[str, dict[str, bool]]
Line = list[Segment]

MAX_WIDTH = 100  # the widest the end of a run gets, whatever the terminal's width
GAP = "  "  # between table columns
FAILED = dict(red=True, bold=True)


def width_for(terminalreporter) -> int:
    """The terminal's width (pytest's, which honours ``COLUMNS``), at most ``MAX_WIDTH``."""
    return min(MAX_WIDTH, terminalreporter._tw.fullwidth)


def plain(line: Line) -> str:
    return "".join(text for text, _ in line)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``...`` where something was cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 3, 0)] + "..."[: width]


def wrapped(text: str, width: int, indent: str = "", first: str = "", **markup: bool) -> list[Line]:
    """``text`` wrapped to ``width``: the first line starts with ``first``, the others with ``indent``."""
    lines = textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False)
    return [[(line, dict(markup))] for line in lines or [first]]


def write_lines(terminalreporter, title: str, lines: Iterable[Line], width: int) -> None:
    """A section headed ``title`` (a separator line ``width`` wide), then ``lines`` with their markup."""
    terminalreporter.ensure_newline()
    terminalreporter.write_sep("=", title, fullwidth=width)
    for line in lines:
        for text, markup in line:
            terminalreporter.write(text, **markup)
        terminalreporter.line("")


# ------------------------------------------------------------------------------------------------ the matrix
def _options(design: str, variant: str) -> str:
    """``depth=0`` of ``prefetcher[depth=0]``; empty for the design itself."""
    if variant.startswith(design + "[") and variant.endswith("]"):
        return variant[len(design) + 1 : -1]
    return "" if variant == design else variant


def _cell(counts: Counter) -> Segment:
    """``passed``, then ``x<n>`` expected failures, ``F<n>`` failed, ``s<n>`` skipped; ``-`` when none ran."""
    if not counts:
        return "-", {}
    parts = [str(counts["passed"])]
    parts += [f"{mark}{counts[kind]}" for kind, mark in (("xfailed", "x"), ("failed", "F"), ("skipped", "s"))
              if counts[kind]]
    return " ".join(parts), FAILED if counts["failed"] else {}


def _bucket(outcome: str) -> str:
    """passed, xfailed or skipped as they are; failed, error and xpassed (a strict xfail that passed) are failed."""
    return outcome if outcome in ("passed", "xfailed", "skipped") else "failed"


def _broken(name: str, width: int) -> list[str]:
    """``name`` in lines of at most ``width`` characters, broken after ``_``, ``.`` or ``-`` where it can be."""
    lines = [""]
    for piece in re.findall(r"[^_.\-]*[_.\-]|[^_.\-]+$", name):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return [chunk[i : i + width] for chunk in lines for i in range(0, len(chunk), width)]


class _Column:
    """Variants of one design whose outcomes are identical in every clause: one matrix column."""

    def __init__(self, design: str, variants: list[str], counts: dict[str, Counter]) -> None:
        self.design, self.variants, self.counts = design, variants, counts
        options = [_options(design, v) for v in variants]
        # the design's own configuration beside variants of it is its default
        self.all_options = ", ".join(o or "default" for o in options) if len(variants) > 1 else options[0]
        self.total = sum(counts.values(), Counter())

    @property
    def name(self) -> str:
        """The design, with the variants' options when the column is not the design itself."""
        return f"{self.design}[{self.all_options}]" if self.all_options else self.design

    def cells(self, clauses: list[str]) -> list[Segment]:
        return [_cell(self.counts.get(c, Counter())) for c in clauses] + [_cell(self.total)]

    @property
    def options_label(self) -> str:
        """The variants' options where they are short, else how many variants there are (the legend names them)."""
        return self.all_options if len(self.all_options) <= 16 else f"{len(self.variants)} variants"

    def width(self, clauses: list[str]) -> int:
        widest_cell = max(len(text) for text, _ in self.cells(clauses))
        return max(widest_cell, min(len(self.design), 16), len(self.options_label), 3)

    def header(self, width: int) -> list[str]:
        """The design's name, broken after ``_`` or ``.`` where it is wider than the column, then the options."""
        return [*_broken(self.design, width), *([fit(self.options_label, width)] if self.options_label else [])]


def _columns(results: Iterable[Mapping], design_order: Iterable[str]) -> list[_Column]:
    counts: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    design_of: dict[str, str] = {}
    for result in results:
        variant = result.get("variant") or result["design"]
        design_of[variant] = result["design"]
        counts[variant][result["clause"]][_bucket(result["outcome"])] += 1
    designs = list(dict.fromkeys([*(d for d in design_order if d in design_of.values()), *design_of.values()]))
    columns: list[_Column] = []
    for design in designs:
        groups: dict[tuple, list[str]] = {}
        for variant in (v for v in design_of if design_of[v] == design):
            key = tuple(sorted((clause, tuple(sorted(c.items()))) for clause, c in counts[variant].items()))
            groups.setdefault(key, []).append(variant)
        columns += [_Column(design, variants, counts[variants[0]]) for variants in groups.values()]
    return columns


def _blocks(columns: list[_Column], widths: list[int], label_min: int, width: int) -> list[list[int]]:
    """Column indices per table block: as many columns as fit beside the clause labels, the rest in the next."""
    blocks: list[list[int]] = [[]]
    used = label_min
    for index, column_width in enumerate(widths):
        if blocks[-1] and used + len(GAP) + column_width > width:
            blocks.append([])
            used = label_min
        blocks[-1].append(index)
        used += len(GAP) + column_width
    return blocks


def render_matrix(
    results: Iterable[Mapping], clauses: Mapping[str, str], summaries: Mapping[str, str], width: int
) -> list[Line]:
    """Clauses as rows, designs as columns, from results shaped like ``--results``' ``results``
    (``design``, ``variant``, ``clause``, ``outcome``); nothing when no conformance test ran (only skips, or none).

    Only the clauses and designs that ran appear. A design's variants with identical outcomes share one column.
    Columns that do not fit beside the clause titles continue in a further table below.
    """
    results = list(results)
    if all(_bucket(r["outcome"]) == "skipped" for r in results):
        return []
    columns = _columns(results, summaries)
    ran = {r["clause"] for r in results}
    clause_ids = [c for c in clauses if c in ran] + sorted(ran - set(clauses))
    lines: list[Line] = []
    name_width = min(max(len(c.design) for c in columns), 24)
    for design in dict.fromkeys(c.design for c in columns):
        summary = summaries.get(design, "")
        if len(design) > name_width:  # the summary goes below a name that does not fit beside it
            lines.append([(f"  {design}", {})])
        first = f"  {'' if len(design) > name_width else design:<{name_width}}  "
        lines += wrapped(summary, width, indent=" " * (name_width + 4), first=first)
    cells = [c.cells(clause_ids) for c in columns]  # per column: one per clause, then the total
    widths = [c.width(clause_ids) for c in columns]
    labels = {c: f"{c} {clauses.get(c, '')}".rstrip() for c in clause_ids} | {"all": "all clauses"}
    label_min = max(len(labels["all"]), *(len(c) + 8 for c in clause_ids))  # an id and the start of its title
    label_want = max(len(label) for label in labels.values())
    failed: list[str] = []
    for block in _blocks(columns, widths, label_min, width):
        label_width = max(label_min, min(label_want, width - sum(len(GAP) + widths[i] for i in block)))
        headers = [columns[i].header(widths[i]) for i in block]
        lines.append([("", {})])
        for row in range(max(map(len, headers))):
            names = [h[row] if row < len(h) else "" for h in headers]
            cells_text = "".join(GAP + name.rjust(widths[i]) for i, name in zip(block, names, strict=True))
            text = " " * label_width + cells_text
            lines.append([(text.rstrip(), dict(bold=True))])
        for position, clause in enumerate([*clause_ids, "all"]):
            line: Line = [(fit(labels[clause], label_width).ljust(label_width), {})]
            for i in block:
                text, markup = cells[i][position]
                line += [(GAP, {}), (text.rjust(widths[i]), markup)]
                if clause != "all" and columns[i].counts.get(clause, Counter())["failed"]:
                    failed.append(f"{clause} {columns[i].name}")
            lines.append(line)
    lines.append([("", {})])
    lines += wrapped("cell: tests passed, x<n> expected failures, F<n> failed (or errored, or passed unexpectedly), "
                     "s<n> skipped, - none ran", width, indent="  ")
    for column in columns:
        if len(column.variants) > 1 or column.options_label != column.all_options:
            kind = "identical outcomes, one column" if len(column.variants) > 1 else "one column"
            lines += wrapped(f"{column.design}: {column.all_options} ({kind})", width, indent="  ")
    if failed:
        lines += wrapped("failed: " + ", ".join(failed), width, indent="  ", **FAILED)
    return lines


def write_matrix(
    terminalreporter, results: list[Mapping], clauses: Mapping[str, str], summaries: Mapping[str, str]
) -> None:
    """The matrix at the end of a run; nothing when no conformance test ran."""
    width = width_for(terminalreporter)
    lines = render_matrix(results, clauses, summaries, width)
    if lines:
        write_lines(terminalreporter, "conformance matrix: tests per clause and design", lines, width)

