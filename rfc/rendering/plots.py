"""The benchmark plots, the data each draws, and the data hash that decides when to redraw one.

- ``efficiency-vs-ratio``: overlap efficiency against the *measured* L/C (S1; a GPU file's S5) per design entry and
  alternative, with the S1 target.
- ``efficiency-vs-hook-work``: S6 efficiency against the measured M/C per design entry and alternative.
- ``overhead``: S3 time per batch relative to stock Lightning's regular flavour, per design, flavour and depth.
- ``memory-by-depth``: S4 peak RSS delta and peak batches in flight against the prefetch depth.

A plot is drawn from exactly what its ``points`` function returns; the page records a hash of it, so a PNG is
redrawn only when that data (or ``PLOT_VERSION``) changes. Between the two stands the plot's description
(``rendering.plot_series``): every series and reference line as drawn, written beside the PNG as ``<plot>.json`` and
checked there. Series come in the registry's order of designs (then the alternatives, in the results file's order),
which also gives each its colour and marker. An efficiency plot's y-axis spans the judged points and the reference
lines; a point the targets could not judge (no 95 % interval, or its measured ratio off the nominal one) is drawn
hollow, and beyond the axis it is named at the axis's edge with its value.
"""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness_common import RATIO_TOLERANCE
from rendering.benchmarks import l_over_c
from rendering.markdown import code, is_number, no_results, relative_link
from rendering.plot_series import COINCIDE_MARK, COINCIDE_RULE, drawn_series, sidecar_json, style
from rendering.registry_order import registry_key
from rendering.results import BENCHMARK_COMMAND, Inputs
from rendering.targets import point_judged

# Bump when the drawing code changes, so committed PNGs count as stale and are redrawn.
PLOT_VERSION = 4

REFERENCE_COLOUR = "#333333"  # ideal, no overlap, targets and limits: dark grey, apart from every series' colour
FLAVOUR_COLOURS = {"dataloader_iter": "#1f77b4", "regular": "#7f7f7f"}  # the overhead plot's bars
NOT_JUDGED = (f"not judged (no 95 % interval, or the measured ratio is off the nominal one by more than "
              f"{RATIO_TOLERANCE * 100:.0f} %)")
BEYOND_AXIS = "↑ value: a point not judged, beyond the axis"
COINCIDING = (f"a{COINCIDE_MARK}b: series that coincide ({COINCIDE_RULE}), drawn as one line: the mean of their "
              "medians, bars spanning their intervals")
LEGEND_WIDTH = 44  # characters per legend line: a label naming several series wraps


def _interval(row: dict[str, Any], y: str) -> tuple[float, float]:
    """The 95 % interval of ``row[y]`` (the value itself where the row records none)."""
    interval = row.get(f"{y}_interval")
    if isinstance(interval, list) and len(interval) == 2 and all(is_number(v) for v in interval):
        return round(float(interval[0]), 6), round(float(interval[1]), 6)
    return round(float(row[y]), 6), round(float(row[y]), 6)


def _series(rows: list[dict[str, Any]], x: Callable[[dict[str, Any]], float | None],
            y: str) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """Per design entry and alternative: (x, y, interval low, interval high, judged) points; the designs in the
    registry's order, then the alternatives in the rows' order."""
    points: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    alternatives = []
    for row in rows:
        role = row.get("role", "design")
        xv, yv = x(row), row.get(y)
        if role not in ("design", "alternative") or xv is None or not is_number(yv):
            continue
        label = str(row.get("design", "?"))
        if role == "alternative" and label not in alternatives:
            alternatives.append(label)
        points[label].append((round(xv, 6), round(float(yv), 6), *_interval(row, y), point_judged(row, y)))
    designs = sorted((label for label in points if label not in alternatives), key=registry_key)
    return [(label, sorted(points[label])) for label in [*designs, *alternatives]]


def _target(data: dict[str, Any], name: str) -> float | None:
    spec = (data.get("targets") or {}).get(name) or {}
    return float(spec["threshold"]) if is_number(spec.get("threshold")) else None


def _title(data: dict[str, Any], what: str) -> str:
    setup = data.get("setup") or {}
    return f"{what}, {setup.get('machine', '?')}\ncommit {str(setup.get('git_commit', '?'))[:12]}"


