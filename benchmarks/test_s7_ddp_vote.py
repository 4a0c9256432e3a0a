"""S7 a step call under DDP: what a `dataloader_iter` step call costs against a batch of stock's regular flavour.

Under DDP a design that counts batches votes on the end of data between two step calls. The recommended design
(``patched``) votes with one all-reduce after each call in place of stock's SIGTERM broadcast: a plain all-reduce
waits for every rank, where the broadcast's root does not. The prototypes carry the vote in DDP's gradient
all-reduce of the call's backward (``prototypes.ranks.VoteInGradients``). Measured on
``WORLD_SIZES`` CPU ranks on gloo (forked processes on this machine, as ``tests/conformance/ddp.py`` launches them):
in each pair of runs two worlds run at once, one fitting stock Lightning's regular flavour and one a design's
flavour as it ships (one batch per call; ``STEPS``: the S3 step, a Linear layer with batch of 1, and the same step
with about 20 ms of compute, the one the target judges); rank r of both worlds shares one
core, and the worlds take turns call by call (``lockstep_worlds``), so both meet the machine as it is at that
moment. Rank 0 times each world's calls over its steady-state window. The ratio per pair (the design's time per call
over stock's time per batch) gives the median and its 95 % interval; the S7 target judges it at 2 ranks. Larger
worlds run the recommended design only, in its own environment (``BENCHMARKS_RESULTS`` names its results file):
with more processes than cores each rank waits for the scheduler as much as for its peers, so they show the trend,
not the cost a cluster would see.

A control, shown and not judged, splits the recommended design's cost at 2 ranks: the same build, its vote (one int,
as the broadcast sends) sent as stock's broadcast from rank 0 (``vote_as_broadcast``). A broadcast cannot carry the
other ranks' states, so nothing ships this way; what it leaves is the call's cost without the all-reduce's wait for
every rank.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from benchmarks import entries, intervals, lockstep, measuring, workloads
from harness_common import QUIET, rendezvous
from prototypes import DESIGNS, RECOMMENDED, runnable_designs
from prototypes.common import Design
from prototypes.patched import installed_series

pytestmark = [
    pytest.mark.benchmark(group="S7 a step call under DDP (time per call)", timer=measuring.span_clock),
    pytest.mark.timeout(1800),
]

WORLD_SIZES = (2, 4, 8)
STOCK_REGULAR = "stock regular"
VOTE_AS_BROADCAST = "vote as a broadcast"  # the control: the recommended design's vote sent as stock's broadcast
SKIP = 10  # calls before each fit's timed window
PG_TIMEOUT_S = 120  # a collective blocked this long raises on its rank (eight ranks share two cores)


# The steps S7 measures: the S3 step (a Linear layer, batch of 1), whose time is mostly the loop's and the
# collectives', and the same step with about 20 ms of compute on one thread, a step the vote's all-reduce is small
# beside; the target judges the latter.
STEPS = ("tiny", "20ms")
COMPUTE_S = 0.020
MATRIX = 256  # the compute: products of a MATRIX x MATRIX buffer, which no gradient flows through


def calibrated_work(seconds: float = COMPUTE_S) -> int:
    """How many matrix products take ``seconds`` on one thread of this machine (the ranks run on one thread each)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        matrix, products, start = torch.randn(MATRIX, MATRIX) / MATRIX**0.5, 0, time.perf_counter()
        while time.perf_counter() - start < 0.25:
            torch.tanh(matrix @ matrix)
            products += 1
        return max(1, round(seconds / ((time.perf_counter() - start) / products)))
    finally:
        torch.set_num_threads(threads)


class TinyStep(pl.LightningModule):
    """The S3 step: a Linear layer, batch of 1, after ``work`` matrix products (0: the tiny step). Each call's start
    is a receipt of ``lockstep.Turns``, which ends this rank's turn (it reads ``received_at`` and
    ``produced_off_main``: no batch here comes from a thread)."""

    def __init__(self, turns: lockstep.Turns, work: int = 0) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.register_buffer("matrix", torch.randn(MATRIX, MATRIX) / MATRIX**0.5)
        self.turns = turns
        self.work = work
        self.received_at: list[float] = []
        self.produced_off_main = 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        now = time.perf_counter()
        self.received_at.append(now)
        self.turns.received(self, now)
        product = self.matrix
        for _ in range(self.work):
            product = torch.tanh(product @ self.matrix)
        return self.layer(batch).pow(2).mean()


class RegularTinyStep(TinyStep):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.loss(batch)


class IterTinyStep(TinyStep):
    def training_step(self, dataloader_iter) -> torch.Tensor:
        batch, _, _ = next(dataloader_iter)
        return self.loss(batch)


