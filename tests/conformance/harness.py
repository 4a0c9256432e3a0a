"""Shared parts of the conformance suite: self-identifying data, a recording module, a reference loop.

Every item carries its own index, so every batch can be named by the item ids it holds (``ids(batch)``) and a
failure message says which batch went wrong. The modules record what a user can observe (hook calls with the
batch they were given, what ``next(dataloader_iter)`` returned, optimizer steps), never design internals.
"""

from __future__ import annotations

import copy
import gc
import itertools
import math
import re
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate, get_worker_info

from harness_common import QUIET
from prototypes.common import Design

FEATURES = 4
BATCH_SIZE = 2
LR = 0.1

# --------------------------------------------------------------------------------------------------- data
def item(i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Item ``i``: its id, 4 features and a target, all a function of ``i`` so any process can rebuild it."""
    # float32 explicitly: under precision="64-true" Lightning makes float64 the default dtype during fit, and
    # converting the input is the design's job (C4), not the dataset's.
    x = torch.tensor([math.sin(i), math.cos(i), (i % 7) / 7.0, 1.0], dtype=torch.float32)
    return i, x, x.sum(0, keepdim=True) * 0.5


class SizedItems(Dataset):
    """Map-style dataset of ``n`` self-identifying items."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return item(i)


class UnsizedItems(IterableDataset):
    """Iterable dataset without ``__len__``; with workers, worker k yields items k, k+W, k+2W, ..."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (item(i) for i in range(start, self.n, step))


class DatasetBroke(Exception):
    """Raised by :class:`FailingItems`; a type of its own, so the suite can tell it reached the caller unchanged."""


class FailingItems(SizedItems):
    """Sized items whose item ``fail_at`` raises ``error`` (a DatasetBroke by default) when loaded."""

    def __init__(self, n: int, fail_at: int, error: type[BaseException] = DatasetBroke) -> None:
        super().__init__(n)
        self.fail_at, self.error = fail_at, error

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise self.error(f"item {i} cannot be loaded")
        return item(i)


class SlowItems(SizedItems):
    """Sized items; from item ``slow_from`` on, each takes ``delay_s`` to load (a loader still busy when a run ends)."""

    def __init__(self, n: int, slow_from: int, delay_s: float) -> None:
        super().__init__(n)
        self.slow_from, self.delay_s = slow_from, delay_s

    def __getitem__(self, i: int):
        if i >= self.slow_from:
            time.sleep(self.delay_s)
        return item(i)


class ListedBatches(Sampler):
    """A batch sampler whose batches hold ``sizes[k]`` consecutive items: batches of different sizes."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return len(self.sizes)


class UnsizedBatches(IterableDataset):
    """Yields collated batches of ``sizes[k]`` consecutive items, without ``__len__`` (load with
    ``batch_size=None``)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)

    def __iter__(self) -> Iterator:
        return (default_collate([item(i) for i in batch]) for batch in ListedBatches(self.sizes))


def uneven_loader(kind: str, sizes: Sequence[int]) -> DataLoader:
    """A real DataLoader whose batch k holds ``sizes[k]`` items; ``kind`` is ``"sized"`` or ``"unsized"``."""
    if kind == "sized":
        return DataLoader(SizedItems(sum(sizes)), batch_sampler=ListedBatches(sizes))
    return DataLoader(UnsizedBatches(sizes), batch_size=None)


def make_loader(
    kind: str = "sized", n_items: int = 14, num_workers: int = 0, batch_size: int = BATCH_SIZE
) -> DataLoader:
    """A real DataLoader over ``n_items`` items; ``kind`` is ``"sized"`` or ``"unsized"``."""
    dataset = {"sized": SizedItems, "unsized": UnsizedItems}[kind](n_items)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)


def ids(batch: Any) -> tuple[int, ...]:
    """The item ids a batch holds (a collated ``[ids, x, y]`` list, possibly wrapped by the transfer hooks)."""
    if isinstance(batch, dict):
        batch = batch["batch"]
    return tuple(int(i) for i in batch[0].tolist())


def loader_sequence(loader: DataLoader) -> list[tuple[int, ...]]:
    """The loader's own sequence of batches, read directly: what every design must hand out, in order."""
    return [ids(b) for b in loader]


@dataclass(frozen=True)
class Running:
    """The threads and child processes alive at one moment."""

    threads: frozenset
    children: frozenset

    @classmethod
    def now(cls) -> Running:
        return cls(
            frozenset(t for t in threading.enumerate() if t.is_alive()),
            frozenset(p.pid for p in psutil.Process().children(recursive=True)),
        )


# multiprocessing's queue feeders and torch's pin-memory thread, by the names they are created with (a thread that
# is finishing has already dropped its target)
_DATALOADER_THREAD_NAMES = ("QueueFeederThread", "(_pin_memory_loop)")


def _dataloader_machinery(thread: threading.Thread) -> bool:
    """A thread of torch's DataLoader machinery, which torch stops asynchronously, as it does its worker processes."""
    return thread.name.endswith(_DATALOADER_THREAD_NAMES)


def assert_nothing_left(before: Running, grace_s: float = 10.0) -> None:
    """Nothing started since ``before`` is still alive; call it as soon as ``fit``/``validate``/... returned.

    The design's own threads get no grace: one still alive when the run returns may be inside ``next()`` on a loader
    Lightning is tearing down. DataLoader worker processes and the DataLoader's own threads get ``grace_s`` to exit.
    """
    own = sorted(t.name for t in Running.now().threads - before.threads if not _dataloader_machinery(t))
    if own:
        raise AssertionError(f"threads still running when the run returned (a design joins its threads first): {own}")
    deadline = time.monotonic() + grace_s
    while True:
        gc.collect()  # DataLoader workers shut down when their iterator is collected; reference cycles delay that
        now = Running.now()
        threads, children = now.threads - before.threads, now.children - before.children
        if not threads and not children:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"left running after the run: threads {sorted(t.name for t in threads)}, child pids {sorted(children)}"
            )
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------------- trainer
def make_trainer(design: Design, **overrides: Any) -> pl.Trainer:
    """``design.trainer(...)`` with quiet defaults; tests override what they are about."""
    return design.trainer(**{**QUIET, **overrides})