# ---------------------------------------------------------------------------------------------- the data
def _efficiency_points(data: dict[str, Any]) -> dict[str, Any]:
    scenario = next((s for s in ("S1", "S5") if data["scenarios"].get(s)), "S1")
    series = _series(data["scenarios"].get(scenario) or [], l_over_c, "efficiency")
    return {"scenario": scenario, "series": series, "target": _target(data, scenario)} if series else {}


def _hook_work_points(data: dict[str, Any]) -> dict[str, Any]:
    rows = data["scenarios"].get("S6") or []

    def ratio(r: dict) -> float | None:
        return float(r["M_over_C_measured"]) if is_number(r.get("M_over_C_measured")) else None

    series = _series(rows, ratio, "efficiency")
    return {"scenario": "S6", "series": series, "target": _target(data, "S6")} if series else {}


def _overhead_points(data: dict[str, Any]) -> dict[str, Any]:
    rows = [r for r in data["scenarios"].get("S3") or [] if r.get("role") == "design"]
    rows.sort(key=lambda r: registry_key(str(r["design"])))
    metric = "overhead_vs_stock" if any(is_number(r.get("overhead_vs_stock")) for r in rows) else "overhead_vs_regular"
    bars = [(f"{r['design']} ({r.get('flavour')})", str(r.get("flavour")), round(float(r[metric]), 6),
             *_interval(r, metric), point_judged(r, metric)) for r in rows if is_number(r.get(metric))]
    targets = {f: _target(data, name) for f, name in (("dataloader_iter", "S3"), ("regular", "S3-regular"))}
    return {"bars": bars, "metric": metric, "targets": targets} if bars else {}


def _memory_points(data: dict[str, Any]) -> dict[str, Any]:
    rows = [r for r in data["scenarios"].get("S4") or [] if r.get("role") == "design" and is_number(r.get("depth"))]
    by_design: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in rows:
        if is_number(r.get("peak_rss_delta_mb")) and is_number(r.get("peak_in_flight")):
            by_design[str(r["design"]).split("[")[0]].append(
                (float(r["depth"]), round(float(r["peak_rss_delta_mb"]), 3), float(r["peak_in_flight"])))
    baselines = {str(r["design"]): round(float(r["peak_rss_delta_mb"]), 3)
                 for r in data["scenarios"].get("S4") or []
                 if r.get("role") != "design" and is_number(r.get("peak_rss_delta_mb"))}
    if not by_design:
        return {}
    return {"series": {d: sorted(p) for d, p in sorted(by_design.items(), key=lambda kv: registry_key(kv[0]))},
            "baselines": baselines}


# ---------------------------------------------------------------------------------------------- the descriptions
def _reference(label: str, line: str, value: float | None = None, colour: str = REFERENCE_COLOUR,
               points: list[list[float]] | None = None) -> dict[str, Any]:
    """A reference line: horizontal at ``value`` (vertical in a bar panel), or through ``points``."""
    return {"label": label, "colour": colour, "line": line, "value": value, "points": points}


def _efficiency_panel(points: dict[str, Any], title: str, x_label: str, target_label: str) -> dict[str, Any]:
    sources = dict(points["series"])
    series = drawn_series(sources, {name: "--" if name.startswith("alt:") else "-" for name in sources})
    references = [_reference("ideal overlap: T = T_ideal", "--", 1.0),
                  _reference("no overlap: T = T_serial", ":", 0.0)]
    if points.get("target") is not None:
        references.append(_reference(f"target {points['target']:g} ({target_label})", "-.", points["target"]))
    judged = [p for s in series for p in s["points"] if p[4]]
    low = min([*(r["value"] for r in references), *(p[2] for p in judged)])
    high = max([*(r["value"] for r in references), *(p[3] for p in judged)])
    pad = 0.05 * (high - low)
    return {"title": title, "kind": "lines", "x_label": x_label, "x_scale": "log2",
            "y_label": "overlap efficiency\n(T_serial - T) / (T_serial - T_ideal)",
            "y_limits": [round(low - pad, 6), round(high + pad, 6)], "series": series, "references": references}


