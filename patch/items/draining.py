"""[RFC 3] Drain a pipelining step at the end of the data."""

from patch.edits import LightningSource, ModuleSource
from patch.items import Item, UpdatedTest
from patch.items.look_ahead import FETCHERS, NAMES, UTILITIES
from patch.transplant import methods_source, renamed
from prototypes.common import NoProgressGuard
from prototypes.lightning_changes.epoch_loop import BatchCountingEpochLoop, DrainsHeldBatches
from prototypes.prefetcher.loops import _PrefetchingEpochLoop


def _drain(source: LightningSource) -> None:
    source.module("core.module").extend_docstring(
        "LightningModule.training_step",
        """
        A step that pulls batches ahead of the ones it trains (it took more batches in its first call than it takes
        per call afterwards) is called again after the epoch's last batch, with ``dataloader_iter.done`` ``True``, so
        that it trains what it holds: these drain calls go on until one raises ``StopIteration`` (its ``next()`` does)
        or returns ``None`` without stepping an optimizer.
        """,
        before_section="Note:",
    )
    epoch_loop = source.module("loops.training_epoch_loop")
    epoch_loop.add_import(
        f"from {UTILITIES} import _DRAIN_CALL_TRAINED_UNSEEN, _HELD_BATCHES_NOT_DRAINED, _drain, _epoch_stopped_early,"
        " _optimizer_steps"
    )
    epoch_loop.add_import("import warnings")
    epoch_loop.add_import(
        f"from {FETCHERS} import _PULLED_AHEAD, _RanksVote, _every_rank_has_a_batch, _makes_drain_calls"
    )
    epoch_loop.add_import("from collections.abc import Callable, Iterator")
    epoch_loop.insert(
        renamed(
            methods_source(_PrefetchingEpochLoop, ("_step_calls_this_epoch",
                                                   "_consumed_by_last_call", "_pulled_ahead", "_draining",
                                                   "_run_drain_call", "_vote_since_the_last_call",
                                                   "_vote_after_drain_call"))
            + "\n"
            + methods_source(DrainsHeldBatches, ("_drain_rule", "_drain_if_the_data_ended", "_drain_held_batches",
                                                 "_drain_call")),
            NAMES,
        ),
        after="_TrainingEpochLoop.advance",
    )
    # whether the ranks vote on the end of data (under DDP the drain calls need it), decided once per combined loader
    epoch_loop.add_import(f"from {FETCHERS} import _end_of_data_vote_needed")
    epoch_loop.add_import("from pytorch_lightning.utilities.combined_loader import CombinedLoader")
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.__init__",
        """
        self._vote_decided_for: Optional[CombinedLoader] = None  # the combined loader `_ranks_vote` was decided for
        self._ranks_vote = False
        """,
        at_end=True,
    )
    epoch_loop.insert(
        renamed(methods_source(BatchCountingEpochLoop, ("_ranks_vote_every_step",)), NAMES),
        after="_TrainingEpochLoop._drain_call",
    )
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.advance",
        """
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        # batches a pipelining step still holds belong to this epoch's training: drained before the epoch-end
        # validation of `on_advance_end`; on one rank there is nothing to do before the data's end (the record's
        # `ranks_vote` is `_ranks_vote_every_step()` without a call, off only once the ranks agreed the data ended)
        if fetcher is not None and (self.batch_progress.is_last_batch or fetcher.calls.ranks_vote):
            self._drain_if_the_data_ended(fetcher.calls.call.cut_short)
        """,
        at_end=True,
    )
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.on_run_start",
        """
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is not None:  # the drain rule cannot see the calls before the checkpoint
            fetcher.calls.taken.resumed_mid_epoch = self.batch_progress.current.ready > 0
        """,
        at_end=True,
    )


STEP_METHODS_TEST = "test_step_methods_with_dataloader_iter"
# the limit of each stage's batches, as the test names it
STAGE_LIMITS = {
    "training": "limit_train_batches", "sanity_validation": "limit_sanity_val_batches",
    "validation": "limit_eval_batches", "test": "limit_eval_batches", "predict": "limit_eval_batches",
}


def count_drain_calls(test: ModuleSource, stages: tuple[str, ...]) -> None:
    """In Lightning's test of the step methods (two batches per call), the stages' counts of step calls entered and
    of StopIteration raised include the drain call (``calls`` and ``drain_calls``, which the training stage's update
    adds)."""
    alternatives = "|".join(stages)
    test.substitute(
        STEP_METHODS_TEST,
        rf'\["({alternatives})"\]\["entered"\] == length\(data, (\w+)\) // fetches_per_step$',
        r'["\1"]["entered"] == calls(data, \2)',
    )
    test.substitute(
        STEP_METHODS_TEST,
        rf'\["({alternatives})"\]\["raised"\] == 0$',
        lambda found: f'["{found[1]}"]["raised"] == drain_calls(data, {STAGE_LIMITS[found[1]]})',
    )


def _training_counts_its_drain_call(test: ModuleSource) -> None:
    test.insert(
        """
        def drain_calls(iterable, limit):
            # a step whose only call took more than one batch may hold one: the loop calls it once more, without one
            return int(length(iterable, limit) == fetches_per_step)

        def calls(iterable, limit):
            return length(iterable, limit) // fetches_per_step + drain_calls(iterable, limit)
        """,
        after=f"{STEP_METHODS_TEST}.length",
    )
    count_drain_calls(test, ("training",))


ITEM = Item(
    3,
    "Drain a pipelining step at the end of the data",
    f"""
A step that pipelines (it pulled batch i+1 and keeps it for the next call) still holds untrained batches when the
epoch's last batch has been handed out; Lightning ended the epoch and dropped them. After the call that took the last
batch of a dataloader in which the step pulled ahead (its calls took more batches than their steady rate: a pipeline
fills in its first calls), the loop now calls the step again with the exhausted iterator (`done` True on entry) until
a call raises `StopIteration` or does no work (returns nothing and steps no optimizer), before the epoch-end
validation. A step that takes the same number of batches in every call gets no drain call: on a pipeline stage after
the first, one would wait for an activation that never comes. A drain that never ends (a step that keeps returning a
loss after the data ended) is an error after {NoProgressGuard.LIMIT} calls, naming the fix. A drain call
has no batch hooks and counts no batch; one that steps an optimizer is a step of the loop (schedulers, a logger row of
its own). Under DDP the ranks vote after every drain call, so all make the same number; whether they drain at all
travels in the vote between the calls (no collective of its own).
""",
    _drain,
    changelog=(
        ("Added", (
            "A `training_step(dataloader_iter)` that pulled batches ahead of its calls is called again after "
            "the epoch's last batch, with the exhausted iterator, until a call raises `StopIteration` or does"
            ' no work, so that a pipelining step trains the batches it holds'
        )),
    ),
    tests=("loops/test_dataloader_iter_drain.py",),
    updated_tests=(
        UpdatedTest(
            "loops/test_fetchers.py", STEP_METHODS_TEST,
            "where the training data is a single call's two batches, the loop drains it: the step is entered once "
            "more and its next() raises StopIteration",
            _training_counts_its_drain_call,
        ),
    ),
)
