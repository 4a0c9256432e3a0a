"""Workloads, instrumentation and measurement shared by the benchmark scenarios (issue 7).

Everything a scenario measures is observed from the dataset and the step, never from a design's internals:

- ``TimedDataset`` item ``i`` is batch ``i`` (its first column holds ``i``); producing it takes ``load_ms[i]``
  (building the tensor, then sleeping for the rest, as storage or network latency would).
- ``Probe`` records, per run: when the first load started, when the epoch started and ended, which batches the
  step received, batches in flight (produced by the dataset but not yet received by the step) and process RSS.
- ``Burner`` is calibrated real tensor work (square matmuls with ``TORCH_THREADS`` intra-op threads), so a step
  "computing for C ms" runs ``Burner.iterations_for(C)`` matmuls.

Time per batch of a run = (epoch end - min(first load start, epoch start)) / batches: Trainer construction and
fit set-up are excluded, a design that starts loading before the epoch gets no head start, and the one-off
cost of filling a pipeline is included (it shrinks as 1/batches).

Rounds are interleaved (``Interleaved``): all entries of a scenario point (baselines and designs) run once per round,
so drifting load on a shared machine affects them alike. pytest-benchmark then receives each entry's measured
rounds through ``span_clock``, a clock that advances only by the time per batch the harness measured, so the tables
pytest prints are time per batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "rfc" / "results"
PARTIAL_DIR = REPO_ROOT / ".benchmarks"  # git-ignored: results of runs that did not cover S1-S4
MACHINE_KIND = os.environ.get("BENCHMARKS_MACHINE_KIND", "python")
TORCH_THREADS = 1  # one core for the step, the other for whatever a design or step runs alongside it
SCHEMA = 1

# ------------------------------------------------------------------------------------------------- span clock
_SPAN_TOTAL = [0.0]


def span_clock() -> float:
    """pytest-benchmark timer: the sum of all per-batch times measured so far (see module docstring)."""
    return _SPAN_TOTAL[0]


def _advance_span_clock(seconds: float) -> None:
    _SPAN_TOTAL[0] += seconds


# ------------------------------------------------------------------------------------------------- set-up info
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def setup_info() -> dict[str, Any]:
    """Machine, versions and commit: the ``setup`` block of the results file and every benchmark's extra_info."""
    return {
        "machine": f"{MACHINE_KIND}: {_cpu_model()}, {os.cpu_count()} logical cores, {platform.system()} {platform.machine()}",
        "machine_kind": MACHINE_KIND,
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": TORCH_THREADS,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pytorch_lightning": pl.__version__,
        "torchdata": _version("torchdata"),
        "pytest_benchmark": _version("pytest-benchmark"),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


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
        with self._lock:
            self.produced += 1
            self.peak_in_flight = max(self.peak_in_flight, self.produced - self.consumed)
            self.peak_rss = max(self.peak_rss, rss)

    def batch_received(self, batch: torch.Tensor) -> None:
        rss = self._rss()
        with self._lock:
            self.consumed += 1
            self.received.append(batch_id(batch))
            self.peak_rss = max(self.peak_rss, rss)

    def epoch_started(self) -> None:
        self.rss_start = self._rss() if self._process is not None else 0
        self.peak_rss = max(self.peak_rss, self.rss_start)
        self.t_epoch_start = time.perf_counter()

    def epoch_ended(self, *params: torch.Tensor) -> None:
        self.t_epoch_end = time.perf_counter()
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


# ------------------------------------------------------------------------------------------------- data
class TimedDataset(Dataset):
    """Map-style; item ``i`` is batch ``i`` of shape ``(rows, 1 + features)`` with ``i`` in column 0.

    Producing item ``i`` takes ``load_ms[i]`` ms: the tensor is built (a fresh copy, so memory in flight is real),
    then the rest of the time is slept, as I/O latency would. Use with ``DataLoader(batch_size=None)``.
    """

    def __init__(
        self, n: int, load_ms: float | Sequence[float], probe: Probe, rows: int, features: int, seed: int = 0
    ) -> None:
        self.n = n
        loads = [float(load_ms)] * n if isinstance(load_ms, (int, float)) else [float(x) for x in load_ms]
        if len(loads) != n:
            raise ValueError(f"{len(loads)} load times for {n} items")
        self.load_s = [ms / 1000.0 for ms in loads]
        self.probe = probe
        generator = torch.Generator().manual_seed(seed)
        self._template = torch.randn(rows, 1 + features, generator=generator)

    def __len__(self) -> int:
        return self.n

    def make(self, i: int) -> torch.Tensor:
        batch = self._template.clone()
        batch[:, 0] = float(i)
        return batch

    def __getitem__(self, i: int) -> torch.Tensor:
        start = time.perf_counter()
        self.probe.load_started()
        batch = self.make(i)
        remaining = start + self.load_s[i] - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        self.probe.batch_produced()
        return batch


def loader(dataset: Dataset) -> DataLoader:
    """The loader every scenario uses: one item per batch, ``num_workers=0`` (loading runs where it is called)."""
    return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=0)