def _entries(world: int) -> dict[str, Callable[..., pl.Trainer]]:
    """What a world size runs: stock's regular flavour, then each design's shipped flavour. In the patched
    environment only the recommended design runs, at every world size (a prototype there would run on a changed
    Lightning), and at 2 ranks its control; elsewhere the runnable designs run at 2 ranks."""
    if installed_series() is not None:
        recommended = DESIGNS[RECOMMENDED]
        control = {VOTE_AS_BROADCAST: recommended.trainer} if world == 2 else {}
        return {STOCK_REGULAR: pl.Trainer, recommended.id: recommended.trainer, **control}
    designs = list(runnable_designs().values()) if world == 2 else []
    return {STOCK_REGULAR: pl.Trainer, **{design.id: design.trainer for design in designs}}


def vote_as_broadcast() -> None:
    """In this process, sends the patched loop's vote (one int, reduced by MAX) as stock's broadcast from
    rank 0 instead: every other collective is left alone. For the control only."""
    all_reduce = torch.distributed.all_reduce

    def vote_or_all_reduce(tensor: torch.Tensor, op: Any = torch.distributed.ReduceOp.SUM, group: Any = None,
                           async_op: bool = False) -> Any:
        if tensor.dtype == torch.int and tensor.numel() == 1 and op == torch.distributed.ReduceOp.MAX:
            return torch.distributed.broadcast(tensor, src=0, group=group, async_op=async_op)
        return all_reduce(tensor, op=op, group=group, async_op=async_op)

    torch.distributed.all_reduce = vote_or_all_reduce


def _rank(entry: str, rank: int, world: int, port: int, batches: int, turns: tuple, finished: Any, writer: Any,
          out: str, work: int) -> None:
    """One rank of one world: fits ``entry``'s flavour, taking turns with the same rank of the other world on its
    core; sends its mean period (seconds per call) or the error."""
    mine: lockstep.Turns | None = None
    outcome: tuple[str, Any]
    try:
        if hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[rank % len(cores)]})
        torch.set_num_threads(1)
        rendezvous.join(port, rank, world, PG_TIMEOUT_S)
        mine = lockstep.Turns(*turns)
        data = DataLoader(torch.randn(batches * world, 1, 8), batch_size=None)  # Lightning shards it per rank
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
        trainer = _entries(world)[entry](**{**QUIET, "devices": world, "strategy": strategy, "default_root_dir": out})
        module = (RegularTinyStep if entry == STOCK_REGULAR else IterTinyStep)(mine, work)
        if entry == VOTE_AS_BROADCAST:
            vote_as_broadcast()  # a forked rank: the parent's torch is left alone
        with workloads.quiet():
            trainer.fit(module, train_dataloaders=data)
        if not mine.periods:
            raise AssertionError(f"rank {rank} of {entry!r} timed no call after the first {SKIP}")
        outcome = ("ok", statistics.fmean(mine.periods))
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which raises it)
        outcome = ("error", f"{entry!r} rank {rank}: " + "".join(traceback.format_exception(error)))
        turns[3].abort()  # the other world's rank waiting at the window's start fails at once
        turns[2].ranks_received.abort()  # and so do this world's ranks waiting to hand over
    finally:
        finished.set()
        turns[2].counterpart.release()  # the other world's rank may wait for a turn this one will never give
    writer.send(outcome)
    writer.close()
    os._exit(0)  # Why: a forked child of pytest must not run the parent's exit handlers


class _HandOver:
    """How a rank ends its world's turn (``lockstep.Turns`` calls ``release``): once every rank of its world has
    received its batch, each releases its counterpart in the other world. Why together: a world whose ranks started
    their turns apart would count, in the first collective of the call, a skew the other world left."""

    def __init__(self, ranks_received: Any, counterpart: Any) -> None:
        self.ranks_received, self.counterpart = ranks_received, counterpart

    def release(self) -> None:
        self.ranks_received.wait(timeout=lockstep.LOCKSTEP_TIMEOUT_S)
        self.counterpart.release()