def describe_efficiency(data: dict[str, Any], points: dict[str, Any]) -> list[dict[str, Any]]:
    scenario = points["scenario"]
    return [_efficiency_panel(points, _title(data, f"{scenario} efficiency per design and alternative"),
                              "L / C measured (load time per batch / step time per batch)",
                              "at L = C" if scenario == "S1" else scenario)]


def describe_hook_work(data: dict[str, Any], points: dict[str, Any]) -> list[dict[str, Any]]:
    return [_efficiency_panel(points, _title(data, "S6 efficiency per design and alternative, loading in workers"),
                              "M / C measured (hook work per batch / step time per batch)", "every point")]



def describe_overhead(data: dict[str, Any], points: dict[str, Any]) -> list[dict[str, Any]]:
    flavours = list(dict.fromkeys(bar[1] for bar in points["bars"]))
    series = [{"label": f"{flavour} flavour", "colour": FLAVOUR_COLOURS.get(flavour, style(i)[0]), "marker": "",
               "line": "", "stands_for": [bar[0] for bar in points["bars"] if bar[1] == flavour],
               "sources": {bar[0]: [[bar[0], *bar[2:]]] for bar in points["bars"] if bar[1] == flavour}}
              for i, flavour in enumerate(flavours)]
    same_flavour = points["metric"] == "overhead_vs_stock"
    references = [_reference("stock Lightning, same flavour" if same_flavour else "stock regular flavour", "--", 1.0)]
    for (flavour, target), line in zip((points.get("targets") or {}).items(), ("-.", ":"), strict=True):
        if target is not None:
            references.append(_reference(f"target {target:g} ({flavour} flavour)", line, target))
    x_label = ("time per batch / stock Lightning's " + ("same flavour" if same_flavour else "regular flavour")
               + "\n(tiny model; bars: 95 % intervals)")
    return [{"title": _title(data, "S3 overhead per design, flavour and depth"), "kind": "bars",
             "categories": [bar[0] for bar in points["bars"]], "x_label": x_label, "series": series,
             "references": references}]


def describe_memory(data: dict[str, Any], points: dict[str, Any]) -> list[dict[str, Any]]:
    depths = sorted({p[0] for pts in points["series"].values() for p in pts})
    rss = {design: [[p[0], p[1], p[1], p[1]] for p in pts] for design, pts in points["series"].items()}
    flight = {design: [[p[0], p[2], p[2], p[2]] for p in pts] for design, pts in points["series"].items()}
    baselines = [_reference(f"{name}: {value:g} MB", line, value)
                 for (name, value), line in zip(points["baselines"].items(), (":", "--", "-.", "-"), strict=False)]
    common = {"kind": "lines", "x_label": "prefetch depth", "x_scale": "category", "x_categories": depths}
    highest = max([1.0, *(p[1] for pts in rss.values() for p in pts), *(r["value"] for r in baselines)])
    return [
        {**common, "title": _title(data, "S4 peak memory by depth"),
         "y_label": "peak RSS above the epoch start (MB;\nlogarithmic above 1 MB)", "y_scale": "symlog",
         "y_limits": [0.0, round(highest * 1.5, 6)], "series": drawn_series(rss, dict.fromkeys(rss, "-")),
         "references": baselines},
        {**common, "title": "peak batches in flight", "y_label": "peak batches in flight",
         "series": drawn_series(flight, dict.fromkeys(flight, "-")),
         "references": [_reference("limit: depth + 1", "-.", points=[[d, d + 1] for d in depths])]},
    ]


# ---------------------------------------------------------------------------------------------- the drawing
def _legend(ax: Any, handles: list[Any]) -> None:
    """The legend to the right of the axes, outside the data."""
    for handle in handles:
        handle.set_label(textwrap.fill(handle.get_label(), LEGEND_WIDTH, subsequent_indent="  ",
                                       break_long_words=False, break_on_hyphens=False))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def _reference_handles(ax: Any, panel: dict[str, Any], vertical: bool = False) -> list[Any]:
    handles = []
    for ref in panel["references"]:
        if ref["points"] is not None:
            xs = [_x(panel, p[0]) for p in ref["points"]]
            handles += ax.plot(xs, [p[1] for p in ref["points"]], color=ref["colour"], linestyle=ref["line"],
                               linewidth=1, label=ref["label"])
        else:
            draw = ax.axvline if vertical else ax.axhline
            handles.append(draw(ref["value"], color=ref["colour"], linestyle=ref["line"], linewidth=1,
                                label=ref["label"]))
    return handles