def stock_trainer(**overrides: Any) -> pl.Trainer:
    return pl.Trainer(**{**QUIET, **overrides})


def fit(design: Design, module: pl.LightningModule, loader: DataLoader, val_loader: DataLoader | None = None,
        **overrides: Any) -> pl.Trainer:
    """Fit ``module`` through ``design`` and return the trainer for inspection."""
    trainer = make_trainer(design, **overrides)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val_loader)
    return trainer


# (kind, num_workers) for the loaders a clause must hold for
LOADER_CASES = [
    pytest.param("sized", 0, id="sized-w0"),
    pytest.param("sized", 2, id="sized-w2"),
    pytest.param("unsized", 0, id="unsized-w0"),
    pytest.param("unsized", 2, id="unsized-w2"),
]
KINDS = ["sized", "unsized"]


# --------------------------------------------------------------------------------------------------- modules
class CountingSGD(torch.optim.SGD):
    """SGD that counts its ``step()`` calls: the ground truth for ``global_step``."""

    def __init__(self, params, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.steps_taken = 0

    def step(self, closure=None):
        result = super().step(closure)
        self.steps_taken += 1  # after: a step whose closure raised did not happen
        return result


@dataclass
class Record:
    """What a run let the user observe."""

    events: list[tuple] = field(default_factory=list)
    # one list per step call: (ids, batch_idx, dataloader_idx) of each batch the step received
    steps: list[list[tuple]] = field(default_factory=list)
    done_after_next: list[bool] = field(default_factory=list)
    transfer_trail: list[tuple] = field(default_factory=list)
    placements: list[tuple[torch.device, torch.dtype]] = field(default_factory=list)
    epoch_ends: list[dict] = field(default_factory=list)
    validations: list[tuple[int, int]] = field(default_factory=list)
    drain_calls: int = 0  # step calls entered with `done` True: after the epoch's last batch (C17)

    @property
    def received(self) -> list[tuple[int, ...]]:
        return [b[0] for step in self.steps for b in step]

    def received_in_epochs(self) -> list[list[tuple]]:
        """``(ids, batch_idx)`` of each batch a step received, one list per epoch (a resumed epoch has no start)."""
        per_epoch: list[list[tuple]] = []
        for event in self.events:
            if event[0] == "on_train_epoch_start" or (event[0] == "next" and not per_epoch):
                per_epoch.append([])
            if event[0] == "next":
                per_epoch[-1].append((event[1], event[2]))
        return per_epoch

    def hook_names(self) -> list[str]:
        return [e[0] for e in self.events]


class RecordingModule(pl.LightningModule):
    """Records hooks, batches and optimizer steps; the loss is the mean MSE over the batches the step used.

    ``wrap_transfer=True`` makes the three transfer hooks wrap the batch in a dict carrying the trail of hooks
    it passed, so the step can see whether (and how often) each hook touched what it received.
    """

    def __init__(
        self,
        *,
        automatic: bool = True,
        wrap_transfer: bool = False,
        log_metrics: bool = False,
        log_batch_size: int | None = None,
        stop_epoch_at_step: int | None = None,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(FEATURES, 1)
        self.initial_state = copy.deepcopy(self.layer.state_dict())
        self.automatic_optimization = automatic
        self.wrap_transfer = wrap_transfer
        self.log_metrics = log_metrics
        self.log_batch_size = log_batch_size  # passed as self.log's batch_size=; None: the design infers it (C10)
        self.stop_epoch_at_step = stop_epoch_at_step
        self.record = Record()
        self.step_calls = 0
        self.consumed_in_epoch = 0

    # ---- shared by both flavours
    def receive(self, batch: Any) -> Any:
        """Record how a batch arrived (hook trail, device, dtype) the moment the step gets it; return it unwrapped."""
        if isinstance(batch, dict):
            self.record.transfer_trail.append((ids(batch), tuple(batch["trail"])))
            batch = batch["batch"]
        self.record.placements.append((batch[1].device, batch[1].dtype))
        return batch

    def loss_of(self, batches: Sequence[Any]) -> torch.Tensor | None:
        if not batches:
            return None
        losses = [torch.nn.functional.mse_loss(self.layer(x), y) for _, x, y in batches]
        return torch.stack(losses).mean()

    def finish_step(self, batches: list[Any]) -> Any:
        loss = self.loss_of(batches)
        if self.log_metrics and batches:
            # by default no batch_size=: the design must infer it from what the step consumed (C10)
            value = float(sum(sum(ids(b)) for b in batches))
            self.log("step_ids_sum", value, on_step=True, on_epoch=True, batch_size=self.log_batch_size)
        if self.automatic_optimization or loss is None:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach()

    # ---- hooks
    def on_train_epoch_start(self) -> None:
        self.consumed_in_epoch = 0
        self.record.events.append(("on_train_epoch_start", self.current_epoch))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        self.record.events.append(("on_train_batch_start", ids_or_none(batch), batch_idx))
        if self.stop_epoch_at_step is not None and self.step_calls == self.stop_epoch_at_step:
            self.stop_epoch_at_step = None  # once: the hook is called again (without a step) in the next epoch
            return -1
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.record.events.append(("on_train_batch_end", ids_or_none(batch), batch_idx))

    def on_train_epoch_end(self) -> None:
        progress = self.trainer.fit_loop.epoch_loop.batch_progress
        bar = self.trainer.progress_bar_callback
        self.record.epoch_ends.append(
            dict(
                consumed=self.consumed_in_epoch,
                completed=progress.current.completed,
                is_last_batch=progress.is_last_batch,
                bar_n=getattr(getattr(bar, "train_progress_bar", None), "n", None),
                global_step=self.trainer.global_step,
            )
        )
        self.record.events.append(("on_train_epoch_end", self.current_epoch))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and "trail" in batch:  # a second application shows in the trail
            return {**batch, "trail": [*batch["trail"], "before"]}
        if not self.wrap_transfer or not self.trainer.training:
            return batch
        return {"batch": batch, "trail": ["before"]}

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and "trail" in batch:
            return {"batch": super().transfer_batch_to_device(batch["batch"], device, dataloader_idx),
                    "trail": [*batch["trail"], "transfer"]}
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, dict) and "trail" in batch:
            return {**batch, "trail": [*batch["trail"], "after"]}
        return batch

    def on_validation_start(self) -> None:
        self.record.validations.append((self.current_epoch, self.consumed_in_epoch))

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self):
        return CountingSGD(self.parameters(), lr=LR)

    def optimizer_steps_taken(self) -> int:
        optimizer = self.trainer.optimizers[0]
        return optimizer.steps_taken


