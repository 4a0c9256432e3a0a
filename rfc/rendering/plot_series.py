"""What a plot draws, as data, and the check that every series in it can be seen.

A plot's description (the JSON sidecar beside its PNG, ``<plot>.json``) lists per panel each drawn series (its label,
colour, marker and line, the source series it stands for and their points) and each reference line (label, colour,
line). The drawing code draws from the description, so the sidecar is what the PNG shows. Two rules keep every
series visible, and ``plot_problems`` fails a description that breaks either:

- **A style per series**: each drawn series has its own (colour, marker) pair, given in turn in the registry's
  order of designs (``style``); past the palette's ten colours the markers still tell series apart.
- **Series that coincide are drawn once**: two series coincide when they have the same points and, at each, their
  95 % intervals overlap (identical data coincide too): the measurements cannot tell them apart, and drawn apart
  they would lie on top of each other. They are drawn as one line whose label names them all (``a ≈ b``): at each
  point the mean of their medians, and an error bar spanning their intervals.

A point is ``[x, median, interval low, interval high]`` (x a number, or a bar's category; a point without an
interval has a zero-width one) and, where the plot marks it, whether the targets could judge it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import combinations
from typing import Any

Point = Sequence[Any]
# matplotlib's ten-colour palette ("tab10"), and nine markers: 9 and 10 share no factor, so the first 90 series
# each get a pair of their own
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">")
COINCIDE_RULE = "same points, and at each their 95 % intervals overlap"
COINCIDE_MARK = " ≈ "  # between the names of the series one line stands for


def style(index: int) -> tuple[str, str]:
    """The (colour, marker) of the ``index``-th series drawn in a panel."""
    return PALETTE[index % len(PALETTE)], MARKERS[index % len(MARKERS)]


def coincide(a: Sequence[Point], b: Sequence[Point]) -> bool:
    """Whether two series' data cannot be told apart: ``COINCIDE_RULE``."""
    if [p[0] for p in a] != [p[0] for p in b]:
        return False
    return all(pa[2] <= pb[3] and pb[2] <= pa[3] for pa, pb in zip(a, b, strict=True))


def coinciding_groups(series: dict[str, Sequence[Point]]) -> list[list[str]]:
    """The series in groups that coincide, directly or through another member (so no series of one group coincides
    with one of another); groups and their members in the order of ``series``."""
    group_of = {name: i for i, name in enumerate(series)}
    for a, b in combinations(series, 2):
        if group_of[a] != group_of[b] and coincide(series[a], series[b]):
            merged, into = group_of[b], group_of[a]
            group_of = {name: into if group == merged else group for name, group in group_of.items()}
    groups: dict[int, list[str]] = {}
    for name in series:
        groups.setdefault(group_of[name], []).append(name)
    return list(groups.values())


def _drawn_points(members: list[Sequence[Point]]) -> list[list[Any]]:
    """The points of one line standing for ``members`` (series that coincide): at each x, the mean of their medians,
    the span of their intervals, and judged where every member's point is."""
    return [[column[0][0], round(sum(p[1] for p in column) / len(column), 6), min(p[2] for p in column),
             max(p[3] for p in column), all(p[4] if len(p) > 4 else True for p in column)]
            for column in zip(*members, strict=True)]


def drawn_series(series: dict[str, Sequence[Point]], line_of: dict[str, str]) -> list[dict[str, Any]]:
    """The series to draw for source ``series`` (in the registry's order): one per group that coincides, labelled
    with every member, styled in turn (``style``); ``line_of`` gives each source's line style (its first member's
    for a group)."""
    drawn = []
    for i, group in enumerate(coinciding_groups(series)):
        colour, marker = style(i)
        drawn.append({"label": COINCIDE_MARK.join(group), "colour": colour, "marker": marker, "line": line_of[group[0]],
                      "stands_for": group, "sources": {name: [list(p) for p in series[name]] for name in group},
                      "points": _drawn_points([series[name] for name in group])})
    return drawn


def sidecar_json(value: Any, depth: int = 0) -> str:
    """``value`` as indented JSON with each list of plain values (a point, the names a series stands for) on one
    line, so that a sidecar reads, and diffs, a point per line."""
    inner, outer = " " * (depth + 1), " " * depth
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {sidecar_json(v, depth + 1)}" for k, v in value.items()]
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [f"{inner}{sidecar_json(v, depth + 1)}" for v in value]
    else:
        return json.dumps(value, ensure_ascii=False)
    brackets = "{}" if isinstance(value, dict) else "[]"
    return brackets[0] + "\n" + ",\n".join(items) + "\n" + outer + brackets[1]


def _sharing_a_style(where: str, drawn: list[dict[str, Any]], colour: str, shape: str, kind: str) -> list[str]:
    """One problem for each entry of ``drawn`` whose ``colour`` and ``shape`` an earlier entry has."""
    first_of_style: dict[tuple[str, str], str] = {}
    found = []
    for entry in drawn:
        key = (entry[colour], entry[shape])
        if key in first_of_style:
            found.append(f"{where}: {kind}{entry['label']!r} and {first_of_style[key]!r} share {colour} {key[0]} and "
                         f"{shape} {key[1]!r}")
        first_of_style.setdefault(key, entry["label"])
    return found


def plot_problems(description: dict[str, Any]) -> list[str]:
    """Why a plot hides a series: two drawn series of a panel share a colour and a marker, two reference lines a
    colour and a line, or series drawn apart coincide (``COINCIDE_RULE``). Empty when every series can be seen."""
    problems = []
    for panel in description["panels"]:
        where = f"{description['plot']}, {panel['title']!r}"
        problems += _sharing_a_style(where, panel["series"], "colour", "marker", "")
        problems += _sharing_a_style(where, panel["references"], "colour", "line", "reference lines ")
        for a, b in combinations(panel["series"], 2):
            for name_a, points_a in a["sources"].items():
                for name_b, points_b in b["sources"].items():
                    if coincide(points_a, points_b):
                        problems.append(f"{where}: {name_a!r} and {name_b!r} coincide ({COINCIDE_RULE}) but are "
                                        "drawn as separate series")
    return problems
