"""The benchmark plots, the data each draws, and the data hash that decides when to redraw one.

- ``efficiency-vs-ratio``: overlap efficiency against the *measured* L/C (S1; a GPU file's S5) per design entry and
  alternative, with the S1 target.
- ``efficiency-vs-hook-work``: S6 efficiency against the measured M/C per design entry and alternative.
- ``overhead``: S3 time per batch relative to stock Lightning's regular flavour, per design, flavour and depth.
- ``memory-by-depth``: S4 peak RSS delta and peak batches in flight against the prefetch depth.

A plot is drawn from exactly what its ``points`` function returns; the page records a hash of it, so a PNG is
redrawn only when that data (or ``PLOT_VERSION``) changes.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rendering.benchmarks import l_over_c
from rendering.markdown import code, is_number, no_results, relative_link
from rendering.results import BENCHMARK_COMMAND, Inputs

# Bump when the drawing code changes, so committed PNGs count as stale and are redrawn.
PLOT_VERSION = 3


def _label(row: dict[str, Any]) -> str:
    role = row.get("role")
    return f"{row.get('design', '?')} ({role})" if role == "alternative" else str(row.get("design", "?"))


def _interval(row: dict[str, Any], y: str) -> tuple[float, float]:
    """The 95 % interval of ``row[y]`` (the value itself where the row records none)."""
    interval = row.get(f"{y}_interval")
    if isinstance(interval, list) and len(interval) == 2 and all(is_number(v) for v in interval):
        return round(float(interval[0]), 6), round(float(interval[1]), 6)
    return round(float(row[y]), 6), round(float(row[y]), 6)


def _series(rows: list[dict[str, Any]], x: Callable[[dict[str, Any]], float | None], y: str,
            roles: tuple[str, ...] = ("design", "alternative")) -> dict[str, list[tuple[float, ...]]]:
    """Per label: (x, y, interval low, interval high) points."""
    points: dict[str, list[tuple[float, ...]]] = defaultdict(list)
    for row in rows:
        if row.get("role", "design") not in roles:
            continue
        xv, yv = x(row), row.get(y)
        if xv is None or not is_number(yv):
            continue
        points[_label(row)].append((round(xv, 6), round(float(yv), 6), *_interval(row, y)))
    return {label: sorted(p) for label, p in points.items()}


def _target(data: dict[str, Any], name: str) -> float | None:
    spec = (data.get("targets") or {}).get(name) or {}
    return float(spec["threshold"]) if is_number(spec.get("threshold")) else None


# ---------------------------------------------------------------------------------------------- the plots
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
    metric = "overhead_vs_stock" if any(is_number(r.get("overhead_vs_stock")) for r in rows) else "overhead_vs_regular"
    bars = [(f"{r['design']} ({r.get('flavour')})", round(float(r[metric]), 6), *_interval(r, metric))
            for r in rows if is_number(r.get(metric))]
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
    return {"series": {d: sorted(p) for d, p in by_design.items()}, "baselines": baselines}


def _axes_title(ax: Any, data: dict[str, Any], what: str) -> None:
    setup = data.get("setup") or {}
    ax.set_title(f"{what}, {setup.get('machine', '?')}\ncommit {str(setup.get('git_commit', '?'))[:12]}", fontsize=8)


def _draw_efficiency(data: dict[str, Any], points: dict[str, Any], ax: Any, xlabel: str, target_label: str) -> None:
    from matplotlib.ticker import FuncFormatter

    ratios = sorted({p[0] for pts in points["series"].values() for p in pts})
    for label, pts in points["series"].items():
        style = "--" if "alternative" in label else "-"
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        # 95 % intervals as error bars (points without one have a zero-length bar)
        errors = [[max(0.0, p[1] - p[2]) for p in pts], [max(0.0, p[3] - p[1]) for p in pts]]
        ax.errorbar(xs, ys, yerr=errors, marker="o", linestyle=style, capsize=3, label=label)
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label="ideal overlap: T = T_ideal")
    ax.axhline(0.0, color="0.3", linestyle=":", linewidth=1, label="no overlap: T = T_serial")
    if points.get("target") is not None:
        ax.axhline(points["target"], color="tab:red", linestyle="-.", linewidth=1,
                   label=f"target {points['target']:g} ({target_label})")
    ax.set_xscale("log", base=2)
    if ratios:
        ax.set_xticks([r for i, r in enumerate(ratios) if i == 0 or r / ratios[i - 1] > 1.08])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("overlap efficiency\n(T_serial - T) / (T_serial - T_ideal)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)


def draw_efficiency(data: dict[str, Any], points: dict[str, Any], fig: Any) -> None:
    ax = fig.subplots()
    _draw_efficiency(data, points, ax, "L / C measured (load time per batch / step time per batch)",
                     "at L = C" if points["scenario"] == "S1" else points["scenario"])
    _axes_title(ax, data, f"{points['scenario']} efficiency per design and alternative")


def draw_hook_work(data: dict[str, Any], points: dict[str, Any], fig: Any) -> None:
    ax = fig.subplots()
    _draw_efficiency(data, points, ax, "M / C measured (hook work per batch / step time per batch)", "every point")
    _axes_title(ax, data, "S6 efficiency per design and alternative, loading in workers")


def draw_overhead(data: dict[str, Any], points: dict[str, Any], fig: Any) -> None:
    ax = fig.subplots()
    labels, values = [b[0] for b in points["bars"]], [b[1] for b in points["bars"]]
    errors = [[max(0.0, b[1] - b[2]) for b in points["bars"]], [max(0.0, b[3] - b[1]) for b in points["bars"]]]
    ax.barh(range(len(values)), values, xerr=errors, capsize=2,
            color=["tab:blue" if "dataloader_iter" in lb else "tab:gray" for lb in labels])
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.invert_yaxis()
    same_flavour = points["metric"] == "overhead_vs_stock"
    ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1,
               label="stock Lightning, same flavour" if same_flavour else "stock regular flavour")
    for flavour, target in (points.get("targets") or {}).items():
        if target is not None:
            ax.axvline(target, color="tab:red" if flavour == "dataloader_iter" else "tab:orange", linestyle="-.",
                       linewidth=1, label=f"target {target:g} ({flavour} flavour)")
    ax.set_xlabel("time per batch / stock Lightning's " + ("same flavour" if same_flavour else "regular flavour")
                  + " (tiny model; bars: 95 % intervals)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    _axes_title(ax, data, "S3 overhead per design, flavour and depth")


def draw_memory(data: dict[str, Any], points: dict[str, Any], fig: Any) -> None:
    rss, flight = fig.subplots(1, 2)
    for design, pts in points["series"].items():
        depths = [p[0] for p in pts]
        rss.plot(depths, [p[1] for p in pts], marker="o", label=design)
        flight.plot(depths, [p[2] for p in pts], marker="o", label=design)
    every = sorted({p[0] for pts in points["series"].values() for p in pts})
    flight.plot(every, [d + 1 for d in every], color="tab:red", linestyle="-.", linewidth=1, label="limit: depth + 1")
    for (name, value), style in zip(points["baselines"].items(), (":", "--", "-.", (0, (1, 4))), strict=False):
        rss.axhline(value, linestyle=style, linewidth=1, color="0.4", label=name)
    for ax, ylabel in ((rss, "peak RSS above the epoch start (MB)"), (flight, "peak batches in flight")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(every, [f"{d:g}" for d in every])
        ax.set_xlabel("prefetch depth")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _axes_title(rss, data, "S4 memory by depth")


@dataclass(frozen=True)
class Plot:
    stem: str
    alt: str
    points: Callable[[dict[str, Any]], dict[str, Any]]
    draw: Callable[[dict[str, Any], dict[str, Any], Any], None]
    size: tuple[float, float] = (8, 5.2)

    def file(self, kind: str) -> str:
        return f"{self.stem}-{kind}.png"

    def hash(self, data: dict[str, Any]) -> str:
        setup = data.get("setup") or {}
        payload = {"version": PLOT_VERSION, "points": self.points(data),
                   "title": [setup.get("machine"), setup.get("git_commit")]}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

    def render(self, data: dict[str, Any], path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=self.size, dpi=110)
        self.draw(data, self.points(data), fig)
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
            out.append(f"![{self.alt} ({kind})]({relative_link(inputs.out_dir / name, page_dir)})\n"
                       f"<!-- plot {name} data-sha256={self.hash(data)} -->")
        return "\n\n".join(out)


PLOTS = {
    "plot-efficiency": Plot("efficiency-vs-ratio", "Overlap efficiency against the measured L/C per design and "
                            "alternative", _efficiency_points, draw_efficiency),
    "plot-hook-work": Plot("efficiency-vs-hook-work", "S6 overlap efficiency against the measured M/C per design "
                           "and alternative", _hook_work_points, draw_hook_work),
    "plot-overhead": Plot("overhead", "S3 time per batch relative to stock Lightning's regular flavour per design, "
                          "flavour and depth", _overhead_points, draw_overhead, size=(8, 6.5)),
    "plot-memory": Plot("memory-by-depth", "S4 peak RSS and peak batches in flight against the prefetch depth",
                        _memory_points, draw_memory, size=(10, 4.5)),
}


def plot_block(name: str) -> Callable[[Inputs, Path], str]:
    plot = PLOTS[name]

    def block(inputs: Inputs, page_dir: Path) -> str:
        return plot.block(inputs, page_dir)

    block.__doc__ = f"The plot of {plot.alt[0].lower() + plot.alt[1:]}, one per machine kind (PNG under generated/)."
    return block
