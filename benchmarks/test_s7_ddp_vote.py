"""S7 the DDP end-of-data vote: what the ranks' agreement on the end of data costs per step call, on 2-rank gloo.

Under DDP a design that counts batches votes before each step call on whether every rank still has a batch
(``prototypes.common.every_rank_has_a_batch``: an all-reduce of one flag and a host sync), with more than one rank
(``end_of_data_vote_needed``). Two CPU ranks on gloo (forked, as
``tests/conformance/ddp.py`` launches them) each run a real Trainer's fit with stock Lightning's DDP strategy; on
the first training batch, with the process group up, rank 0 times rounds of ``VOTES`` calls of the vote, and the
fit then times its tiny step (the S3 model: a Linear layer, batch of 1) over a steady-state window, so the vote's
cost is shown against the step it would be added to. The vote is the design's real function on the real Trainer.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import statistics
import time
from datetime import timedelta
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader

from benchmarks import intervals, measuring, workloads
from harness_common import QUIET
from prototypes.common import every_rank_has_a_batch

pytestmark = [
    pytest.mark.benchmark(group="S7 DDP end-of-data vote (time per vote)", timer=measuring.span_clock),
    pytest.mark.timeout(300),
]

WORLD = 2
VOTES = 200  # votes per round: one round's time divided by this is one vote's cost
LAUNCH_DEADLINE_S = 240


class VotingModule(pl.LightningModule):
    """The S3 step (tiny Linear, regular flavour); its first batch, on rank 0, times rounds of the vote."""

    def __init__(self, rounds: int, batches: int, out: Path) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)
        self.rounds, self.batches, self.out = rounds, batches, out
        self.vote_s: list[float] = []
        self.received_at: list[float] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            for _ in range(self.rounds):  # every rank votes alike: the all-reduce needs both
                start = time.perf_counter()
                for _ in range(VOTES):
                    every_rank_has_a_batch(self.trainer, True)
                self.vote_s.append((time.perf_counter() - start) / VOTES)
        self.received_at.append(time.perf_counter())
        return self.layer(batch).pow(2).mean()

    def on_train_end(self) -> None:
        if self.global_rank == 0:
            skip = min(4, len(self.received_at) - 2)
            step_s = (self.received_at[-1] - self.received_at[skip]) / (len(self.received_at) - 1 - skip)
            self.out.write_text(json.dumps(dict(vote_s=self.vote_s, step_s=step_s)))


def _rank(rank: int, port: int, rounds: int, batches: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), NODE_RANK="0",
                      LOCAL_RANK=str(rank), RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60))
    trainer = pl.Trainer(**{**QUIET, "devices": WORLD, "strategy": strategy, "default_root_dir": out})
    data = DataLoader(torch.randn(batches * WORLD, 1, 8), batch_size=None)  # Lightning shards it per rank
    with workloads.quiet():
        trainer.fit(VotingModule(rounds, batches, Path(out) / "rank0.json"), train_dataloaders=data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_votes(rounds: int, batches: int, out: Path) -> dict:
    """Launch the two ranks, wait for them (killing them at the deadline), return rank 0's timings."""
    context = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [context.Process(target=_rank, args=(rank, port, rounds, batches, str(out))) for rank in range(WORLD)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + LAUNCH_DEADLINE_S
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(10)
    result = out / "rank0.json"
    if not result.exists():
        raise AssertionError(f"the 2-rank vote benchmark reported nothing (exit codes {[p.exitcode for p in procs]})")
    return json.loads(result.read_text())


def test_s7_ddp_vote(benchmark, bench, tmp_path: Path) -> None:
    rounds = bench.sizes.rounds
    batches = bench.sizes.s3_batches
    timings = measure_votes(rounds, batches, tmp_path)
    assert len(timings["vote_s"]) == rounds
    probes = [measuring.Probe() for _ in timings["vote_s"]]
    measuring.report(benchmark, measuring.Measurement(timings["vote_s"], probes))
    vote_us = intervals.summary([s * 1e6 for s in timings["vote_s"]], digits=2)
    step_us = timings["step_s"] * 1e6
    row = dict(design="every_rank_has_a_batch", role="design", flavour="regular", world_size=WORLD, backend="gloo",
               votes_per_round=VOTES, vote_us=vote_us["value"], vote_us_interval=vote_us["interval"],
               tiny_step_us=measuring.rounded(step_us, 1),
               vote_share_of_tiny_step=measuring.rounded(statistics.median(timings["vote_s"]) / timings["step_s"]),
               rounds=rounds)
    bench.record(benchmark, "S7", row)
