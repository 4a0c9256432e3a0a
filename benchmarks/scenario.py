"""The scaffold of the overlap scenarios (S1, S6), written once: each states only what differs.

Per point, every entry (baselines, alternatives, designs) runs once per round, interleaved (``measuring.Interleaved``);
each test then hands its entry's rounds to pytest-benchmark and records its row: a baseline its time per batch, an
alternative and a design their figures against the point's serial, load-only and step-only baselines
(``overlap.Overlap``), a design also against the point's alternatives and its other depths. Before the rounds, the
point's two knobs (the step's matmuls and the other side's sleep or work) are calibrated and then settled under the
load of the moment (``calibration.settle``). A scenario module states its points, its entries, how one run goes and
what its rows add (``OverlapScenario``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from benchmarks import calibration, entries, overlap
from benchmarks.conftest import FEATURES, ROWS
from benchmarks.measuring import Interleaved, Probe, rounded
from prototypes.common import Design

Knobs = tuple[calibration.Knob, calibration.Knob]


@dataclass(frozen=True)
class OverlapScenario:
    """What an overlap scenario declares: its name, its points (point -> the two nominal times as multiples of the
    scenario's base time: the other side's, then C), its baselines and alternatives (each with its flavour; an
    alternative without one runs the ``dataloader_iter`` flavour), its design entries (``entries.design_entries``),
    its serial baseline, and design rows it shows without judging them (``shown``: S1's designs over workers)."""

    name: str
    points: Mapping[str, tuple[float, float]]
    baselines: tuple[str, ...]
    alternatives: tuple[str, ...]
    flavours: Mapping[str, str]
    designs: Mapping[str, Design]
    serial: str = overlap.SERIAL
    shown: Mapping[str, Design] = field(default_factory=dict)

    @property
    def every(self) -> tuple[str, ...]:
        """Every entry of a point, in the order the first round runs them."""
        return (*self.baselines, *self.alternatives, *self.designs, *self.shown)

    @property
    def cases(self) -> list[tuple[str, str]]:
        """(point, entry) for each test."""
        return [(point, entry) for point in self.points for entry in self.every]

    def targets(self, point: str, base_ms: float) -> tuple[float, float]:
        """The point's two nominal times in milliseconds: the other side's, then C."""
        other, step = self.points[point]
        return other * base_ms, step * base_ms

    def settled(self, bench: Any, point: str, first: calibration.Knob, c_ms: float,
                pilot: Callable[[calibration.Knob, calibration.Knob], tuple[float, float]]) -> Knobs:
        """The point's two knobs, ``first`` and the step's matmuls (calibrated here so that the step-only run
        measures ``c_ms``), settled by ``pilot`` rounds under the load of the moment; each computed once per
        session."""
        step_only_ms = partial(calibration.step_only_ms, bench.burner, bench.root, ROWS, FEATURES,
                               bench.sizes.calibration_batches)
        step = bench.calibrated(f"{self.name} C={c_ms:g}", lambda: calibration.calibrate_step(
            step_only_ms, c_ms, bench.burner.ms_per_matmul))
        settled = bench.calibrated(f"{self.name} {point}", lambda: calibration.settle(
            pilot, first, calibration.Knob(step.value, c_ms, step.overhead_ms, integer=True),
            bench.sizes.recalibrations))
        return settled.first, settled.second

    def measured(self, bench: Any, point: str, once: Callable[[str, str], Probe]) -> Interleaved:
        """The point's rounds (measured by its first test): ``once(point, entry)`` runs one epoch of an entry."""
        runs = {entry: partial(once, point, entry) for entry in self.every}
        return bench.interleaved((self.name, point), runs, bench.sizes.rounds, bench.sizes.warmup)

    def record(self, bench: Any, benchmark: Any, data: Interleaved, entry: str, common: dict[str, Any],
               added: Callable[[overlap.Overlap], dict[str, Any]] = lambda _: {}) -> overlap.Overlap | None:
        """Hand ``entry``'s rounds to pytest-benchmark and record its row: ``common`` (the point's parameters),
        then its figures (``added`` puts the scenario's own after the overlap figures). Returns the overlap figures
        (None for a baseline)."""
        measurement = bench.reported(benchmark, data, entry)
        if entry in self.baselines:
            bench.record(benchmark, self.name, dict(
                design=entry, role="baseline", flavour=self.flavours[entry], **common,
                time_per_batch_ms=rounded(measurement.median_ms), rounds=measurement.rounds))
            return None
        figures = overlap.overlap(data, entry, serial=self.serial)
        if entry in self.alternatives:
            row = dict(design=entry, role="alternative", flavour=self.flavours.get(entry, "dataloader_iter"), **common,
                       **figures.row(), **added(figures), rounds=measurement.rounds)
        else:
            design = self.designs.get(entry) or self.shown[entry]
            about = entries.design_fields(design) if entry in self.designs else dict(
                design=entry, role="design", depth=entries.depth_of(design), configuration=None, default=False)
            row = dict(**about, flavour="dataloader_iter", off_main_thread=entries.off_main_share(measurement.probes),
                       **common, **figures.row(), **added(figures),
                       **overlap.versus_alternatives(data, entry, self.alternatives),
                       **entries.versus_fixed_depths(data, entry, design, dict(self.designs)),
                       rounds=measurement.rounds)
        bench.record(benchmark, self.name, row)
        return figures
