"""S7 a step call under DDP: what a `dataloader_iter` step call costs against a batch of stock's regular flavour.

Under DDP a design that counts batches votes on the end of data between two step calls. The recommended design
carries the vote in the collective stock Lightning makes there anyway (rank 0's SIGTERM broadcast before every
batch), so a call should cost what a regular batch costs. Measured on ``WORLD_SIZES`` CPU ranks on gloo (forked
processes on this machine, as ``tests/conformance/ddp.py`` launches them): every rank alternates, round by round,
a fit of stock Lightning's regular flavour and a fit of each design's flavour as it ships (one batch per call, the
S3 step: a Linear layer, batch of 1), and rank 0 times each fit's calls over its steady-state window. The ratio
per round (the design's time per call over stock's time per batch, both from the same round) gives the median and
its 95 % interval; the S7 target judges it at 2 ranks. Larger worlds run the recommended design only: with more
processes than cores each rank waits for the scheduler as much as for its peers, so they show the trend, not the
cost a cluster would see.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from benchmarks import entries, intervals, measuring, workloads
from harness_common import QUIET
from prototypes import DESIGNS
from prototypes.common import Design

pytestmark = [
    pytest.mark.benchmark(group="S7 a step call under DDP (time per call)", timer=measuring.span_clock),
    pytest.mark.timeout(1800),
]

WORLD_SIZES = (2, 4, 8)
RECOMMENDED = "prefetcher"  # the design the larger worlds run (the RFC's recommendation)
STOCK_REGULAR = "stock regular"
SKIP = 10  # calls before each fit's timed window


class TinyStep(pl.LightningModule):
    """The S3 step: a Linear layer, batch of 1; records when each call starts (rank 0 reads the window)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.started_at: list[float] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        self.started_at.append(time.perf_counter())
        return self.layer(batch).pow(2).mean()

    def per_call_s(self) -> float:
        timed = self.started_at[SKIP:]
        return (timed[-1] - timed[0]) / (len(timed) - 1)


class RegularTinyStep(TinyStep):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)


class IterTinyStep(TinyStep):
    def training_step(self, dataloader_iter) -> torch.Tensor:
        batch, _, _ = next(dataloader_iter)
        return self.loss(batch)


def _entries(world: int) -> dict[str, Callable[..., pl.Trainer]]:
    """What a world runs: stock's regular flavour, then each runnable design's shipped flavour (the recommended one
    only beyond 2 ranks)."""
    designs = {name: design for name, design in DESIGNS.items() if design.unavailable_reason() is None}
    if world > 2:
        designs = {RECOMMENDED: designs[RECOMMENDED]}
    return {STOCK_REGULAR: pl.Trainer, **{design.id: design.trainer for design in designs.values()}}


def _rank(rank: int, world: int, port: int, rounds: int, batches: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), NODE_RANK="0",
                      LOCAL_RANK=str(rank), RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    data = DataLoader(torch.randn(batches * world, 1, 8), batch_size=None)  # Lightning shards it per rank
    timings: dict[str, list[float]] = {}
    runs = _entries(world)
    for round_index in range(rounds):
        order = list(runs) if round_index % 2 == 0 else list(reversed(runs))  # ABBA: drift falls on both alike
        for entry in order:
            strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=120))
            trainer = runs[entry](**{**QUIET, "devices": world, "strategy": strategy, "default_root_dir": out})
            module = RegularTinyStep() if entry == STOCK_REGULAR else IterTinyStep()
            with workloads.quiet():
                trainer.fit(module, train_dataloaders=data)
            timings.setdefault(entry, []).append(module.per_call_s())
    if rank == 0:
        (Path(out) / f"rank0-{world}.json").write_text(json.dumps(timings))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_world(world: int, rounds: int, batches: int, out: Path, deadline_s: float) -> dict[str, list[float]]:
    """Launch ``world`` ranks, wait for them (killing them at the deadline), return rank 0's seconds per call for
    each entry, one per round."""
    context = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [context.Process(target=_rank, args=(rank, world, port, rounds, batches, str(out)))
             for rank in range(world)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + deadline_s
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
    result = out / f"rank0-{world}.json"
    if not result.exists():
        raise AssertionError(f"the {world}-rank S7 run reported nothing (exit codes {[p.exitcode for p in procs]})")
    return json.loads(result.read_text())


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_s7_step_call_under_ddp(benchmark, bench, tmp_path: Path, world: int) -> None:
    rounds = max(bench.sizes.rounds, intervals.MIN_ROUNDS) if bench.measuring else 1
    if world > 2 and not bench.measuring:
        pytest.skip("larger worlds are measured in benchmark mode only; the smoke run launches 2 ranks")
    batches = bench.sizes.s3_batches + SKIP
    timings = measure_world(world, rounds, batches, tmp_path, deadline_s=60 + 30 * rounds * world)
    stock = timings.pop(STOCK_REGULAR)
    assert all(len(per_round) == rounds for per_round in timings.values()), timings
    measuring.report(benchmark, measuring.Measurement(stock, [measuring.Probe() for _ in stock]))
    for entry, per_round in timings.items():
        design = _design(entry)
        ratio = intervals.summary([call / batch for call, batch in zip(per_round, stock, strict=True)])
        row = dict(**entries.design_fields(design), flavour="dataloader_iter", world_size=world, backend="gloo",
                   t_call_us=measuring.rounded(statistics.median(per_round) * 1e6, 1),
                   t_regular_us=measuring.rounded(statistics.median(stock) * 1e6, 1),
                   overhead_vs_regular=ratio["value"], overhead_vs_regular_interval=ratio["interval"],
                   timed_batches=batches - SKIP - 1, rounds=rounds)
        bench.record(benchmark, "S7", row)


def _design(entry: str) -> Design:
    return next(design for design in DESIGNS.values() if design.id == entry)
