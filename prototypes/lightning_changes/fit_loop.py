"""Lightning's fit loop, changed where it assumes one batch per step call: checkpoints hold the consumed
loader state, and the LR finder reads step calls."""

from __future__ import annotations

from collections.abc import Callable

from lightning_fabric.utilities.types import _Stateful
from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.utilities.combined_loader import CombinedLoader

from prototypes.lightning_changes.epoch_loop import BatchCountingEpochLoop


# ----------------------------------------------------------------------- [RFC 1] checkpoints: consumed state
def loader_state_reader(combined_loader: CombinedLoader | None) -> Callable[[], list[dict]] | None:
    """A function returning the loaders' state at the moment it is called, or None when no loader can be resumed
    (only stateful loaders are checkpointed: a loop then records no state, and calls nothing for it per batch).

    Why decided once: whether a loader is stateful is a runtime ``Protocol`` check (``typing._get_protocol_attrs``,
    tens of microseconds), too costly to repeat for every batch, and the loaders do not change within an epoch.
    """
    if combined_loader is None or not any(isinstance(dl, _Stateful) for dl in combined_loader.flattened):
        return None
    return combined_loader._state_dicts


class BatchCountingFitLoop(_FitLoop):
    """Lightning's fit loop, changed where it assumes one batch per step call. ``epoch_loop`` is a
    :class:`BatchCountingEpochLoop`; a design says what its loaders' state was as of the batches handed out."""

    epoch_loop: BatchCountingEpochLoop
    cut_short_call_reported = False  # this fit warned of a call cut short (``discard_cut_short_call``)

    def on_run_start(self) -> None:
        self.cut_short_call_reported = False
        super().on_run_start()

    def consumed_loader_states(self) -> list[dict] | None:
        raise NotImplementedError

    # ------------------------------------------------------------------- [RFC 1] checkpoints: consumed state
    def on_save_checkpoint(self) -> dict:
        state_dict = super().on_save_checkpoint()
        # Why: the loaders ran ahead of the steps (look-ahead or prefetch); resuming from their live state would
        # skip the batches read but not handed out
        consumed = self.consumed_loader_states()
        if consumed is not None:
            state_dict["combined_loader"] = consumed
        return state_dict

    # ------------------------------------------------------------------- [RFC 6] the LR finder asks the loop
    @property
    def batch_idx(self) -> int:
        """When the training step pulls batches, the running step call's index in the epoch; otherwise Lightning's.

        Why: Lightning's LR finder reads ``fit_loop.batch_idx`` (nothing else in Lightning does) to tell whether the
        running call steps the optimizer, as ``(batch_idx + 1) % accumulate_grad_batches == 0``. Accumulation counts
        step calls here (C9) while ``batch_idx`` counts batches, so with several batches per call the finder would
        record a learning rate more than once per optimizer step. Lightning proper would let the finder ask the loop.
        """
        if self.epoch_loop._steps_pull_batches():
            return self.epoch_loop._step_calls_this_epoch() - 1  # a call is counted from its batch-start hooks on
        return super().batch_idx
