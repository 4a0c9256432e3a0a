"""Calibration: the knobs (matmul iterations, sleep milliseconds) that make what the baselines measure land on a
point's nominal times.

``calibrate_step`` / ``calibrate_load`` set the step's work and the load's sleep once per nominal value, so that the
step-only and load-only runs measure the nominal C and L (``Calibration`` records how); ``settle`` then corrects a
point's two knobs under the load of the moment, from pilot rounds interleaved as the point's own, until their
measured ratio is nominal (``Settled`` records each pilot).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import workloads
from benchmarks.measuring import Interleaved, Probe
from harness_common import RATIO_TOLERANCE


@dataclass
class Calibration:
    """How a nominal time was hit: the knob's value and what the baseline measured before and after."""

    target_ms: float
    value: float  # matmul iterations for C, sleep milliseconds for L
    first_ms: float  # measured with the uncalibrated knob
    measured_ms: float  # measured with ``value``
    overhead_ms: float = 0.0  # C: the loop's own cost per batch (the step-only run with no work)

    def as_note(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.__dict__.items()}


CALIBRATION_TOLERANCE = 0.03  # re-measure and correct again while a correction misses by more than this
CALIBRATION_CORRECTIONS = 2  # at most this many further corrections (a burst of other work can mislead one)


def calibrate_step(step_only_ms: Callable[[int], float], target_ms: float, ms_per_iteration: float) -> Calibration:
    """Matmul iterations that make the step-only baseline (``step_only_ms(iterations)``, per batch) take ``target_ms``.

    The baseline includes Lightning's per-batch cost and runs under whatever else the machine does, so the
    burner's own calibration (one matmul on an idle core) misses C by a few milliseconds; measuring the loop with
    no work and with a first guess gives the loop's cost and the real cost per iteration.
    """
    overhead = step_only_ms(0)
    guess = max(1, round((target_ms - overhead) / ms_per_iteration))
    first = step_only_ms(guess)
    # Why a floor: a matmul never runs faster than on an idle core (``ms_per_iteration``, with slack); a measurement
    # barely above the loop's cost would otherwise ask for a thousandfold more matmuls
    floor = ms_per_iteration / 2
    per_iteration = max((first - overhead) / guess, floor)
    iterations = max(0, round((target_ms - overhead) / per_iteration))
    measured = step_only_ms(iterations)
    for _ in range(CALIBRATION_CORRECTIONS):
        if abs(measured - target_ms) <= CALIBRATION_TOLERANCE * target_ms or not iterations:
            break
        per_iteration = max((measured - overhead) / iterations, floor)
        iterations = max(0, round((target_ms - overhead) / per_iteration))
        measured = step_only_ms(iterations)
    return Calibration(target_ms, iterations, first, measured, overhead)


def calibrate_load(load_only_ms: Callable[[float], float], target_ms: float) -> Calibration:
    """The sleep that makes the load-only baseline (``load_only_ms(sleep_ms)``, per batch) take ``target_ms``:
    building the batch and the loader's own work come on top of the sleep and are taken off it."""
    first = load_only_ms(target_ms)
    sleep = max(0.0, target_ms - (first - target_ms))
    return Calibration(target_ms, sleep, first, load_only_ms(sleep))


@dataclass(frozen=True)
class Knob:
    """One input of a point set to hit a nominal time: matmul iterations (``integer``) or a sleep in ms.

    What the baseline measures is ``fixed_ms`` (the loop's own cost per batch, or building the batch) plus a part
    proportional to ``value``, so a measurement off the target corrects the value in proportion.
    """

    value: float
    target_ms: float
    fixed_ms: float
    integer: bool

    # Why bounded: a measurement hardly above the fixed cost (a burst of other work in the baseline's loop) would
    # otherwise scale the value a thousandfold, and the next run would take minutes.
    MAX_CORRECTION = 2.0

    def corrected(self, measured_ms: float) -> Knob:
        scale = (self.target_ms - self.fixed_ms) / max(measured_ms - self.fixed_ms, 1e-6)
        value = self.value * min(max(scale, 1.0 / self.MAX_CORRECTION), self.MAX_CORRECTION)
        return replace(self, value=max(0, round(value)) if self.integer else max(0.0, value))


@dataclass
class Settled:
    """A point's two knobs after the pilot rounds, and the ratio each pilot measured (``as_note`` for the notes)."""

    first: Knob
    second: Knob
    pilots: list[tuple[float, float]]  # (first side ms, second side ms) measured by each pilot

    def as_note(self) -> dict[str, Any]:
        return dict(first=round(self.first.value, 4), second=round(self.second.value, 4),
                    pilots_ms=[[round(a, 3), round(b, 3)] for a, b in self.pilots])


def settle(pilot: Callable[[Knob, Knob], tuple[float, float]], first: Knob, second: Knob, attempts: int) -> Settled:
    """Knobs whose times, measured by ``pilot`` (a few rounds interleaved as the point's own, medians), stand in
    the nominal ratio: each knob is corrected from its own measurement until the ratio is within half of
    ``harness_common.RATIO_TOLERANCE`` (the rest is left for drift during the rounds), at most ``attempts`` corrections;
    the knobs of the closest pilot are kept.

    Why in the point's own conditions: calibrated alone, before the rounds and from a fastest run, C came out
    smaller than the rounds then measured it, and most points ran 10-20 % off their nominal ratio.
    """
    nominal = first.target_ms / second.target_ms

    def miss(measured: tuple[float, float]) -> float:
        return abs((measured[0] / measured[1]) / nominal - 1.0)

    tried = [(first, second, pilot(first, second))]
    for _ in range(attempts):
        first, second, measured = tried[-1]
        if miss(measured) <= RATIO_TOLERANCE / 2:
            break
        first, second = first.corrected(measured[0]), second.corrected(measured[1])
        tried.append((first, second, pilot(first, second)))
    # the knobs whose pilot came closest (a correction measured during a burst of other work can overshoot)
    best = min(tried, key=lambda t: miss(t[2]))
    return Settled(best[0], best[1], [t[2] for t in tried])


CALIBRATION_REPEATS = 2


CALIBRATION_SKIP = 2  # batches before a calibration run's timed window (Probe.per_batch_s)


def timed_epoch(run: Callable[[Probe], None]) -> float:
    """Steady-state milliseconds per batch of ``run(probe)``: the faster of ``CALIBRATION_REPEATS`` runs, so a burst
    of other work during one calibration run does not set C for the whole session (the pilot rounds of each
    point then correct it under the load of the moment)."""
    times = []
    for _ in range(CALIBRATION_REPEATS):
        probe = Probe()
        run(probe)
        times.append(probe.per_batch_s(CALIBRATION_SKIP) * 1000.0)
    return min(times)


def pilot_medians(runs: dict[str, Callable[[], Probe]], skip: int, rounds: int) -> dict[str, float]:
    """Median steady-state milliseconds per batch of each run, over ``rounds`` interleaved rounds."""
    data = Interleaved(runs, skip, rounds, warmup=0)
    return {name: data.measurement(name).median_ms for name in runs}


def step_only_ms(burner: Any, root: Path, rows: int, features: int, n: int, iterations: int) -> float:
    """C as the ideal counts it: milliseconds per batch of stock Lightning's loop over ``n`` in-memory batches."""

    def run(probe: Probe) -> None:
        dataset = workloads.TimedDataset(n, 0.0, probe, rows, features)
        module = workloads.RegularStep(probe, features, burner, iterations)
        workloads.run_step_only(module, [dataset.make(i) for i in range(n)], root)

    return timed_epoch(run)