def jittered_loads(n: int, mean_ms: float, seed: int) -> list[float]:
    """``n`` load times drawn from an exponential distribution (fixed seed), rescaled to mean exactly ``mean_ms``."""
    generator = torch.Generator().manual_seed(seed)
    draws = torch.empty(n, dtype=torch.float64).exponential_(1.0, generator=generator)
    draws = draws * (mean_ms / draws.mean())
    return [float(x) for x in draws]


# ------------------------------------------------------------------------------------------------- compute
class Burner:
    """Calibrated real tensor work: ``size`` x ``size`` float32 matmuls (they release the GIL)."""

    def __init__(self, size: int = 256, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.size = size
        self.a = torch.randn(size, size, generator=generator)
        self.b = torch.randn(size, size, generator=generator) / size**0.5
        self.ms_per_matmul = self._calibrate()

    def _calibrate(self) -> float:
        """The fastest of many short samples: what the work costs on a core nobody else is using at the moment.

        (A median would bake the load of the moment of calibration into every C of the session; the step-only
        baselines measure what C actually was, under whatever load there was.)
        """
        out = torch.empty(self.size, self.size)
        for _ in range(20):
            torch.mm(self.a, self.b, out=out)
        samples = []
        for _ in range(40):
            start = time.perf_counter()
            for _ in range(4):
                torch.mm(self.a, self.b, out=out)
            samples.append((time.perf_counter() - start) / 4 * 1000.0)
        return min(samples)

    def iterations_for(self, ms: float) -> int:
        return max(0, round(ms / self.ms_per_matmul))

    def run(self, iterations: int) -> torch.Tensor:
        out = torch.empty(self.size, self.size)  # per call: safe to run from several threads at once
        for _ in range(iterations):
            torch.mm(self.a, self.b, out=out)
        return out


# ------------------------------------------------------------------------------------------------- modules
class BenchModule(pl.LightningModule):
    """A tiny linear model plus ``burn_iterations`` calibrated matmuls per batch; records epoch start/end."""

    def __init__(self, probe: Probe, features: int, burner: Burner, burn_iterations: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(features, 1)
        self.probe = probe
        self.burner = burner
        self.burn_iterations = burn_iterations

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def compute(self, batch: torch.Tensor) -> torch.Tensor:
        self.burner.run(self.burn_iterations)
        return self.layer(batch[:, 1:]).pow(2).mean()

    def on_train_epoch_start(self) -> None:
        self.probe.epoch_started()

    def on_train_epoch_end(self) -> None:
        self.probe.epoch_ended(*self.parameters())


class RegularStep(BenchModule):
    """Lightning's regular flavour."""

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.probe.batch_received(batch)
        return self.compute(batch)


class IterStep(BenchModule):
    """The ``dataloader_iter`` flavour, the plainest user code: one batch per step, nothing special."""

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        self.probe.batch_received(batch)
        return self.compute(batch)


# ------------------------------------------------------------------------------------------------- runs
TRAINER_KWARGS: dict[str, Any] = dict(
    max_epochs=1,
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence Lightning's per-Trainer info lines and its known warnings (experimental flavour, few workers)."""
    loggers = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*dataloader_iter.*")
            warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=r".*number of training batches.*")
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # torch 2.13 pytree deprecation in Lightning
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def fit(trainer: pl.Trainer, module: pl.LightningModule, data: DataLoader) -> None:
    with quiet():
        trainer.fit(module, train_dataloaders=data)


def make_trainer(design: Any | None, root: Path, **overrides: Any) -> pl.Trainer:
    """A Trainer for ``design`` (a registry entry), or stock ``pl.Trainer`` when ``design`` is None."""
    kwargs = {**TRAINER_KWARGS, "default_root_dir": str(root), **overrides}
    with quiet():
        return pl.Trainer(**kwargs) if design is None else design.trainer(**kwargs)


def run_raw_loop(module: BenchModule, data: DataLoader) -> None:
    """Plain PyTorch over the same loader, model and step work: the floor for per-batch overhead."""
    optimizer = module.configure_optimizers()
    module.probe.epoch_started()
    for batch in data:
        module.probe.batch_received(batch)
        loss = module.compute(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    module.probe.epoch_ended(*module.parameters())


def run_load_only(probe: Probe, data: DataLoader) -> None:
    """Only the loading: T_ideal's L side."""
    probe.epoch_started()
    for batch in data:
        probe.batch_received(batch)
    probe.epoch_ended()


def run_step_only(module: BenchModule, batches: Sequence[torch.Tensor]) -> None:
    """Only the step's work on batches that are already there: T_ideal's C side."""
    optimizer = module.configure_optimizers()
    module.probe.epoch_started()
    for batch in batches:
        module.probe.batch_received(batch)
        loss = module.compute(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    module.probe.epoch_ended(*module.parameters())


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
    tables are exactly the harness's measurements. With benchmarking disabled (smoke mode) this is a no-op round.
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


# ------------------------------------------------------------------------------------------------- results
@dataclass
class ResultStore:
    """Rows per scenario, measured scenario points, and the session's notes; written as JSON at session end."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    points: dict[tuple, Interleaved] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def record(self, scenario: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(scenario, []).append(row)

    def point(self, key: tuple, measure_now: Callable[[], Interleaved]) -> Interleaved:
        """A scenario point's interleaved measurements, taken by the first test that needs them."""
        if key not in self.points:
            before = os.getloadavg()[0]
            self.points[key] = measure_now()
            # before and after; both include this run's own threads
            self.notes.setdefault("loadavg_1min_per_point", {})[" ".join(map(str, key))] = [
                round(before, 2), round(os.getloadavg()[0], 2)]
        return self.points[key]


RESULTS = ResultStore()

TARGETS = {
    "S1": dict(
        what="prefetcher's overlap efficiency at L = C (S1)",
        metric="efficiency",
        compare=">=",
        threshold=0.95,
    ),
    "S2": dict(
        what="speed-up of the pipelined step over the same step without pipelining, every design (S2)",
        metric="speedup",
        compare=">=",
        threshold=1.6,
    ),
    "S3": dict(
        what="time per batch of the dataloader_iter flavour relative to stock Lightning's regular flavour (S3)",
        metric="overhead_vs_regular",
        compare="<=",
        threshold=1.05,
    ),
    "S4": dict(
        what="peak batches in flight (produced by the dataset, not yet received by the step) <= depth + 1 (S4)",
        metric="peak_in_flight",
        compare="<=",
        threshold="depth + 1",
    ),
}


def _met(value: float, compare: str, threshold: float) -> bool:
    return value >= threshold if compare == ">=" else value <= threshold


def evaluate_targets(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Where each design stands against the issue's targets, from the recorded rows."""
    out: dict[str, Any] = {}
    for scenario, spec in TARGETS.items():
        entry: dict[str, Any] = dict(spec)
        results = []
        for row in rows.get(scenario, []):
            if row.get("role") != "design":
                continue
            if scenario == "S1" and not (row["design"].split("[")[0] == "prefetcher" and row["L_over_C"] == 1.0):
                continue
            if scenario == "S3" and row["flavour"] != "dataloader_iter":
                continue
            if scenario == "S4":
                if row.get("depth") is None:
                    continue
                limit = row["depth"] + 1
                results.append(dict(design=row["design"], value=row["peak_in_flight"], limit=limit,
                                    met=row["peak_in_flight"] <= limit))
                continue
            value = row[spec["metric"]]
            results.append(dict(design=row["design"], value=value, met=_met(value, spec["compare"], spec["threshold"])))
        entry["results"] = results
        if not results:
            entry["note"] = "no design measured for this target in this run (e.g. prefetcher not registered yet)"
        out[scenario] = entry
    return out


def results_document(store: ResultStore, setup: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "setup": setup,
        "targets": evaluate_targets(store.rows),
        "scenarios": {s: store.rows.get(s, []) for s in ("S1", "S2", "S3", "S4", "S5") if s in store.rows},
        "notes": store.notes,
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def efficiency(t_serial: float, t: float, t_ideal: float) -> float:
    """Overlap efficiency (T_serial - T) / (T_serial - T_ideal); NaN when the serial run was not slower than ideal."""
    return (t_serial - t) / (t_serial - t_ideal) if t_serial > t_ideal else float("nan")


@dataclass(frozen=True)
class Overlap:
    """A design's time per batch against the serial, load-only and step-only baselines of the same point (ms)."""

    t: float
    t_serial: float
    l: float
    c: float
    efficiency: float
    efficiency_best_rounds: float  # from every entry's fastest round: noise only adds time, so the assertions use it

    @property
    def t_ideal(self) -> float:
        return max(self.l, self.c)


def overlap(data: Any, measurement: Any) -> Overlap:
    """``measurement`` of one design against the baselines measured in the same interleaved rounds (``data``)."""
    serial, load, step = (data.measurement(f"baseline:{b}") for b in ("regular", "load-only", "step-only"))
    return Overlap(
        t=measurement.median_ms,
        t_serial=serial.median_ms,
        l=load.median_ms,
        c=step.median_ms,
        efficiency=efficiency(serial.median_ms, measurement.median_ms, max(load.median_ms, step.median_ms)),
        efficiency_best_rounds=efficiency(serial.min_ms, measurement.min_ms, max(load.min_ms, step.min_ms)),
    )


def rounded(value: float | None, digits: int = 4) -> float | None:
    """For the JSON: rounded, and None for a missing or NaN figure (strict JSON has no NaN)."""
    if value is None or math.isnan(float(value)):
        return None
    return round(float(value), digits)
