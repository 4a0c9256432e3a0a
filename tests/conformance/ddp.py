"""The DDP launcher of the C16 clause (``test_c16_distributed.py``): two CPU ranks on gloo, each reporting its outcome.

How a run is launched. The test starts the two ranks itself, as ``torchrun`` or SLURM would: two processes
(forked from the test process, which has torch and Lightning imported already, so a launch costs no re-import),
each joining its world's process group on a store the launcher listens on (``harness_common.rendezvous``)
and with ``LOCAL_RANK``/``WORLD_SIZE``/``MASTER_*`` set, each building its own Trainer through the design with
``accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo")``. Lightning sees that the
processes were created externally and starts none of its own. Compared with ``strategy="ddp_spawn"`` this lets
every rank report its own outcome (what it received, its counters and weights, the exception it raised) as JSON in
a temp dir, and lets the test kill a rank that does not finish: a hang fails the test within its timeout instead
of blocking the suite, and no rank process outlives the test.

A rank exits once its fits are done, as under torchrun, so a rank left waiting in a collective for it fails at
once on the closed connection; a collective that waits longer than ``PG_TIMEOUT_S`` raises on its rank (the process
group's timeout); a rank still running at the launch deadline has its Python stack dumped (faulthandler on SIGUSR1)
into the failure message and is killed.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from harness_common import rendezvous
from tests.conformance.harness import BATCH_SIZE, FEATURES, LR, QUIET, IterStepModule, SizedItems, collate_items, item
from tests.conformance.pipeline_parallel import MICRO_BATCHES, PIPELINE_ITEMS, PipelineStageModule
from tests.conformance.pipelining import AsyncHandleModule

WORLD = 2
# A passing launch takes 1-3 s; these bound a failing one.
PG_TIMEOUT_S = 15  # a collective blocked this long raises on its rank (the process group's timeout)
LAUNCH_DEADLINE_S = 30  # a rank still running this long after the launch is reported as hung and killed
TEST_TIMEOUT_S = LAUNCH_DEADLINE_S + 30  # pytest-timeout's backstop, beyond the launch deadline and the cleanup

# (a) 15 sized items the ranks share, in two ways: Lightning injects its DistributedSampler into a plain loader
# ("injected": Lightning always shuffles a training loader's injected sampler, seed 0), or the user passes
# DistributedSampler(shuffle=False) ("explicit", kept by Lightning). 15 items do not split evenly, so the sampler
# pads one shard by repeating the first index: 8 items = 4 batches of 2 on each rank.
SHARED_ITEMS = 15
PATTERNS = [(1,), (2,)]  # next() calls per step; both divide the 4 batches per rank evenly

# (c) equal shards, unequal calls: Lightning's DistributedSampler gives each rank 4 of the 8 batches, and the step
# takes ``UNEQUAL_CALLS_PATTERN[rank]`` batches per call (a data-dependent micro-batch count, as sequence packing
# gives), so rank 1's data ends after 2 calls while rank 0 has 2 batches left.
UNEQUAL_CALLS = "unequal-calls"
UNEQUAL_CALLS_ITEMS = 16
UNEQUAL_CALLS_PATTERN = (1, 2)

# (d) equal shards ("explicit": 4 batches per rank, in order), a step that pulls ahead on rank 0 (Lightning's
# async-handle pattern: it holds one batch at the end of its data, which it reaches a call early) and a simple step
# on rank 1 (holds none): rank 0 trains what it holds in a drain call while rank 1 trains its last batch.
HELD_ON_ONE_RANK = "held-on-one-rank"

# (b) an IterableDataset sharded unevenly by rank: rank 0 has 4 batches, rank 1 has 2 (whole steps for 1 and 2
# batches per step, so the ranks differ by whole steps, not by a step cut short).
UNEVEN_SHARDS = {0: range(0, 8), 1: range(8, 12)}


class RankShardedItems(IterableDataset):
    """Yields the current rank's shard of ``UNEVEN_SHARDS``; the rank is read when iteration starts."""

    def __iter__(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        return (item(i) for i in UNEVEN_SHARDS[rank])


def sampler_shard_batches(kind: str, rank: int) -> list[tuple[int, ...]]:
    """Rank ``rank``'s batches, computed independently of any design: its DistributedSampler shard, batched."""
    # what Lightning's injected sampler does for training: shuffle, seed 0 unless PL_GLOBAL_SEED
    shuffle = kind in ("injected", UNEQUAL_CALLS)
    items = UNEQUAL_CALLS_ITEMS if kind == UNEQUAL_CALLS else SHARED_ITEMS
    sampler = DistributedSampler(SizedItems(items), num_replicas=WORLD, rank=rank, shuffle=shuffle, seed=0)
    sampler.set_epoch(0)
    indices = list(sampler)
    return [tuple(indices[i : i + BATCH_SIZE]) for i in range(0, len(indices), BATCH_SIZE)]


def uneven_shard_batches(rank: int) -> list[tuple[int, ...]]:
    indices = list(UNEVEN_SHARDS[rank])
    return [tuple(indices[i : i + BATCH_SIZE]) for i in range(0, len(indices), BATCH_SIZE)]


# --------------------------------------------------------------------------------------------------- the ranks
def _loader(kind: str, rank: int) -> DataLoader:
    if kind == "injected":  # Lightning replaces the sequential sampler with its DistributedSampler
        return DataLoader(SizedItems(SHARED_ITEMS), batch_size=BATCH_SIZE)
    if kind == "explicit":  # the user's own DistributedSampler, which Lightning keeps
        dataset = SizedItems(SHARED_ITEMS)
        sampler = DistributedSampler(dataset, num_replicas=WORLD, rank=rank, shuffle=False)
        return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    if kind == PIPELINE_PARALLEL:
        return DataLoader(SizedItems(PIPELINE_ITEMS), batch_size=BATCH_SIZE)
    if kind == UNEQUAL_CALLS:  # Lightning injects its DistributedSampler
        return DataLoader(SizedItems(UNEQUAL_CALLS_ITEMS), batch_size=BATCH_SIZE)
    assert kind == "uneven", kind
    return DataLoader(RankShardedItems(), batch_size=BATCH_SIZE)


def describe_error(error: BaseException) -> dict[str, Any]:
    return dict(
        type=f"{type(error).__module__}.{type(error).__qualname__}",
        message=str(error)[:2000],
        collective=_is_collective_failure(error),
        # where it was raised: the innermost frames in Lightning, the designs or this suite, one line each
        where=[f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} in {f.name}"
               for f in traceback.extract_tb(error.__traceback__)
               if any(part in f.filename for part in ("pytorch_lightning", "prototypes", "tests"))][-4:],
    )


