"""Workloads the scenarios run, observed from the dataset and the step, never from a design's internals.

- ``TimedDataset`` item ``i`` is batch ``i`` (its first column holds ``i``); producing it takes ``load_ms[i]``
  (building the tensor, then sleeping for the rest, as storage or network latency would).
- ``Burner`` is calibrated real tensor work (square matmuls with ``TORCH_THREADS`` intra-op threads), so a step
  "computing for C ms" runs ``Burner.iterations_for(C)`` matmuls.
- ``RegularStep`` / ``IterStep`` are the two flavours of one module; ``make_trainer`` builds stock Lightning's or a
  design's Trainer with the suite's quiet defaults; ``run_raw_loop``, ``run_load_only`` and ``run_step_only`` are
  the baselines.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.measuring import Probe
from tests.conformance.harness import QUIET

TORCH_THREADS = 1  # one core for the step, the other for whatever a design or step runs alongside it


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


def run_step_only(module: BenchModule, batches: Sequence[torch.Tensor]) -> None:
    """Only the step's work on batches that are already there: T_ideal's C side (the raw loop over a list)."""
    run_raw_loop(module, batches)
