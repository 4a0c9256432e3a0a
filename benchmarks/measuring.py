"""Measuring: what one run looked like (``Probe``), rounds interleaved across a point's entries (``Interleaved``).

Time per batch of a run is its steady state: the time from the step receiving batch ``skip`` to it receiving the
last batch, over the batches in between (``Probe.per_batch_s``). Every run of every scenario is timed over that
same window, so none pays a fixed cost the others do not: Trainer set-up, DataLoader worker start-up and shutdown,
and the one-off fill of a pipeline all fall outside it, and the ideal max(L, C) is reachable.

Rounds are interleaved (``Interleaved``): all entries of a scenario point (baselines and designs) run once per round,
so drifting load on a shared machine affects them alike, and a figure that compares entries (a ratio, an efficiency)
is computed per round from the entries of that round, then summarised as a median with a 95 % interval
(``benchmarks.intervals``). pytest-benchmark receives each entry's measured rounds through ``span_clock``, a clock
that advances only by the time per batch measured here, so the tables pytest prints are time per batch.
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

from benchmarks import intervals

# ------------------------------------------------------------------------------------------------- span clock
_SPAN_TOTAL = [0.0]


def span_clock() -> float:
    """pytest-benchmark timer: the sum of all per-batch times measured so far (see module docstring)."""
    return _SPAN_TOTAL[0]


def _advance_span_clock(seconds: float) -> None:
    _SPAN_TOTAL[0] += seconds


# ------------------------------------------------------------------------------------------------- the probe
# Told of every batch a step receives, with the time of receipt: set in a lockstep child only
# (``benchmarks.lockstep``), where a receipt ends the process's turn.
receipt_hook: Callable[[Probe, float], None] | None = None


class Probe:
    """What one run looked like from the dataset's and the step's side (thread-safe)."""

    def __init__(self, track_rss: bool = False) -> None:
        self._lock = threading.Lock()
        self.received_at: list[float] = []  # perf_counter() when the step received each batch: the timed window
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

    def batch_produced(self) -> None:
        rss = self._rss()
        off_main = threading.current_thread() is not threading.main_thread()
        with self._lock:
            self.produced += 1
            self.produced_off_main += off_main
            self.peak_in_flight = max(self.peak_in_flight, self.produced - self.consumed)
            self.peak_rss = max(self.peak_rss, rss)

    def batch_received(self, batch: torch.Tensor) -> None:
        now = time.perf_counter()
        rss = self._rss()
        with self._lock:
            self.received_at.append(now)
            self.consumed += 1
            self.received.append(batch_id(batch))
            self.peak_rss = max(self.peak_rss, rss)
        if receipt_hook is not None:
            receipt_hook(self, now)

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

    def per_batch_s(self, skip: int) -> float:
        """Steady-state seconds per batch: from the step receiving batch ``skip`` to it receiving the last one.

        Why a window and not the whole epoch: the whole epoch includes fixed costs that differ between runs (worker
        start-up, a pipeline's first load, which nothing can overlap), so an ideal built from runs without them was
        out of reach of the runs it judged. Each interval between two receipts is one period of the pipeline.
        """
        if not self.received_at and self.received and None not in (self.t_epoch_start, self.t_epoch_end):
            # S5 (GPU) records the batches at the epoch's end, to avoid a device sync per batch: the whole epoch
            return (self.t_epoch_end - self.t_epoch_start) / len(self.received)
        if len(self.received_at) < skip + 2:
            raise AssertionError(
                f"the run's step received {len(self.received_at)} batches; timing skips the first {skip} and needs"
                " two more"
            )
        return (self.received_at[-1] - self.received_at[skip]) / (len(self.received_at) - 1 - skip)


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


def measure(run_once: Callable[[], Probe], skip: int, rounds: int, warmup: int) -> Measurement:
    """Run ``run_once`` (one epoch, returns its probe) for warm-up plus measured rounds, on its own."""
    return Interleaved({"only": run_once}, skip, rounds, warmup).measurement("only")


class Interleaved:
    """Every entry of one scenario point (baselines and designs), measured round by round.

    Round r runs each entry once (warm-up rounds first, then measured ones; the starting entry rotates), so load
    that comes and goes on a shared machine hits every entry alike and the ratios between them stay meaningful.
    Each run is timed over its steady-state window (``Probe.per_batch_s(skip)``). An entry that raises is not run
    again; its exception is re-raised by ``measurement`` for that entry only. ``progress(label, entries, round,
    rounds, warmup)`` is told before each round (counted from 0, warm-up rounds included) and once at the end.
    """

    def __init__(
        self, runs: dict[str, Callable[[], Probe]], skip: int, rounds: int, warmup: int, label: str = "",
        progress: Callable[[str, int, int, int, int], None] | None = None,
    ) -> None:
        self.kept: dict[str, list[tuple[float, Probe]]] = {name: [] for name in runs}
        self.errors: dict[str, BaseException] = {}
        names = list(runs)
        total = warmup + rounds
        for r in range(total):
            if progress is not None:
                progress(label, len(names), r, total, warmup)
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                if name in self.errors:
                    continue
                try:
                    probe = runs[name]()
                    per_batch = probe.per_batch_s(skip)
                except Exception as error:  # noqa: BLE001  (re-raised, with its traceback, by measurement())
                    self.errors[name] = error
                    continue
                if r >= warmup:
                    self.kept[name].append((per_batch, probe))
        if progress is not None:
            progress(label, len(names), total, total, warmup)

    def measurement(self, name: str) -> Measurement:
        if name in self.errors:
            raise self.errors[name]
        kept = self.kept[name]
        return Measurement([k[0] for k in kept], [k[1] for k in kept])

    def ratio(self, name: str, reference: str) -> dict[str, Any]:
        """Time per batch of ``name`` over ``reference``, per round (both ran in it), as median and 95 % interval."""
        return intervals.summary(
            [t / ref for t, ref in zip(self.measurement(name).per_batch_s, self.measurement(reference).per_batch_s,
                                       strict=True)]
        )


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


def rounded(value: float | None, digits: int = 4) -> float | None:
    """For the JSON: rounded, and None for a missing or NaN figure (strict JSON has no NaN)."""
    if value is None or math.isnan(float(value)):
        return None
    return round(float(value), digits)
