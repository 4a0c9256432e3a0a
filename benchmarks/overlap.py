"""Overlap figures: a design's time per batch against the serial, load-only and step-only baselines of its point
(efficiency, ``Overlap``), and against the alternatives a user has today (``versus_alternatives``).

Every figure is computed per round, from the entries of that round (``measuring.Interleaved``), then summarised as a
median with a 95 % interval (``benchmarks.intervals``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import intervals
from benchmarks.measuring import Interleaved, rounded


def efficiency(t_serial: float, t: float, t_ideal: float) -> float:
    """Overlap efficiency (T_serial - T) / (T_serial - T_ideal); NaN when the serial run was not slower than ideal."""
    return (t_serial - t) / (t_serial - t_ideal) if t_serial > t_ideal else float("nan")


SERIAL, LOAD_ONLY, STEP_ONLY, STEP_ONLY_RAW = (
    "baseline:regular", "baseline:load-only", "baseline:step-only", "baseline:step-only-raw")


@dataclass(frozen=True)
class Overlap:
    """A design's time per batch against the serial, load-only and step-only baselines of the same point.

    Times are medians over rounds (ms). T_ideal = max(L, C) with C the step-only run through stock Lightning's loop
    (what any design could at best reach); ``c_raw`` is the same step in a plain PyTorch loop, kept as the raw-loop
    figure. ``efficiencies`` holds one efficiency per round, from the entries of that round.
    """

    t: float
    t_serial: float
    l: float
    c: float
    c_raw: float | None
    efficiencies: list[float]
    efficiency_best_rounds: float  # from every entry's fastest round: noise only adds time, so the assertions use it

    @property
    def t_ideal(self) -> float:
        return max(self.l, self.c)

    @property
    def t_ideal_raw(self) -> float | None:
        return None if self.c_raw is None else max(self.l, self.c_raw)

    @property
    def efficiency(self) -> dict[str, Any]:
        """The median of the per-round efficiencies and its 95 % interval."""
        return intervals.summary(self.efficiencies)

    @property
    def efficiency_raw_ideal(self) -> float | None:
        return None if self.c_raw is None else efficiency(self.t_serial, self.t, self.t_ideal_raw)

    def row(self) -> dict[str, Any]:
        """The figures a design row records (rounded)."""
        summary = self.efficiency
        return dict(
            L_ms=rounded(self.l), C_ms=rounded(self.c), C_raw_ms=rounded(self.c_raw),
            L_over_C_measured=rounded(self.l / self.c), time_per_batch_ms=rounded(self.t),
            t_serial_ms=rounded(self.t_serial), t_ideal_ms=rounded(self.t_ideal),
            t_ideal_raw_ms=rounded(self.t_ideal_raw), efficiency=summary["value"],
            efficiency_interval=summary["interval"], efficiency_raw_ideal=rounded(self.efficiency_raw_ideal),
            efficiency_best_rounds=rounded(self.efficiency_best_rounds),
            speedup_vs_serial=rounded(self.t_serial / self.t),
        )


def overlap(data: Interleaved, name: str, serial: str = SERIAL) -> Overlap:
    """Entry ``name`` against the baselines measured in the same interleaved rounds (``data``)."""
    measurement, t_serial, load, step = (data.measurement(n) for n in (name, serial, LOAD_ONLY, STEP_ONLY))
    raw = data.measurement(STEP_ONLY_RAW).median_ms if STEP_ONLY_RAW in data.kept else None
    per_round = zip(t_serial.per_batch_s, measurement.per_batch_s, load.per_batch_s, step.per_batch_s, strict=True)
    return Overlap(
        t=measurement.median_ms,
        t_serial=t_serial.median_ms,
        l=load.median_ms,
        c=step.median_ms,
        c_raw=raw,
        efficiencies=[efficiency(ts, t, max(l, c)) for ts, t, l, c in per_round],
        efficiency_best_rounds=efficiency(t_serial.min_ms, measurement.min_ms, max(load.min_ms, step.min_ms)),
    )


def versus_alternatives(data: Interleaved, name: str, alternatives: Sequence[str]) -> dict[str, Any]:
    """Time of entry ``name`` against the fastest alternative of the point (by median), per round, with its interval,
    and against each alternative (medians); below 1 the entry is faster."""
    times = {alt: data.measurement(alt).median_ms for alt in alternatives}
    best = min(times, key=times.get)
    versus = data.ratio(name, best)
    out: dict[str, Any] = {"best_alternative": best, "vs_best_alternative": versus["value"],
                           "vs_best_alternative_interval": versus["interval"]}
    t = data.measurement(name).median_ms
    for alt, t_alt in times.items():
        out[f"vs_{alt.removeprefix('alt:').replace('-', '_')}"] = rounded(t / t_alt)
    return out
