"""The site's plots show every series: checked from what each plot draws (the JSON beside each PNG under
``rfc/generated/``, written by ``python rfc/render.py``), never from its pixels (``rfc/rendering/plot_series.py``).

The check fails on two series of a panel with the same colour and marker, and on series drawn apart whose data
coincide; every committed plot passes it, its efficiency axes end where the judged points and the reference lines do,
and the points the targets could not judge are marked.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness_common import RATIO_TOLERANCE

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "rfc"))  # where `python rfc/render.py` finds it

from rendering.plot_series import COINCIDE_MARK, coincide, drawn_series, plot_problems, style  # noqa: E402
from rendering.plots import PLOTS  # noqa: E402

GENERATED = ROOT / "rfc" / "generated"
SIDECARS = sorted(GENERATED.glob("*.json"))


def series(label: str, colour: str, marker: str, points: list[list[float]]) -> dict:
    return {"label": label, "colour": colour, "marker": marker, "line": "-", "stands_for": [label],
            "sources": {label: points}, "points": [[*p, True] for p in points]}


def plot(*drawn: dict) -> dict:
    return {"plot": "made-up.png", "panels": [{"title": "made up", "series": list(drawn), "references": []}]}


APART = [[0.5, 0.1, 0.05, 0.15], [1.0, 0.2, 0.15, 0.25]]
NEAR_ONE = [[0.5, 0.95, 0.9, 1.0], [1.0, 0.97, 0.93, 1.01]]


def test_two_series_with_the_same_colour_and_marker_fail_the_check():
    problems = plot_problems(plot(series("upstream", "#1f77b4", "o", APART),
                                  series("callback", "#1f77b4", "o", NEAR_ONE)))
    assert problems == ["made-up.png, 'made up': 'callback' and 'upstream' share colour #1f77b4 and marker 'o'"]
    # the same colour with another marker, or another colour with the same marker, tells them apart
    assert plot_problems(plot(series("upstream", "#1f77b4", "o", APART), series("callback", "#1f77b4", "s", NEAR_ONE),
                              series("batch_processor", "#ff7f0e", "o", [[0.5, 2.0, 2.0, 2.0],
                                                                         [1.0, 3.0, 3.0, 3.0]]))) == []


def test_series_drawn_apart_whose_data_coincide_fail_the_check():
    overlapping = [[0.5, 0.12, 0.0, 0.3], [1.0, 0.22, 0.2, 0.3]]  # inside the other's intervals at both points
    for twin in (APART, overlapping):
        problems = plot_problems(plot(series("upstream", "#1f77b4", "o", APART),
                                      series("callback", "#ff7f0e", "s", twin)))
        assert len(problems) == 1 and "'upstream' and 'callback' coincide" in problems[0]
    # drawn as one line standing for both, they pass
    merged = drawn_series({"upstream": APART, "callback": overlapping}, {"upstream": "-", "callback": "-"})
    assert [s["label"] for s in merged] == [f"upstream{COINCIDE_MARK}callback"]
    assert plot_problems(plot(*merged)) == []


def test_series_coincide_only_where_every_point_overlaps():
    assert coincide(APART, APART)
    assert not coincide(APART, NEAR_ONE)
    assert not coincide(APART, [APART[0], [1.0, 0.5, 0.45, 0.55]])  # apart at one point
    assert not coincide(APART, APART[:1])  # not the same points


def test_styles_are_distinct_past_the_palettes_ten_colours():
    assert len({style(i) for i in range(90)}) == 90


def test_the_renderer_draws_coinciding_series_once_and_the_others_apart():
    sources = {"upstream": APART, "prefetcher": NEAR_ONE, "batch_processor": [[0.5, 0.11, 0.0, 0.2],
                                                                               [1.0, 0.21, 0.1, 0.3]]}
    drawn = drawn_series(sources, dict.fromkeys(sources, "-"))
    assert [s["stands_for"] for s in drawn] == [["upstream", "batch_processor"], ["prefetcher"]]
    # the line of the two: the mean of their medians, bars spanning both intervals
    assert drawn[0]["points"] == [[0.5, 0.105, 0.0, 0.2, True], [1.0, 0.205, 0.1, 0.3, True]]
    assert len({(s["colour"], s["marker"]) for s in drawn}) == 2


def test_every_committed_plot_has_a_description_beside_it():
    assert SIDECARS, "no plot descriptions under rfc/generated/: run python rfc/render.py"
    assert {p.stem for p in SIDECARS} == {p.stem for p in GENERATED.glob("*.png")}
    for path in SIDECARS:
        assert json.loads(path.read_text())["plot"] == path.with_suffix(".png").name


@pytest.mark.parametrize("path", SIDECARS, ids=lambda p: p.name)
def test_every_committed_plot_passes_the_check(path: Path):
    assert plot_problems(json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", [p for p in SIDECARS if p.name.startswith("efficiency-")], ids=lambda p: p.name)
def test_an_efficiency_axis_ends_where_the_judged_points_and_the_reference_lines_do(path: Path):
    for panel in json.loads(path.read_text())["panels"]:
        low, high = panel["y_limits"]
        judged = [p for s in panel["series"] for p in s["points"] if p[4]]
        ends = [*(p[2] for p in judged), *(p[3] for p in judged), *(r["value"] for r in panel["references"])]
        span = max(ends) - min(ends)
        assert low <= min(ends) and high >= max(ends)  # every judged interval and reference line shows
        assert min(ends) - low <= 0.1 * span and high - max(ends) <= 0.1 * span  # and the axis goes no further


def s1_row(design: str, nominal: float, measured: float) -> dict:
    return {"design": design, "role": "design", "L_over_C": nominal, "L_over_C_measured": measured,
            "efficiency": 0.9, "efficiency_interval": [0.85, 0.95]}


def test_an_s1_point_off_its_nominal_ratio_is_drawn_as_not_judged():
    off = 1.0 * (1 + 2 * RATIO_TOLERANCE)
    data = {"scenarios": {"S1": [s1_row("upstream", 0.5, 0.5), s1_row("upstream", 1.0, off)]}}
    [panel] = PLOTS["plot-efficiency"].describe(data, "machine")["panels"]
    [drawn] = panel["series"]
    assert [(point[0], point[4]) for point in drawn["points"]] == [(0.5, True), (round(off, 6), False)]


def test_the_committed_s1_plot_draws_its_points_off_their_nominal_ratio_as_not_judged():
    [panel] = json.loads(next(GENERATED.glob("efficiency-vs-ratio-*.json")).read_text())["panels"]
    results = json.loads(next((ROOT / "rfc" / "results").glob("benchmarks-*.json")).read_text())
    measured = [row for row in results["scenarios"]["S1"] if "L_over_C_measured" in row]
    off_nominal = {round(row["L_over_C_measured"], 4) for row in measured
                   if abs(row["L_over_C_measured"] / row["L_over_C"] - 1) > RATIO_TOLERANCE}
    drawn = [point for series in panel["series"] for point in series["points"]]
    assert all(not point[4] for point in drawn if round(point[0], 4) in off_nominal)