def _x(panel: dict[str, Any], x: float) -> float:
    """Where ``x`` lies on the panel's x-axis: its position among the categories of a categorical axis."""
    return panel["x_categories"].index(x) if panel.get("x_scale") == "category" else x


def _draw_lines(panel: dict[str, Any], ax: Any) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter

    handles, hollow, beyond = [], False, defaultdict(list)
    limits = panel.get("y_limits")
    for s in panel["series"]:
        pts = s["points"]
        xs, ys = [_x(panel, p[0]) for p in pts], [p[1] for p in pts]
        errors = [[max(0.0, p[1] - p[2]) for p in pts], [max(0.0, p[3] - p[1]) for p in pts]]
        ax.errorbar(xs, ys, yerr=errors, color=s["colour"], linestyle=s["line"], capsize=3)
        for judged in (True, False):
            mine = [(x, p) for x, p in zip(xs, pts, strict=True) if p[4] is judged]
            if mine:
                ax.plot([x for x, _ in mine], [p[1] for _, p in mine], linestyle="none", marker=s["marker"],
                        color=s["colour"], markerfacecolor=s["colour"] if judged else "white", markersize=6)
        hollow = hollow or not all(p[4] for p in pts)
        if limits:
            for x, p in zip(xs, pts, strict=True):
                if not limits[0] <= p[1] <= limits[1]:
                    beyond[x].append((p[1], s["colour"]))
        handles.append(Line2D([], [], color=s["colour"], linestyle=s["line"], marker=s["marker"], label=s["label"]))
    handles += _reference_handles(ax, panel)
    for x, values in beyond.items():  # a point beyond the axis: its value at the edge it passes
        for i, (value, colour) in enumerate(values):
            above = value > limits[1]
            ax.annotate(f"{'↑' if above else '↓'} {value:.2f}", xy=(x, 1.0 if above else 0.0),
                        xycoords=("data", "axes fraction"), xytext=(-12, -10 * (i + 1) if above else 10 * i + 4),
                        textcoords="offset points", color=colour, fontsize=7, ha="right")
    if any(len(s["stands_for"]) > 1 for s in panel["series"]):
        handles.append(Line2D([], [], linestyle="none", label=COINCIDING))
    if hollow:
        handles.append(Line2D([], [], color="0.3", linestyle="none", marker="o", markerfacecolor="white",
                              label=f"hollow: {NOT_JUDGED}"))
    if beyond:
        handles.append(Line2D([], [], linestyle="none", label=BEYOND_AXIS))
    if panel.get("y_scale") == "symlog":
        ax.set_yscale("symlog", linthresh=1.0)
    if limits:
        ax.set_ylim(*limits)
    xs_all = sorted({p[0] for s in panel["series"] for p in s["points"]})
    if panel["x_scale"] == "log2":
        ax.set_xscale("log", base=2)
        ax.set_xticks([r for i, r in enumerate(xs_all) if i == 0 or r / xs_all[i - 1] > 1.08])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    else:
        ax.set_xticks(range(len(panel["x_categories"])), [f"{d:g}" for d in panel["x_categories"]])
    ax.set_xlabel(panel["x_label"])
    ax.set_ylabel(panel["y_label"])
    ax.grid(True, alpha=0.3)
    ax.set_title(panel["title"], fontsize=8)
    _legend(ax, handles)


