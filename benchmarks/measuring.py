"""Measuring: what one run looked like (``Probe``), rounds interleaved across a point's entries, overlap figures.

Time per batch of a run = (epoch end - min(first load start, epoch start)) / batches: Trainer construction and
fit set-up are excluded, a design that starts loading before the epoch gets no head start, and the one-off
cost of filling a pipeline is included (it shrinks as 1/batches).

Rounds are interleaved (``Interleaved``): all entries of a scenario point (baselines and designs) run once per round,
so drifting load on a shared machine affects them alike. pytest-benchmark then receives each entry's measured
rounds through ``span_clock``, a clock that advances only by the time per batch measured here, so the tables
pytest prints are time per batch.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch

# ------------------------------------------------------------------------------------------------- span clock
_SPAN_TOTAL = [0.0]


def span_clock() -> float:
    """pytest-benchmark timer: the sum of all per-batch times measured so far (see module docstring)."""
    return _SPAN_TOTAL[0]


def _advance_span_clock(seconds: float) -> None:
    _SPAN_TOTAL[0] += seconds


# ------------------------------------------------------------------------------------------------- the probe
class Probe:
    """What one run looked like from the dataset's and the step's side (thread-safe)."""

    def __init__(self, track_rss: bool = False) -> None:
        self._lock = threading.Lock()
        self.t_first_load: float | None = None
        self.t_epoch_start: float | None = None
        self.t_epoch_end: float | None = None
        self.produced = 0
        self.consumed = 0
        self.peak_in_flight = 0
        self.received: list[int] = []  # ids of the batches the step received, in order
        self.trained: list[int] = []  # ids of the batches the step trained on (S2, where they differ)
        self.final_weights: list[torch.Tensor] = []
        # batches produced, and batch-transfer hooks run, on a thread other than the main one: where a design did
        # the work, seen from the work itself (an "auto" depth's decision shows here)
        self.produced_off_main = 0
        self.transfers = 0
        self.transfers_off_main = 0
        self.hook_work_s = 0.0  # time the batch-transfer hooks spent on their work (S6's M), all batches
        self.profile: Any = None  # a cProfile.Profile to run from epoch start to epoch end (S3's profile)
        self.batches_exact: bool | None = None  # S5: every received batch held its item's values
        self._process = psutil.Process() if track_rss else None
        self.rss_start = self._rss()
        self.peak_rss = self.rss_start

    def _rss(self) -> int:
        return self._process.memory_info().rss if self._process is not None else 0

    def load_started(self) -> None:
        if self.t_first_load is None:
            now = time.perf_counter()
            with self._lock:
                if self.t_first_load is None:
                    self.t_first_load = now

    def batch_produced(self) -> None:
        rss = self._rss()
        off_main = threading.current_thread() is not threading.main_thread()
        with self._lock:
            self.produced += 1
            self.produced_off_main += off_main
            self.peak_in_flight = max(self.peak_in_flight, self.produced - self.consumed)
            self.peak_rss = max(self.peak_rss, rss)

    def batch_received(self, batch: torch.Tensor) -> None:
        rss = self._rss()
        with self._lock:
            self.consumed += 1
            self.received.append(batch_id(batch))
            self.peak_rss = max(self.peak_rss, rss)

    def batch_transferred(self) -> None:
        off_main = threading.current_thread() is not threading.main_thread()
        with self._lock:
            self.transfers += 1
            self.transfers_off_main += off_main

    def hook_worked(self, seconds: float) -> None:
        with self._lock:
            self.hook_work_s += seconds

    def hook_ms_per_batch(self) -> float | None:
        return self.hook_work_s / self.transfers * 1000.0 if self.transfers else None

    def off_main_share(self) -> float | None:
        """Share of the batches loaded (or, where the loading is in worker processes, transferred) off the main
        thread; None when neither was observed in this process."""
        if self.produced:
            return self.produced_off_main / self.produced
        return self.transfers_off_main / self.transfers if self.transfers else None

    def epoch_started(self) -> None:
        self.rss_start = self._rss() if self._process is not None else 0
        self.peak_rss = max(self.peak_rss, self.rss_start)
        if self.profile is not None:
            self.profile.enable()
        self.t_epoch_start = time.perf_counter()

    def epoch_ended(self, *params: torch.Tensor) -> None:
        self.t_epoch_end = time.perf_counter()
        if self.profile is not None:
            self.profile.disable()
        self.final_weights = [p.detach().clone() for p in params]

    def span(self) -> float:
        starts = [t for t in (self.t_first_load, self.t_epoch_start) if t is not None]
        if not starts or self.t_epoch_end is None:
            raise AssertionError(
                f"the run recorded no complete epoch (first load {self.t_first_load}, epoch start"
                f" {self.t_epoch_start}, epoch end {self.t_epoch_end})"
            )
        return self.t_epoch_end - min(starts)


def batch_id(batch: torch.Tensor) -> int:
    return int(batch[0, 0].item())


def check_exactly_once(ids: Sequence[int], n: int, what: str = "received") -> None:
    """The step saw batches 0..n-1, each once, in order."""
    expected = list(range(n))
    if list(ids) != expected:
        missing = sorted(set(expected) - set(ids))
        extra = [i for i in ids if i not in expected]
        raise AssertionError(
            f"the step {what} batches {list(ids)}, expected {expected} (missing {missing}, unexpected {extra})"
        )


# ------------------------------------------------------------------------------------------------- measuring
@dataclass
class Measurement:
    """Per-batch seconds of the measured rounds (warm-up rounds dropped) and their probes."""

    per_batch_s: list[float]
    probes: list[Probe]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.per_batch_s) * 1000.0

    @property
    def min_ms(self) -> float:
        return min(self.per_batch_s) * 1000.0

    @property
    def rounds(self) -> int:
        return len(self.per_batch_s)


def measure(run_once: Callable[[], Probe], n_batches: int, rounds: int, warmup: int) -> Measurement:
    """Run ``run_once`` (one epoch, returns its probe) for warm-up plus measured rounds, on its own."""
    return Interleaved({"only": run_once}, n_batches, rounds, warmup).measurement("only")


class Interleaved:
    """Every entry of one scenario point (baselines and designs), measured round by round.

    Round r runs each entry once (warm-up rounds first, then measured ones; the starting entry rotates), so load
    that comes and goes on a shared machine hits every entry alike and the ratios between them stay meaningful.
    An entry that raises is not run again; its exception is re-raised by ``measurement`` for that entry only.
    """

    def __init__(
        self, runs: dict[str, Callable[[], Probe]], n_batches: int, rounds: int, warmup: int
    ) -> None:
        self.kept: dict[str, list[tuple[float, Probe]]] = {name: [] for name in runs}
        self.errors: dict[str, BaseException] = {}
        names = list(runs)
        for r in range(warmup + rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                if name in self.errors:
                    continue
                try:
                    probe = runs[name]()
                    per_batch = probe.span() / n_batches
                except Exception as error:  # noqa: BLE001  (re-raised, with its traceback, by measurement())
                    self.errors[name] = error
                    continue
                if r >= warmup:
                    self.kept[name].append((per_batch, probe))

    def measurement(self, name: str) -> Measurement:
        if name in self.errors:
            raise self.errors[name]
        kept = self.kept[name]
        return Measurement([k[0] for k in kept], [k[1] for k in kept])


def report(benchmark: Any, measurement: Measurement) -> None:
    """Hand an entry's per-round times (already measured, interleaved) to pytest-benchmark, one round each.

    The target advances ``span_clock`` by the next measured time per batch, so pytest-benchmark's statistics and
    tables are exactly these measurements. With benchmarking disabled (smoke mode) this is a no-op round.
    """
    values = iter(measurement.per_batch_s)

    def replay() -> None:
        _advance_span_clock(next(values, 0.0))

    benchmark.pedantic(replay, rounds=max(1, measurement.rounds), warmup_rounds=0)


def use_mmap_for_large_allocations(threshold: int = 1 << 20) -> int | None:
    """Make glibc serve allocations >= ``threshold`` with mmap, so freed batches leave RSS (S4's memory figures).

    Without this, glibc's dynamic threshold keeps freed multi-MB blocks in the heap and RSS remembers the largest
    run so far instead of showing each run's peak. Returns the threshold, or None where it cannot be set.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    m_mmap_threshold = -3
    return threshold if libc.mallopt(m_mmap_threshold, threshold) == 1 else None


# ------------------------------------------------------------------------------------------------- overlap
def efficiency(t_serial: float, t: float, t_ideal: float) -> float:
    """Overlap efficiency (T_serial - T) / (T_serial - T_ideal); NaN when the serial run was not slower than ideal."""
    return (t_serial - t) / (t_serial - t_ideal) if t_serial > t_ideal else float("nan")


SERIAL, LOAD_ONLY, STEP_ONLY, STEP_ONLY_RAW = (
    "baseline:regular", "baseline:load-only", "baseline:step-only", "baseline:step-only-raw")


@dataclass(frozen=True)
class Overlap:
    """A design's time per batch against the serial, load-only and step-only baselines of the same point (ms).

    T_ideal = max(L, C) with C the step-only run through stock Lightning's loop (what any design could at best
    reach); ``c_raw`` is the same step in a plain PyTorch loop, kept as the raw-loop figure.
    """

    t: float
    t_serial: float
    l: float
    c: float
    c_raw: float | None
    efficiency: float
    efficiency_best_rounds: float  # from every entry's fastest round: noise only adds time, so the assertions use it

    @property
    def t_ideal(self) -> float:
        return max(self.l, self.c)

    @property
    def t_ideal_raw(self) -> float | None:
        return None if self.c_raw is None else max(self.l, self.c_raw)

    @property
    def efficiency_raw_ideal(self) -> float | None:
        return None if self.c_raw is None else efficiency(self.t_serial, self.t, self.t_ideal_raw)

    def row(self, n_batches: int) -> dict[str, Any]:
        """The figures a design row records (rounded), including the ceiling a perfect pipeline reaches.

        A perfect pipeline still produces the first batch before the first step: over n batches it gets
        T = T_ideal + min(L, C) / n, so its efficiency is ``efficiency_ceiling``, not 1.
        """
        fill = min(self.l, self.c) / n_batches
        gap = self.t_serial - self.t_ideal
        return dict(
            L_ms=rounded(self.l), C_ms=rounded(self.c), C_raw_ms=rounded(self.c_raw),
            L_over_C_measured=rounded(self.l / self.c), time_per_batch_ms=rounded(self.t),
            t_serial_ms=rounded(self.t_serial), t_ideal_ms=rounded(self.t_ideal),
            t_ideal_raw_ms=rounded(self.t_ideal_raw), efficiency=rounded(self.efficiency),
            efficiency_raw_ideal=rounded(self.efficiency_raw_ideal),
            efficiency_ceiling=rounded((gap - fill) / gap if gap > 0 else float("nan")),
            efficiency_best_rounds=rounded(self.efficiency_best_rounds),
            speedup_vs_serial=rounded(self.t_serial / self.t),
        )


def overlap(data: Any, measurement: Any, serial: str = SERIAL) -> Overlap:
    """``measurement`` of one design against the baselines measured in the same interleaved rounds (``data``)."""
    t_serial, load, step = (data.measurement(b) for b in (serial, LOAD_ONLY, STEP_ONLY))
    raw = data.measurement(STEP_ONLY_RAW).median_ms if STEP_ONLY_RAW in data.kept else None
    return Overlap(
        t=measurement.median_ms,
        t_serial=t_serial.median_ms,
        l=load.median_ms,
        c=step.median_ms,
        c_raw=raw,
        efficiency=efficiency(t_serial.median_ms, measurement.median_ms, max(load.median_ms, step.median_ms)),
        efficiency_best_rounds=efficiency(t_serial.min_ms, measurement.min_ms, max(load.min_ms, step.min_ms)),
    )


def versus_alternatives(data: Any, measurement: Any, alternatives: Sequence[str]) -> dict[str, Any]:
    """Time ratio of an entry against each alternative of the point and the fastest one (< 1: the entry is faster)."""
    times = {name: data.measurement(name).median_ms for name in alternatives}
    best = min(times, key=times.get)
    out: dict[str, Any] = {"best_alternative": best,
                           "vs_best_alternative": rounded(measurement.median_ms / times[best])}
    for name, t in times.items():
        out[f"vs_{name.removeprefix('alt:').replace('-', '_')}"] = rounded(measurement.median_ms / t)
    return out


def rounded(value: float | None, digits: int = 4) -> float | None:
    """For the JSON: rounded, and None for a missing or NaN figure (strict JSON has no NaN)."""
    if value is None or math.isnan(float(value)):
        return None
    return round(float(value), digits)
