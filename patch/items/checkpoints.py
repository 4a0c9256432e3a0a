"""[RFC 6] Checkpoints record the loader state as of the consumed batches; resume restores ``batch_idx``."""

from patch.edits import LightningSource, calls, returns
from patch.items import Item


def _consumed_state(source: LightningSource) -> None:
    fit_loop = source.module("loops.fit_loop")
    fit_loop.insert_in_body(
        "_FitLoop.on_save_checkpoint",
        """
        # the loaders ran ahead of the step (the fetcher's look-ahead): resuming from their live state would skip the
        # batches read but not handed out
        if self.prefetching_fetcher is not None and (consumed := self.prefetching_fetcher.consumed_loader_states):
            state_dict["combined_loader"] = consumed
        """,
        before=returns,
    )
    epoch_loop = source.module("loops.training_epoch_loop")
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.update_restart_stage",
        """
        total = self.batch_progress.total
        mid_step = total.ready == total.started == total.processed > total.completed
        if self.restarting and self.trainer.fit_loop.prefetching_fetcher is not None and mid_step:
            # a checkpoint saved in on_train_batch_end has completed == processed - 1 with one batch per call; a call
            # that consumed several batches leaves a larger gap
            self._restart_stage = RestartStage.RESTARTED_ON_TRAIN_BATCH_END
        """,
        before=calls("self.val_loop.update_restart_stage"),
    )
    epoch_loop.replace_statement(
        "_TrainingEpochLoop.reset",
        calls("self.batch_progress.increment_completed"),
        """
        if self.trainer.fit_loop.prefetching_fetcher is not None:
            # the call that saved it in on_train_batch_end may have consumed several batches
            self.batch_progress._completed_up_to_processed()
        else:
            self.batch_progress.increment_completed()
        """,
    )


ITEM = Item(
    6,
    "Checkpoints record the loader state as of the consumed batches, and resume restores batch_idx",
    """
A checkpoint recorded the loaders' live state, which is ahead of the step when the fetcher looks ahead: resuming
skipped batches that were read but never handed out. It now records the state as of the batches the step consumed.
Resuming from a checkpoint saved in `on_train_batch_end` after a call that consumed several batches is recognised as
such.
""",
    _consumed_state,
    changelog=(
        ("Fixed", (
            "A checkpoint of a run whose `training_step` takes `dataloader_iter` records the loaders' state "
            'as of the batches the step consumed, and resuming from it restores `batch_idx`'
        )),
    ),
    tests=("checkpointing/test_dataloader_iter_resume.py",),
)