def _draw_bars(panel: dict[str, Any], ax: Any) -> None:
    from matplotlib.patches import Patch

    handles = []
    for s in panel["series"]:
        bars = [p for pts in s["sources"].values() for p in pts]
        positions = [panel["categories"].index(p[0]) for p in bars]
        errors = [[max(0.0, p[1] - p[2]) for p in bars], [max(0.0, p[3] - p[1]) for p in bars]]
        ax.barh(positions, [p[1] for p in bars], xerr=errors, capsize=2, color=s["colour"],
                hatch=["//" if not p[4] else "" for p in bars], edgecolor="white")
        handles.append(Patch(color=s["colour"], label=s["label"]))
    if not all(p[4] for s in panel["series"] for pts in s["sources"].values() for p in pts):
        handles.append(Patch(facecolor="white", edgecolor="0.3", hatch="//", label=f"hatched: {NOT_JUDGED}"))
    ax.set_yticks(range(len(panel["categories"])), panel["categories"], fontsize=7)
    ax.invert_yaxis()
    handles += _reference_handles(ax, panel, vertical=True)
    ax.set_xlabel(panel["x_label"])
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(panel["title"], fontsize=8)
    _legend(ax, handles)


def draw(description: dict[str, Any], fig: Any) -> None:
    axes = fig.subplots(1, len(description["panels"]), squeeze=False)[0]
    for panel, ax in zip(description["panels"], axes, strict=True):
        (_draw_bars if panel["kind"] == "bars" else _draw_lines)(panel, ax)


@dataclass(frozen=True)
class Plot:
    stem: str
    alt: str
    points: Callable[[dict[str, Any]], dict[str, Any]]
    panels: Callable[[dict[str, Any], dict[str, Any]], list[dict[str, Any]]]
    size: tuple[float, float] = (11, 5.2)

    def file(self, kind: str) -> str:
        return f"{self.stem}-{kind}.png"

    def sidecar(self, kind: str) -> str:
        """The file beside the PNG that describes what it draws (``rendering.plot_series``)."""
        return f"{self.stem}-{kind}.json"

    def describe(self, data: dict[str, Any], kind: str) -> dict[str, Any]:
        return {"plot": self.file(kind), "panels": self.panels(data, self.points(data))}

    def sidecar_text(self, data: dict[str, Any], kind: str) -> str:
        return sidecar_json(self.describe(data, kind)) + "\n"

    def hash(self, data: dict[str, Any]) -> str:
        setup = data.get("setup") or {}
        payload = {"version": PLOT_VERSION, "points": self.points(data),
                   "title": [setup.get("machine"), setup.get("git_commit")]}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def render(self, data: dict[str, Any], kind: str, path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=self.size, dpi=110)
        draw(self.describe(data, kind), fig)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", metadata={"Software": None})
        plt.close(fig)

    def block(self, inputs: Inputs, page_dir: Path) -> str:
        if not inputs.benchmarks:
            return no_results("benchmark results", BENCHMARK_COMMAND)
        out = []
        for kind, data in inputs.benchmarks.items():
            name = self.file(kind)
            if not self.points(data):
                out.append(f"No rows for this plot in {code('benchmarks-' + kind + '.json')}.")
                continue
            sidecar = self.sidecar(kind)
            out.append(f"![{self.alt} ({kind})]({relative_link(inputs.out_dir / name, page_dir)})\n"
                       f"<!-- plot {name} data-sha256={self.hash(data)} -->\n\n"
                       f"Each series it draws, its style and the data it stands for: "
                       f"[{code(sidecar)}]({relative_link(inputs.out_dir / sidecar, page_dir)}).")
        return "\n\n".join(out)


PLOTS = {
    "plot-efficiency": Plot("efficiency-vs-ratio", "Overlap efficiency against the measured L/C per design and "
                            "alternative", _efficiency_points, describe_efficiency),
    "plot-hook-work": Plot("efficiency-vs-hook-work", "S6 overlap efficiency against the measured M/C per design "
                           "and alternative", _hook_work_points, describe_hook_work),
    "plot-overhead": Plot("overhead", "S3 time per batch relative to stock Lightning's regular flavour per design, "
                          "flavour and depth", _overhead_points, describe_overhead, size=(11, 6.5)),
    "plot-memory": Plot("memory-by-depth", "S4 peak RSS and peak batches in flight against the prefetch depth",
                        _memory_points, describe_memory, size=(13, 4.8)),
}


def plot_block(name: str) -> Callable[[Inputs, Path], str]:
    plot = PLOTS[name]

    def block(inputs: Inputs, page_dir: Path) -> str:
        return plot.block(inputs, page_dir)

    block.__doc__ = f"The plot of {plot.alt[0].lower() + plot.alt[1:]}, one per machine kind (PNG under generated/)."
    return block
