"""The plot of overlap efficiency against L/C per design, and the data hash that decides when to redraw it."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from rendering.benchmarks import is_baseline, is_number, l_over_c
from rendering.markdown import bench_setup, code, no_results, relative_link
from rendering.results import BENCHMARK_COMMAND, Inputs

PLOT_STEM = "efficiency-vs-ratio"
# Bump when the plot's drawing code changes, so committed PNGs count as stale and are redrawn.
PLOT_VERSION = 1

PLOT_SCENARIOS = ("S1", "S5")  # the first one a results file has rows for is plotted (S5: a GPU file)


def plot_scenario(data: dict[str, Any]) -> str:
    scenarios = data["scenarios"]
    return next((s for s in PLOT_SCENARIOS if scenarios.get(s)), PLOT_SCENARIOS[0])


def plot_points(data: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Design rows as design -> sorted [(L/C, efficiency)]: exactly what the plot draws (and its hash covers)."""
    points: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in data["scenarios"].get(plot_scenario(data)) or []:
        if is_baseline(row):
            continue
        ratio, eff = l_over_c(row), row.get("efficiency")
        if ratio is None or not is_number(eff):
            continue
        points[str(row.get("design", "?"))].append((round(ratio, 6), round(float(eff), 6)))
    return {d: sorted(p) for d, p in points.items()}


def _plot_target(data: dict[str, Any]) -> tuple[float, str] | None:
    spec = (data.get("targets") or {}).get(plot_scenario(data))
    if spec and spec.get("metric") == "efficiency" and is_number(spec.get("threshold")):
        return float(spec["threshold"]), str(spec.get("what") or "S1 target")
    return None


def plot_hash(data: dict[str, Any]) -> str:
    setup = data.get("setup") or {}
    payload = {
        "version": PLOT_VERSION,
        "points": plot_points(data),
        "target": _plot_target(data),
        "title": [plot_scenario(data), setup.get("machine"), setup.get("git_commit")],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def plot_file(kind: str) -> str:
    return f"{PLOT_STEM}-{kind}.png"


def draw_plot(data: dict[str, Any], kind: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    points = plot_points(data)
    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=110)
    ratios = sorted({r for p in points.values() for r, _ in p})
    for design, pts in points.items():
        ax.plot([r for r, _ in pts], [e for _, e in pts], marker="o", label=design)
    ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label="ideal overlap: T = max(L, C)")
    ax.axhline(0.0, color="0.3", linestyle=":", linewidth=1, label="no overlap: T = L + C")
    target = _plot_target(data)
    if target is not None:
        ax.axhline(target[0], color="tab:red", linestyle="-.", linewidth=1, label=f"target {target[0]:g}: {target[1]}")
    ax.set_xscale("log", base=2)
    if ratios:
        ax.set_xticks(ratios)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda x, _: ""))
    ax.set_xlabel("L / C  (load time per batch / compute time per batch)")
    ax.set_ylabel("overlap efficiency\n(T_serial - T) / (T_serial - T_ideal)")
    setup = data.get("setup") or {}
    ax.set_title(
        f"{plot_scenario(data)} efficiency per design, {setup.get('machine', kind)}\ncommit {str(setup.get('git_commit', '?'))[:12]}",
        fontsize=8,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)


def block_plot_efficiency(inputs: Inputs, page_dir: Path) -> str:
    """The plot of S1 efficiency against L/C per design, one per machine kind (PNG under generated/)."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = []
    for kind, data in inputs.benchmarks.items():
        name = plot_file(kind)
        if not plot_points(data):
            out.append(f"No S1 or S5 design rows with L/C and efficiency in {code('benchmarks-' + kind + '.json')}: "
                       "no plot.")
            continue
        out.append(
            bench_setup(data, kind)
            + "\n\n"
            + f"![{plot_scenario(data)} overlap efficiency against L/C per design ({kind})]({relative_link(inputs.out_dir / name, page_dir)})\n"
            + f"<!-- plot {name} data-sha256={plot_hash(data)} -->"
        )
    return "\n\n".join(out)