def lockstep_worlds(first: str, second: str, world: int, batches: int, out: Path, deadline_s: float, work: int = 0
                    ) -> tuple[float, float]:
    """Two DDP worlds of ``world`` ranks at once, ``first`` and ``second``, rank r of each pinned to the same core
    and taking turns with the other call by call (``first`` starts), each step doing ``work`` matrix products;
    returns rank 0's seconds per call of each.

    Why lockstep: rounds run one after the other drift with the machine by more than the cost S7 judges (a
    round-to-round spread of tens of percent on this machine); taking turns call by call gives both worlds the same
    machine at the same moment. A call's period includes its collectives, and so its wait for the peer rank, which
    takes its turn when its own counterpart hands it over.
    """
    context = multiprocessing.get_context("fork")
    semaphores = [[context.Semaphore(0) for _ in range(world)] for _ in range(2)]
    finished = [[context.Event() for _ in range(world)] for _ in range(2)]
    starts = [context.Barrier(2) for _ in range(world)]
    received = [context.Barrier(world) for _ in range(2)]
    with rendezvous.stores(2) as ports:  # listening before any rank starts, until every rank is gone
        procs, readers = [], []
        for (me, entry), port in zip(enumerate((first, second)), ports, strict=True):
            for rank in range(world):
                hand_over = _HandOver(received[me], semaphores[1 - me][rank])
                turns = (SKIP, semaphores[me][rank], hand_over, starts[rank], finished[1 - me][rank], me == 0)
                reader, writer = context.Pipe(duplex=False)
                procs.append(context.Process(target=_rank, daemon=True, args=(
                    entry, rank, world, port, batches, turns, finished[me][rank], writer, str(out), work)))
                readers.append((reader, writer))
        outcomes = []
        try:
            for proc in procs:
                proc.start()
            deadline = time.monotonic() + deadline_s
            for reader, writer in readers:
                writer.close()
                waited = reader.poll(max(0.0, deadline - time.monotonic()))
                hung = ("error", f"no result within {deadline_s:.0f} s (a hang?)")
                outcomes.append(reader.recv() if waited else hung)
        finally:
            for proc in procs:
                proc.join(max(0.0, 10.0))
                if proc.is_alive():
                    proc.kill()
                    proc.join(10)
    errors = [value for kind, value in outcomes if kind == "error"]
    if errors:
        raise AssertionError(f"the {world}-rank S7 lockstep failed:\n" + "\n".join(errors))
    return outcomes[0][1], outcomes[world][1]  # rank 0 of each world


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("world", WORLD_SIZES)
def test_s7_step_call_under_ddp(benchmark, bench, tmp_path: Path, world: int, step: str) -> None:
    rounds = max(bench.sizes.rounds, intervals.MIN_ROUNDS) if bench.measuring else 1
    if world > 2 and not bench.measuring:
        pytest.skip("larger worlds are measured in benchmark mode only; the smoke run launches 2 ranks")
    if step != STEPS[0] and not bench.measuring:
        pytest.skip("the step with compute is measured in benchmark mode only; the smoke run takes the tiny step")
    batches = bench.sizes.s3_batches + SKIP
    work = calibrated_work() if step != STEPS[0] else 0
    deadline_s = 120 + 2 * batches + (4 * COMPUTE_S * batches if work else 0)  # two worlds take turns per call
    designs = [entry for entry in _entries(world) if entry != STOCK_REGULAR]
    if not designs:
        pytest.skip(f"{world} ranks run the recommended design only, in its environment ({RECOMMENDED!r})")
    stock: dict[str, list[float]] = {entry: [] for entry in designs}
    calls: dict[str, list[float]] = {entry: [] for entry in designs}
    for round_index in range(rounds):
        for entry in designs:  # rounds alternate which world takes the first turn
            if round_index % 2 == 0:
                stock_s, call_s = lockstep_worlds(STOCK_REGULAR, entry, world, batches, tmp_path, deadline_s, work)
            else:
                call_s, stock_s = lockstep_worlds(entry, STOCK_REGULAR, world, batches, tmp_path, deadline_s, work)
            stock[entry].append(stock_s)
            calls[entry].append(call_s)
    every_stock = [s for per_round in stock.values() for s in per_round]
    measuring.report(benchmark, measuring.Measurement(every_stock, [measuring.Probe() for _ in every_stock]))
    for entry, per_round in calls.items():
        ratio = intervals.summary([call / batch for call, batch in zip(per_round, stock[entry], strict=True)])
        fields = (entries.design_fields(_design(entry)) if entry != VOTE_AS_BROADCAST else
                  dict(design=DESIGNS[RECOMMENDED].id, role="control", configuration=VOTE_AS_BROADCAST))
        row = dict(**fields, flavour="dataloader_iter", world_size=world, step=step,
                   backend="gloo",
                   t_call_us=measuring.rounded(statistics.median(per_round) * 1e6, 1),
                   t_regular_us=measuring.rounded(statistics.median(stock[entry]) * 1e6, 1),
                   overhead_vs_regular=ratio["value"], overhead_vs_regular_interval=ratio["interval"],
                   timed_batches=batches - SKIP - 1, rounds=rounds)
        bench.record(benchmark, "S7", row)


def _design(entry: str) -> Design:
    return next(design for design in DESIGNS.values() if design.id == entry)