def _is_collective_failure(error: BaseException) -> bool:
    """A process-group failure (timeout, peer gone), as opposed to an error a design raised on purpose."""
    dist_error = getattr(torch.distributed, "DistError", ())
    text = f"{type(error).__name__}: {error}".lower()
    return isinstance(error, dist_error) or any(marker in text for marker in _COLLECTIVE_FAILURE_MARKERS)


_COLLECTIVE_FAILURE_MARKERS = (
    "gloo", "timed out", "timeout", "pair closure", "connection closed", "connection reset", "broken pipe",
)


def _fit_on_rank(design, rank: int, kind: str, pattern: tuple[int, ...]) -> dict[str, Any]:
    pipelined = kind == PIPELINE_PARALLEL  # C19: each rank is a pipeline stage, and every stage reads all the data
    if pipelined:
        module = PipelineStageModule(rank)
    elif kind == HELD_ON_ONE_RANK:
        module = AsyncHandleModule() if rank == 0 else IterStepModule(pattern)
    else:  # an unequal-calls pattern names each rank's batches per call
        module = IterStepModule((pattern[rank],) if kind == UNEQUAL_CALLS else pattern)
    error, trainer = None, None
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
            trainer = design.trainer(**{**QUIET, "accelerator": "cpu", "devices": WORLD, "strategy": strategy,
                                        "use_distributed_sampler": not pipelined})
            trainer.fit(module, train_dataloaders=_loader("explicit" if kind == HELD_ON_ONE_RANK else kind, rank))
        except BaseException as raised:  # noqa: BLE001 - every outcome is reported to the test process
            error = describe_error(raised)
    outcome = rank_outcome(module, trainer, error)
    outcome.update(warnings=[str(w.message) for w in warned])
    if pipelined:
        outcome.update(stage_weights=module.weights(), stage_initial=module.initial_weights)
    return outcome


