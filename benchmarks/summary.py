"""The end of ``pytest --benchmark-only``: each target's verdicts, within 100 columns, and where the results went.

Rendered from the results document (``results.results_document``) exactly as it is written, so the terminal and
the JSON say the same. A target's result carries ``design``, optionally ``point``, ``value``, ``interval``
([low, high] at 95 %, or none), ``verdict`` (met / missed / inconclusive / not judged, with a ``reason`` when not
judged); results without a ``verdict`` give ``met`` or ``missed`` from their ``met``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness_common.terminal import GAP, Line, fit, width_for, wrapped, write_lines

VERDICT_MARKUP = {"met": dict(green=True), "missed": dict(red=True, bold=True), "inconclusive": dict(yellow=True)}
HEADERS = ("design", "point", "value", "95 % interval", "verdict")
INDENT = "    "


def verdict(result: Mapping[str, Any]) -> str:
    return result.get("verdict") or ("met" if result.get("met") else "missed")


def number(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4f}"  # the results file rounds ratios to 4 decimals
    return str(value)


def interval(result: Mapping[str, Any]) -> str:
    bounds = result.get("interval")
    return f"[{number(bounds[0])}, {number(bounds[1])}]" if bounds else "n/a"


def _cells(result: Mapping[str, Any]) -> list[str]:
    return [result["design"], str(result.get("point") or ""), number(result.get("value")), interval(result),
            verdict(result)]


def _display_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (as the user would type it)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def render_summary(document: Mapping[str, Any], path: Path, width: int, complete: bool = True) -> list[Line]:
    """Per target: what it asks, then each design and point judged with its value, interval and verdict."""
    targets: Mapping[str, Mapping[str, Any]] = document.get("targets") or {}
    rows = [_cells(r) for target in targets.values() for r in target.get("results", [])]
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(HEADERS)]
    # the design column takes what the others leave
    widths[0] = max(12, min(widths[0], width - len(INDENT) - sum(len(GAP) + w for w in widths[1:])))

    def row_line(cells: list[str], markup: dict[str, bool]) -> Line:
        texts = [fit(cells[0], widths[0]).ljust(widths[0]), cells[1].ljust(widths[1]),
                 cells[2].rjust(widths[2]), cells[3].ljust(widths[3])]
        return [(INDENT + GAP.join(texts) + GAP, {}), (cells[4], markup)]

    header = INDENT + GAP.join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))
    lines: list[Line] = [[(header.rstrip(), dict(bold=True))]] if rows else []
    tally: Counter = Counter()
    for name, target in targets.items():
        if not target.get("results"):
            continue
        wanted = f"; wanted {target['compare']} {target['threshold']}" if target.get("compare") else ""
        lines += wrapped(f"{name}: {target.get('what', '')}{wanted}", width, indent=INDENT, bold=True)
        for result in target["results"]:
            judged = verdict(result)
            tally[judged] += 1
            lines.append(row_line(_cells(result), VERDICT_MARKUP.get(judged, {})))
            if judged == "not judged" and result.get("reason"):
                lines += wrapped(f"not judged: {result['reason']}", width, indent=INDENT * 2, first=INDENT * 2)
    order = ["met", "missed", "inconclusive", "not judged"]
    counts = ", ".join(f"{tally[v]} {v}" for v in [*order, *sorted(set(tally) - set(order))] if tally[v])
    lines.append([("", {})])
    lines.append([("verdicts: ", dict(bold=True)), (counts or "no target judged in this run", {})])
    unmeasured = [name for name, target in targets.items() if not target.get("results")]
    if unmeasured:
        lines += wrapped("no design measured in this run for: " + ", ".join(unmeasured), width, indent="  ")
    warning = (document.get("notes") or {}).get("warning")
    if warning:
        lines += wrapped(f"warning: {warning}", width, indent="  ", yellow=True)
    written = f"results written to {_display_path(path)}" + ("" if complete else " (a partial run: not every scenario)")
    lines += wrapped(written, width, indent="  ")
    lines += wrapped("pytest-benchmark's own tables: add --benchmark-tables (and --benchmark-json PATH writes its "
                     "statistics)", width, indent="  ")
    return lines


def write_summary(terminalreporter, document: Mapping[str, Any], path: Path, complete: bool) -> None:
    width = width_for(terminalreporter)
    write_lines(terminalreporter, "benchmark targets: verdicts", render_summary(document, path, width, complete), width)

