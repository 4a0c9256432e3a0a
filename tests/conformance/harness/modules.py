"""The recording LightningModules: what a run let the user observe (hook calls with the batch they were given, what
``next(dataloader_iter)`` returned, optimizer steps), never design internals."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch

from tests.conformance.harness.data import FEATURES, LR, ids, ids_or_none


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