def rank_outcome(module, trainer, error: dict | None) -> dict[str, Any]:
    """What a rank observed: the batches its steps received, its counters and weights, and the error it raised."""
    return dict(
        error=error,
        steps=[[list(ids_), batch_idx, dl_idx] for step in module.record.steps for ids_, batch_idx, dl_idx in step],
        per_step=[len(step) for step in module.record.steps],
        step_calls=module.step_calls,
        global_step=None if trainer is None else trainer.global_step,
        optimizer_steps=sum(getattr(o, "steps_taken", 0) for o in (trainer.optimizers if trainer else [])),
        weights={k: v.tolist() for k, v in module.layer.state_dict().items()},
        initial={k: v.tolist() for k, v in module.initial_state.items()},
        # a pipelining step's batches in the order it trained them (one per call), where they differ from received
        trained=[list(batch) for epoch in getattr(module, "trained", []) for batch in epoch],
    )


def _result_path(outdir: str, run: tuple, rank: int) -> Path:
    kind, pattern = run
    return Path(outdir) / f"{kind}-{'-'.join(map(str, pattern))}-rank{rank}.json"


def _rank_main(rank: int, port: int, design, runs: list[tuple], outdir: str, fit=_fit_on_rank) -> None:
    """One rank of one process group: ``fit(design, rank, *run)`` per run, each outcome written as JSON the moment
    it is known."""
    # Why: a rank is forked from the test process, whose heap grows over a suite run; without this, every garbage
    # collection in the rank walks (and so copies, page by page) that inherited heap. Late in a full run C19's
    # two-stage Megatron launch took over 30 s this way, 3 s when run alone.
    gc.freeze()
    # the injected sampler's seed is PL_GLOBAL_SEED (0 when unset): a seed_everything() elsewhere in this pytest
    # process must not change the shard the test expects
    os.environ.pop("PL_GLOBAL_SEED", None)
    torch.set_num_threads(1)  # as Lightning's own launchers do with 2 processes on 2 cores
    stack_file = open(Path(outdir) / f"stack-{port}-{rank}.txt", "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # Why the rank's own file for its output: a rank that dies (a C++ abort in a collective) leaves only what it
    # printed, and forked ranks would otherwise write into whichever test's capture is running; faulthandler adds the
    # Python stacks of a fatal signal to it
    output = open(Path(outdir) / f"output-{port}-{rank}.txt", "w", buffering=1)  # noqa: SIM115 - the rank's
    for fd in (1, 2):
        os.dup2(output.fileno(), fd)
    sys.stdout = sys.stderr = output  # pytest's capture replaced them in the test process
    faulthandler.enable(file=output, all_threads=True)
    rendezvous.join(port, rank, WORLD, PG_TIMEOUT_S)
    for run in runs:
        outcome = fit(design, rank, *run)
        path = _result_path(outdir, run, rank)
        path.with_suffix(".tmp").write_text(json.dumps(outcome))
        path.with_suffix(".tmp").rename(path)
    # Why exit here rather than return: the process's own teardown (multiprocessing's exit, its threads, the
    # destruction of the process groups) is not under test, and it is where a slow rank spends its last seconds.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------------- the launch
def launch(design, groups: list[list[tuple]], fit=_fit_on_rank, deadline_s: float = LAUNCH_DEADLINE_S
           ) -> dict[tuple, dict]:
    """Start one process group of ``WORLD`` ranks per entry of ``groups`` (all at once); each group's ranks run its
    ``(loader kind, pattern)`` fits one after another, each ``fit(design, rank, kind, pattern)`` returning the rank's
    outcome. Returns ``{run: {"ranks": [outcome or None, ...], "hung": {rank: stack}, "exitcodes": [...]}}``.

    Never blocks past ``deadline_s``: a rank still running then has its stack captured and is killed, and every
    rank process is gone when this returns or raises (pytest-timeout's exception included).
    """
    context = multiprocessing.get_context("fork")  # torch and Lightning are imported already: no re-import
    with tempfile.TemporaryDirectory(prefix="c16-") as outdir, rendezvous.stores(len(groups)) as ports:
        procs = {
            (g, rank): context.Process(target=_rank_main, args=(rank, ports[g], design, runs, outdir, fit))
            for g, runs in enumerate(groups)
            for rank in range(WORLD)
        }
        hung: dict[tuple[int, int], str] = {}
        try:
            for proc in procs.values():
                proc.start()
            deadline = time.monotonic() + deadline_s
            for proc in procs.values():
                proc.join(max(0.0, deadline - time.monotonic()))
            alive = {key: proc for key, proc in procs.items() if proc.is_alive()}
            for proc in alive.values():
                os.kill(proc.pid, signal.SIGUSR1)  # faulthandler dumps every thread's stack
            if alive:
                time.sleep(1.0)
            for (g, rank) in alive:
                stack = (Path(outdir) / f"stack-{ports[g]}-{rank}.txt").read_text()
                hung[g, rank] = trim_stack(stack) or "(no stack dumped)"
        finally:
            for proc in procs.values():
                if proc.pid is not None and proc.is_alive():
                    proc.kill()
            for proc in procs.values():
                if proc.pid is not None:
                    proc.join(10)
        results = {}
        for g, runs in enumerate(groups):
            for run in runs:
                results[run] = dict(
                    ranks=[
                        json.loads(path.read_text()) if (path := _result_path(outdir, run, rank)).exists() else None
                        for rank in range(WORLD)
                    ],
                    hung={rank: hung[g, rank] for rank in range(WORLD) if (g, rank) in hung},
                    exitcodes=[procs[g, rank].exitcode for rank in range(WORLD)],
                    output=[_tail(Path(outdir) / f"output-{ports[g]}-{rank}.txt") for rank in range(WORLD)],
                    deadline_s=deadline_s,
                )
        return results


def _tail(path: Path, lines: int = 80) -> str:
    """The last ``lines`` a rank printed (its warnings, a C++ abort's message, faulthandler's stacks cut below
    ``_rank_main``)."""
    return "\n".join(trim_stack(path.read_text(errors="replace")).splitlines()[-lines:]) if path.exists() else ""


def trim_stack(dump: str) -> str:
    """faulthandler's dump, each thread cut below ``_rank_main`` (a forked rank still has the test's frames)."""
    kept, frames, below_rank_main = [], 0, False
    for line in dump.splitlines():
        if not line.startswith(" "):  # "Thread 0x... (most recent call first):"
            kept.append(line)
            frames, below_rank_main = 0, False
        elif not below_rank_main and frames < 20:
            kept.append(line)
            frames += 1
            below_rank_main = "in _rank_main" in line
    return "\n".join(kept)


SHARED_KINDS = ["injected", "explicit"]
# Two launches per design: the shared-data fits in sequence on one process group; the uneven fits each on their
# own process group (one that breaks must not take the other down), both groups at once.
PIPELINE_PARALLEL = "pipeline-parallel"
LAUNCHES = {
    "shared": [[(kind, pattern) for kind in SHARED_KINDS for pattern in PATTERNS]],
    UNEQUAL_CALLS: [[(UNEQUAL_CALLS, UNEQUAL_CALLS_PATTERN)]],
    HELD_ON_ONE_RANK: [[(HELD_ON_ONE_RANK, (1,))]],
    "uneven": [[("uneven", pattern)] for pattern in PATTERNS],
    PIPELINE_PARALLEL: [[(PIPELINE_PARALLEL, (MICRO_BATCHES,))]],
}
_RESULTS: dict[tuple[str, str], dict] = {}


def run_outcome(design, kind: str, pattern: tuple[int, ...]) -> dict:
    """The ranks' outcomes for one fit; the launch that contains it runs (once per design) on first use."""
    name = kind if kind in LAUNCHES else "shared"
    if (design.id, name) not in _RESULTS:
        _RESULTS[design.id, name] = launch(design, LAUNCHES[name])
    return _RESULTS[design.id, name][kind, pattern]


def summary(run: dict) -> str:
    lines = []
    for rank, outcome in enumerate(run["ranks"]):
        if rank in run["hung"]:
            state = "its fit returned, but its process" if outcome is not None else "it"
            deadline_s = run.get("deadline_s", LAUNCH_DEADLINE_S)
            lines.append(f"  rank {rank}: {state} was still running after {deadline_s} s (killed); its stack:\n"
                         + _indent(run["hung"][rank]))
        elif outcome is None:
            code = run["exitcodes"][rank]  # None under ddp_spawn, where Lightning owns the processes
            lines.append(
                f"  rank {rank}: reported nothing" + (f" (process exit code {code})" if code is not None else "")
            )
            lines += last_output(run, rank)
        else:
            error = outcome["error"]
            what = "finished" if error is None else f"raised {error['type']}: {error['message'][:300]}"
            counters = (f"; step calls {outcome['step_calls']}, batches per step {outcome['per_step']}, global_step"
                        f" {outcome['global_step']}, optimizer steps {outcome['optimizer_steps']}"
                        if "step_calls" in outcome else "")
            lines.append(f"  rank {rank}: {what}{counters}")
            if error is not None:
                lines.append("      raised at: " + " <- ".join(reversed(error["where"])))
    if run.get("error"):
        lines.append("  the launch raised: " + run["error"])
    return "\n".join(lines)


def last_output(run: dict, rank: int) -> list[str]:
    """What a rank that reported nothing printed last, as lines of a failure message (none if it printed nothing)."""
    output = run.get("output", [""] * WORLD)[rank]
    return ["      its last output:\n" + _indent(output)] if output else []


def _indent(text: str) -> str:
    return "\n".join("      " + line for line in text.rstrip().splitlines())


def require_all_reported(run: dict) -> list[dict]:
    if run["hung"] or any(outcome is None for outcome in run["ranks"]):
        pytest.fail("a rank did not finish its fit:\n" + summary(run), pytrace=False)
    return run["ranks"]


def received_batches(outcome: dict) -> list[tuple[int, ...]]:
    return [tuple(ids_) for ids_, _, _ in outcome["steps"]]


def reference_ddp_weights(outcomes: list[dict], batches_per_call: list[int]) -> dict[str, torch.Tensor]:
    """Plain PyTorch DDP semantics: each step averages the ranks' gradients of their own step losses, then SGD; rank
    r's steps take ``batches_per_call[r]`` of the batches it received each."""
    per_rank = [
        [received_batches(o)[i : i + per_call] for i in range(0, len(received_batches(o)), per_call)]
        for o, per_call in zip(outcomes, batches_per_call, strict=True)
    ]
    return hand_written_ddp_weights(outcomes[0]["initial"], per_rank)


def hand_written_ddp_weights(initial: dict[str, list], per_rank: list[list[list[tuple[int, ...]]]]
                             ) -> dict[str, torch.Tensor]:
    """The loop written by hand: per step, every rank's loss over its batches of that step (``per_rank[r][step]``),
    the gradients averaged over the ranks, then SGD."""
    layer = torch.nn.Linear(FEATURES, 1)
    layer.load_state_dict({k: torch.tensor(v) for k, v in initial.items()})
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    for step in zip(*per_rank, strict=True):
        losses = []
        for batches in step:
            tensors = [collate_items([item(i) for i in batch]) for batch in batches]
            losses.append(torch.stack([torch.nn.functional.mse_loss(layer(x), y) for _, x, y in tensors]).mean())
        optimizer.zero_grad()
        torch.stack(losses).mean().backward()
        optimizer.step()
    return layer.state_dict()


def finished_on_every_rank(kind: str, pattern: tuple[int, ...], design) -> list[dict]:
    run = run_outcome(design, kind, pattern)
    outcomes = require_all_reported(run)
    failed = [rank for rank, outcome in enumerate(outcomes) if outcome["error"] is not None]
    assert not failed, f"fit raised on rank(s) {failed}:\n" + summary(run)
    return outcomes