def ids_or_none(batch: Any) -> tuple[int, ...] | None:
    try:
        return ids(batch)
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


class IterStepModule(RecordingModule):
    """``training_step(self, dataloader_iter)`` calling ``next()`` ``pattern[k % len(pattern)]`` times in call k."""

    def __init__(self, pattern: Sequence[int] = (1,), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not any(pattern):
            raise ValueError("a pattern of only zeros never consumes a batch")
        self.pattern = tuple(pattern)

    def training_step(self, dataloader_iter):
        if dataloader_iter.done and self.step_calls:
            # A drain call (C17): the epoch's last batch was handed out before this call. This step holds no batch,
            # so it ends the draining the way a simple step does, at its first next().
            self.record.drain_calls += 1
            self.record.events.append(("drain_call",))
            next(dataloader_iter)
            raise AssertionError("next() on an exhausted dataloader_iter returned instead of raising StopIteration")
        call = self.step_calls
        self.step_calls += 1
        self.record.events.append(("training_step", call))
        received: list[tuple] = []
        self.record.steps.append(received)
        batches = []
        for _ in range(self.pattern[call % len(self.pattern)]):
            # A StopIteration here propagates: C5 says it ends the epoch cleanly.
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            self.consumed_in_epoch += 1
            received.append((ids(batch), batch_idx, dataloader_idx))
            self.record.events.append(("next", ids(batch), batch_idx, dataloader_idx))
            self.record.done_after_next.append(bool(dataloader_iter.done))
            batches.append(self.receive(batch))
        return self.finish_step(batches)


class Crash(Exception):
    """A simulated failure, raised by :class:`CrashingModule`."""


class CrashingModule(IterStepModule):
    """Raises :class:`Crash` at the start of step call ``crash_at``, before consuming anything."""

    def __init__(self, pattern, crash_at: int | None = None, first_call: int = 0) -> None:
        super().__init__(pattern)
        self.crash_at = crash_at
        self.step_calls = first_call  # a resumed module continues the pattern where the checkpoint left it

    def training_step(self, dataloader_iter):
        if self.step_calls == self.crash_at:
            raise Crash(f"crash at step call {self.crash_at}")
        return super().training_step(dataloader_iter)


class RegularStepModule(RecordingModule):
    """The regular flavour, ``training_step(self, batch, batch_idx)``."""

    def training_step(self, batch, batch_idx):
        self.step_calls += 1
        self.consumed_in_epoch += 1
        self.record.events.append(("training_step", ids(batch), batch_idx))
        self.record.steps.append([(ids(batch), batch_idx, 0)])
        return self.finish_step([self.receive(batch)])


# --------------------------------------------------------------------------------------------------- expectations
def split_by_pattern(sequence: Sequence, pattern: Sequence[int]) -> list[list]:
    """How a step following ``pattern`` must split ``sequence`` into step calls (the last one may be short)."""
    groups, position = [], 0
    for k in itertools.count():
        if position >= len(sequence):
            return groups
        take = pattern[k % len(pattern)]
        groups.append(list(sequence[position : position + take]))
        position += take
    raise AssertionError("unreachable")


def reference_weights(
    module: RecordingModule,
    steps: Sequence[Sequence[int]],
    *,
    complete: Sequence[bool],
    accumulate: int = 1,
    clip_norm: float | None = None,
) -> dict[str, torch.Tensor]:
    """Final weights of a plain PyTorch loop over the same batches, grouped into step calls.

    ``steps[k]`` lists the batches (as item-id tuples) step call k used; ``complete[k]`` is False for a step cut short
    by StopIteration (no backward, no optimizer step). The optimizer steps after every ``accumulate`` completed step
    calls and after the last completed call of the epoch, dividing the loss by ``accumulate`` as Lightning does.
    """
    layer = torch.nn.Linear(FEATURES, 1)
    layer.load_state_dict(module.initial_state)
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    finished = [k for k, ok in enumerate(complete) if ok]
    for position, k in enumerate(finished):
        if steps[k]:  # a call that consumed nothing returns no loss, but still counts towards the window
            batches = [_collate([item(i) for i in batch_ids]) for batch_ids in steps[k]]
            loss = torch.stack([torch.nn.functional.mse_loss(layer(x), y) for _, x, y in batches]).mean()
            (loss / accumulate).backward()
        if (position + 1) % accumulate == 0 or position == len(finished) - 1:
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(layer.parameters(), clip_norm)
            optimizer.step()
            optimizer.zero_grad()
    return layer.state_dict()


def _collate(items):
    index, x, y = zip(*items, strict=True)
    return torch.tensor(index), torch.stack(x), torch.stack(y)


def assert_same_batches(actual: Sequence, expected: Sequence, what: str = "batches received") -> None:
    """Equality with a message that names the first batch that went wrong."""
    if list(actual) == list(expected):
        return
    for position, (a, e) in enumerate(zip(actual, expected, strict=False)):
        if a != e:
            raise AssertionError(
                f"{what}: position {position} got batch {a}, expected {e}\n  got:      {list(actual)}\n"
                f"  expected: {list(expected)}"
            )
    raise AssertionError(
        f"{what}: got {len(actual)} batches, expected {len(expected)}\n  got:      {list(actual)}\n"
        f"  expected: {list(expected)}"
    )


def error_chain_text(error: BaseException) -> str:
    """The error's text with its causes' (a design may wrap the user-facing message)."""
    parts = []
    while error is not None and len(parts) < 5:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n  caused by ".join(parts)


def assert_names_the_fix(message: str, *patterns: str, what: str) -> None:
    missing = [p for p in patterns if not re.search(p, message, re.IGNORECASE)]
    assert not missing, f"{what}: the error does not name the fix (no match for {missing}):\n  {message}"


def warning_texts(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught]
