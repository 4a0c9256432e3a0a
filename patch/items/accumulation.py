"""[RFC 5] The optimizer step, or accumulation, decided after the step returns."""

from patch.edits import LightningSource, assigns
from patch.items import Item
from patch.items.look_ahead import FETCHERS, NAMES, UTILITIES
from patch.transplant import methods_source, renamed
from prototypes.lightning_changes.optimization import StepFirstAutomaticOptimization
from prototypes.prefetcher.loops import _PrefetchingEpochLoop, _StepCallAutomaticOptimization


def _step_after_the_call(source: LightningSource) -> None:
    source.module("core.module").extend_docstring(
        "LightningModule.training_step",
        """
        With ``dataloader_iter``, ``accumulate_grad_batches`` counts step calls, whatever each call took, and the
        epoch's last call closes its accumulation window.
        """,
        before_section="Note:",
    )
    automatic = source.module("loops.optimization.automatic")
    automatic.add_import("from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher")
    automatic.add_import(
        f"from {UTILITIES} import (_average_gradients_over_ranks, _blocks_gradient_sync, _discard_cut_short_call,"
        " _first_where_synced)"
    )
    automatic.add_import(f"from {FETCHERS} import _StepCall")
    automatic.insert_in_body(
        "_AutomaticOptimization.__init__",
        """
        self._window_open = False  # gradients accumulated since the last optimizer step (a step pulling batches)
        self._window_loss: Optional[Tensor] = None  # the loss of the window's last call
        self._window_unsynced = False  # the window's last backward skipped DDP's gradient all-reduce
        """,
        after=assigns("self._skip_backward"),
    )
    automatic.insert_in_body(
        "_AutomaticOptimization.run",
        """
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is not None:
            return self.run_fetched_step_call(fetcher, optimizer, kwargs)
        """,
        at_start=True,
    )
    automatic.insert(
        renamed(methods_source(_StepCallAutomaticOptimization, ("run_fetched_step_call",)), NAMES)
        + "\n"
        + renamed(
            methods_source(
                StepFirstAutomaticOptimization,
                ("start_epoch", "run_step_call", "close_window", "_zero_grad_fn_of_a_drain_call"),
            ),
            NAMES,
        ),
        after="_AutomaticOptimization.run",
    )

    epoch_loop = source.module("loops.training_epoch_loop")
    epoch_loop.insert(renamed(methods_source(_PrefetchingEpochLoop, ("_a_rank_ends_within_this_call",)), NAMES),
                      after="_TrainingEpochLoop._accumulated_batches_reached")
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.on_run_start",
        """
        self.automatic_optimization.start_epoch()
        """,
        at_end=True,
    )
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop._accumulated_batches_reached",
        """
        accumulate = self.trainer.accumulate_grad_batches
        if accumulate == 1:
            return True  # Lightning asks six times per batch
        if self.trainer.fit_loop.prefetching_fetcher is not None:
            return self._step_calls_this_epoch() % accumulate == 0  # the window counts step calls
        """,
        at_start=True,
    )


ITEM = Item(
    5,
    "The optimizer step, or accumulation, decided after the step returns",
    """
Lightning ran the step inside `optimizer.step(closure)` and decided beforehand whether to step. A step that pulls its
batches tells only by returning whether it took the epoch's last batch (which closes the accumulation window), and a
call cut short by `StopIteration` must not reach `optimizer.step`. With `dataloader_iter`, the closure (step,
`zero_grad`, backward) now runs first and the optimizer steps afterwards with the loss already computed, or the window
stays open; `accumulate_grad_batches` counts step calls, the epoch's last call closes the window, and a drain call is a
window of its own. Under DDP a call inside a window skips the gradient all-reduce, as the regular flavour's does: the
ranks decide it before the call from its index and their look-ahead (carried in the end-of-data vote), and a window
the data closes unforeseen has its gradients averaged once before the optimizer steps. The regular flavour's path is
unchanged.
""",
    _step_after_the_call,
    changelog=(
        ("Changed", (
            "With `training_step(self, dataloader_iter)`, `accumulate_grad_batches` counts step calls and the"
            " optimizer steps after the step returns; a call cut short by the end of the data steps no "
            "optimizer for its batches, and under DDP an accumulation window still all-reduces its gradients "
            "once"
        )),
    ),
    tests=(
        "loops/optimization/test_dataloader_iter_accumulation.py",
        "loops/optimization/test_dataloader_iter_cut_short.py",
    ),
)
