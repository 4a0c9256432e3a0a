"""Workloads the scenarios run, observed from the dataset and the step, never from a design's internals.

- ``TimedDataset`` item ``i`` is batch ``i`` (its first column holds ``i``); producing it takes ``load_ms[i]``
  (building the tensor, then sleeping for the rest, as storage or network latency would).
- ``Burner`` is calibrated real tensor work (square matmuls with ``TORCH_THREADS`` intra-op threads), so a step
  "computing for C ms" runs ``Burner.iterations_for(C)`` matmuls.
- ``RegularStep`` / ``IterStep`` are the two flavours of one module; ``make_trainer`` builds stock Lightning's or a
  design's Trainer with the suite's quiet defaults; ``run_load_only``, ``run_step_only`` (stock Lightning over
  batches already in memory: the ideal's step side) and ``run_raw_loop`` (plain PyTorch) are the baselines.
- ``loader`` is the scenarios' DataLoader (``num_workers=0`` unless asked), ``nodes_loader`` the same loader wrapped
  in torchdata ``nodes`` prefetching: with ``loader(..., workers=2)`` the two alternatives a user would pick today.

How the work and the sleep are set to hit a point's nominal times is ``benchmarks.calibration``; which configurations
of each design a scenario runs, and which of them the targets judge, is ``benchmarks.entries``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchdata import nodes

from benchmarks.measuring import Probe
from harness_common import QUIET

REPO_ROOT = Path(__file__).resolve().parents[1]
TORCH_THREADS = 1  # one core for the step, the other for whatever a design or step runs alongside it


# ------------------------------------------------------------------------------------------------- data
class TimedDataset(Dataset):
    """Map-style; item ``i`` is batch ``i`` of shape ``(rows, 1 + features)`` with ``i`` in column 0.

    Producing item ``i`` takes ``load_ms[i]`` ms: the tensor is built (a fresh copy, so memory in flight is real),
    then the rest of the time is slept, as I/O latency would; ``work_iterations`` matmuls of ``burner`` per item
    come on top (work a user moved into the dataset). Use with ``DataLoader(batch_size=None)``.
    """

    def __init__(
        self, n: int, load_ms: float | Sequence[float], probe: Probe, rows: int, features: int, seed: int = 0,
        burner: Burner | None = None, work_iterations: int = 0,
    ) -> None:
        self.n = n
        self.burner, self.work_iterations = burner, work_iterations  # tensor work per item (S6: M in the workers)
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
        batch = self.make(i)
        if self.work_iterations:
            self.burner.run(self.work_iterations)
        remaining = start + self.load_s[i] - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        self.probe.batch_produced()
        return batch


ALTERNATIVE_WORKERS = 2  # DataLoader workers of the alternatives (one per core of the measuring machine)
NODES_PREFETCH_FACTOR = 2  # torchdata.nodes.Prefetcher's batches in flight in the torchdata alternative


def loader(dataset: Dataset, workers: int = 0) -> DataLoader:
    """The loader every scenario uses: one item per batch; ``num_workers=0`` (loading runs where it is called)
    unless ``workers`` is given (then with ``persistent_workers=True``, as a user hiding latency would set it)."""
    return DataLoader(dataset, batch_size=None, shuffle=False, num_workers=workers, persistent_workers=workers > 0)


def nodes_loader(data: DataLoader) -> nodes.Loader:
    """``data`` wrapped in torchdata ``nodes`` prefetching: a thread iterates the loader and keeps
    ``NODES_PREFETCH_FACTOR`` batches ready; Lightning still runs the batch-transfer hooks on the main thread."""
    return nodes.Loader(nodes.Prefetcher(nodes.IterableWrapper(data), NODES_PREFETCH_FACTOR))


def mapped_loader(work: Callable[[Any], Any], threads: int, data: DataLoader) -> nodes.Loader:
    """``data`` with ``work`` applied to each batch by torchdata ``ParallelMapper`` threads (in order), then
    prefetched: where a user can move per-batch main-process work that releases the GIL."""
    mapped = nodes.ParallelMapper(nodes.IterableWrapper(data), work, num_workers=threads, method="thread",
                                  in_order=True)
    return nodes.Loader(nodes.Prefetcher(mapped, NODES_PREFETCH_FACTOR))


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
        # Why per call: torch.set_num_threads sets only the calling thread's team size, and a design's or a
        # library's thread would otherwise run these matmuls on every core (and spin against the step)
        torch.set_num_threads(TORCH_THREADS)
        out = torch.empty(self.size, self.size)  # per call: safe to run from several threads at once
        for _ in range(iterations):
            torch.mm(self.a, self.b, out=out)
        return out


# ------------------------------------------------------------------------------------------------- modules
class BenchModule(pl.LightningModule):
    """A tiny linear model plus ``burn_iterations`` calibrated matmuls per batch; records epoch start/end.

    ``hook_iterations`` matmuls per batch run in the batch-transfer hooks (half in ``on_before_batch_transfer``,
    half in ``on_after_batch_transfer``): S6's main-process work M, the CPU stand-in for host-to-device copies and
    device-side augmentation (S6's alternatives move it into the workers or into ``ParallelMapper`` threads).
    """

    def __init__(
        self, probe: Probe, features: int, burner: Burner, burn_iterations: int, hook_iterations: int = 0
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(features, 1)
        self.probe = probe
        self.burner = burner
        self.burn_iterations = burn_iterations
        self.hook_iterations = (hook_iterations // 2, hook_iterations - hook_iterations // 2)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self._hook_work(self.hook_iterations[0])
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self._hook_work(self.hook_iterations[1])
        self.probe.batch_transferred()
        return batch

    def _hook_work(self, iterations: int) -> None:
        if iterations:
            start = time.perf_counter()
            self.burner.run(iterations)
            self.probe.hook_worked(time.perf_counter() - start)

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
    """The ``dataloader_iter`` flavour, the plainest user code: one batch per step, nothing special.

    Where the loop handed over a batch without running the batch-transfer hooks (stock Lightning's flavour does
    not run them, #18831), the step runs them itself, as a user of that flavour has to for the batch to reach the
    module's device through them: every entry does the same transfer work for every batch (S6's hook work M
    included), wherever it runs, so S3 compares the loops' own cost per batch.
    """

    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        self.probe.batch_received(batch)
        if self.probe.transfers < self.probe.consumed:
            batch = self.on_before_batch_transfer(batch, 0)
            batch = self.on_after_batch_transfer(self.transfer_batch_to_device(batch, self.device, 0), 0)
        return self.compute(batch)


# ------------------------------------------------------------------------------------------------- runs
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
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def fit(trainer: pl.Trainer, module: pl.LightningModule, data: DataLoader) -> None:
    with quiet():
        trainer.fit(module, train_dataloaders=data)


def fit_closing(
    design: Any | None, root: Path, module: pl.LightningModule, data: DataLoader,
    wrap: Callable[[DataLoader], Iterable[Any]] | None = None,
) -> None:
    """``fit`` over ``data`` (or ``wrap(data)``), then stop ``data``'s persistent workers, so no run leaves
    processes behind that compete with the next one."""
    try:
        fit(make_trainer(design, root), module, wrap(data) if wrap is not None else data)
    finally:
        workers = getattr(data, "_iterator", None)
        if workers is not None and hasattr(workers, "_shutdown_workers"):
            workers._shutdown_workers()


def make_trainer(design: Any | None, root: Path, **overrides: Any) -> pl.Trainer:
    """A Trainer for ``design`` (a registry entry), or stock ``pl.Trainer`` when ``design`` is None."""
    kwargs = {**QUIET, "default_root_dir": str(root), **overrides}
    with quiet():
        return pl.Trainer(**kwargs) if design is None else design.trainer(**kwargs)


def run_raw_loop(module: BenchModule, data: Iterable[torch.Tensor]) -> None:
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


def run_step_only(module: BenchModule, batches: Sequence[torch.Tensor], root: Path) -> None:
    """T_ideal's C side: stock Lightning's regular flavour over batches already in memory (L = 0), the same step.

    Why Lightning's loop and not a raw one: every design runs inside Lightning's loop and pays its per-batch cost,
    so the best any design can do is this loop with loading taking no time at all.
    """
    fit(make_trainer(None, root), module, DataLoader(list(batches), batch_size=None, shuffle=False))


def run_raw_step_only(module: BenchModule, batches: Sequence[torch.Tensor]) -> None:
    """The same step's work in a plain PyTorch loop over batches already in memory (kept as the raw-loop figure)."""
    run_raw_loop(module, batches)
