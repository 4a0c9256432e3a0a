"""A catalogue of realistic defects, each of which the clause it breaks must catch (``tests/test_defect_catalogue.py``).

A defect is one entry: the clause it breaks, the real design it is applied to, one attribute of that design
(a method, a property or a function the design imports) and what replaces it, and the suite's tests that must
fail. ``defect.applied()`` registers the broken design as ``defect_<name>`` and patches the attribute for the
duration of a run; nothing is edited on disk. Adding a defect::

    Defect("batch_size_in_batches", "C10", "prefetcher", "infers `self.log`'s batch size as the number of batches",
           (log_batch_size, "samples_in"), _instead(lambda batches: len(batches) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED)

``broken`` receives the original attribute and returns its replacement. ``select`` is a ``-k`` expression that
narrows the tests to the cases that can catch the defect, to keep the catalogue fast.

    python -m tests.test_defect_catalogue rfc/results/defects.json   # run the catalogue, write its outcomes
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.trainer import call
from pytorch_lightning.utilities.data import extract_batch_size

import prototypes.common as common
from prototypes import IMPLEMENTATIONS, lightning_changes
from prototypes.batch_processor import evaluation as bp_evaluation
from prototypes.batch_processor import lookahead as bp_lookahead
from prototypes.batch_processor import training as bp_training
from prototypes.common import Design
from prototypes.lightning_changes import log_batch_size
from prototypes.prefetcher import fetcher as prefetch_fetcher
from prototypes.prefetcher import loops as prefetch_loops
from prototypes.prefetcher import options as prefetch_options
from prototypes.prefetcher import prefetch_thread

_Fetcher = prefetch_fetcher._PrefetchingIterFetcher
_EpochLoop = bp_training.IteratorTrainingEpochLoop


@dataclass(frozen=True)
class Defect:
    """One realistic defect: ``broken(original)`` replaces ``patches = (owner, attribute)`` of ``design``."""

    name: str
    clause: str
    design: str
    what: str  # what the broken design does, in a maintainer's words
    patches: tuple[Any, str]
    broken: Callable[[Any], Any]
    tests: tuple[str, ...]  # ``<file>::<test function>`` in tests/conformance
    select: str = ""  # a -k expression narrowing the parametrized cases
    options: Mapping[str, Any] = field(default_factory=dict)  # design options, e.g. a prefetch depth

    @property
    def design_name(self) -> str:
        return f"defect_{self.name}"

    @contextlib.contextmanager
    def applied(self) -> Iterator[Design]:
        """The broken design, registered as ``defect_<name>`` and patched until the block ends."""
        base = IMPLEMENTATIONS[self.design].variant(**self.options)
        design = Design(
            name=self.design_name,
            summary=f"{base.id} that {self.what}",
            make_trainer=base.make_trainer,
            options=base.options,
        )
        owner, attribute = self.patches
        IMPLEMENTATIONS[design.name] = design
        try:
            with mock.patch.object(owner, attribute, self.broken(getattr(owner, attribute))):
                yield design
        finally:
            del IMPLEMENTATIONS[design.name]


# --------------------------------------------------------------------------------------------------- replacements
def _after(change: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A replacement that calls the original, then ``change(self, result, *args)``, returning what that returns."""

    def broken(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return change(self, original(self, *args, **kwargs), *args)

        return method

    return broken


def _instead(replacement: Any) -> Callable[[Any], Any]:
    """A replacement that ignores the original."""
    return lambda original: replacement


def _keeping(fetcher: Any, attributes: tuple[str, ...], advance: Callable[[Any], Any]) -> Any:
    """``advance(fetcher)`` with ``attributes`` left as they were: the hooks then read stale values."""
    kept = {name: getattr(fetcher, name) for name in attributes}
    result = advance(fetcher)
    for name, value in kept.items():
        setattr(fetcher, name, value)
    return result



def _redelivers_every_fifth(original: Callable[..., Any]) -> Callable[..., Any]:
    def get(self: Any) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls % 5 == 0 and hasattr(self, "last"):
            return self.last  # "a retry after a slow produce() hands out the previous result again"
        self.last = original(self)
        return self.last

    return get


def _keeps_the_steps_first_batch_for_the_end_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hand_out(self: Any, item: Any) -> Any:
        first = self._last_handed_out if self._step_batches else None
        result = original(self, item)
        if first is not None:
            self._last_handed_out = first
        return result

    return hand_out


def _calls_the_start_hook_per_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def hand_out(self: Any, item: Any) -> Any:
        if self._step_batches:  # not the step's first batch
            call._call_lightning_module_hook(
                self.trainer, "on_train_batch_start", item[0], self.batch_progress.current.ready
            )
        return original(self, item)

    return hand_out


def _counts_the_batch_held_back_on_minus_one(original: Callable[..., Any]) -> Callable[..., Any]:
    def advance(self: Any, data_fetcher: Any) -> None:
        try:
            original(self, data_fetcher)
        except StopIteration:  # with a pulling step, advance raises it only for -1 from on_train_batch_start
            if self._steps_pull_batches():
                progress = self.batch_progress
                progress.count_consumed()
                progress.increment_processed()
                progress.increment_completed()
            raise

    return advance


def _forget_a_cut_short_calls_batches(self: Any, output: Any) -> Any:
    if output is None:  # the call was cut short by StopIteration: take back the batches it counted
        for counts in (self.batch_progress.total, self.batch_progress.current):
            counts.ready -= self._last_step_consumed
            counts.started -= self._last_step_consumed
        self._last_step_consumed = 0
    return output


def _step_after_a_cut_short_call(self: Any, output: Any) -> Any:
    if output is None and self.trainer.lightning_module.automatic_optimization:
        self.automatic_optimization._optimizer_step(self._step_calls - 1, lambda: None)
    return output


def _skips_the_epochs_last_window(original: Callable[..., Any]) -> Callable[..., Any]:
    def close_window(self: Any, step_call_idx: int) -> None:
        if not self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:  # the final window is never stepped
            original(self, step_call_idx)

    return close_window


def _complete_one_batch_per_call(self: Any) -> None:
    for counts in (self.total, self.current):  # as Lightning's own class does, whatever the call consumed
        counts.completed = min(counts.processed, counts.completed + 1)


def _saves_step_calls_for_every_module(self: Any) -> dict:
    state_dict = _TrainingEpochLoop.on_save_checkpoint(self)
    state_dict.update(step_calls=self._step_calls, last_step_consumed=self._last_step_consumed)
    return state_dict


def _keeps_counted_progress(self: Any, result: None, *args: Any) -> None:
    self.__dict__["counted_progress"] = self.batch_progress  # Lightning saves every progress a loop holds


def _transfer_without_after_hook(self: Any, batch: Any, dataloader_idx: int, pin: bool = False) -> Any:
    module = self.trainer.lightning_module
    batch = self.trainer.precision_plugin.convert_input(batch)
    batch = module.on_before_batch_transfer(batch, dataloader_idx)
    return module.transfer_batch_to_device(batch, self.trainer.strategy.root_device, dataloader_idx)


def _transfer_without_precision(self: Any, batch: Any, dataloader_idx: int, pin: bool = False) -> Any:
    module = self.trainer.lightning_module
    batch = module.on_before_batch_transfer(batch, dataloader_idx)
    batch = module.transfer_batch_to_device(batch, self.trainer.strategy.root_device, dataloader_idx)
    return module.on_after_batch_transfer(batch, dataloader_idx)


def _counts_only_a_calls_first_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def count_consumed(self: Any) -> None:
        if self.current.ready == self.current.completed:  # nothing counted yet in this step call
            original(self)

    return count_consumed


def _validates_on_multiples_only(original: Callable[..., Any]) -> Callable[..., Any]:
    def should_check(self: Any, data_fetcher: Any) -> bool:
        interval = self.trainer.val_check_batch
        if self._prefetching() is None or not isinstance(interval, int):
            return original(self, data_fetcher)
        # Lightning's rule for one batch per step: a step that consumes past a multiple never lands on it
        return original(self, data_fetcher) and self.batch_progress.current.completed % interval == 0

    return should_check


def _produce_ending_on_error(original: Callable[..., Any]) -> Callable[..., Any]:
    def produce(self: Any) -> Any:
        try:
            return original(self)
        except StopIteration:
            raise
        except Exception:
            raise prefetch_fetcher._LoaderExhausted(None) from None  # "a broken batch ends the epoch"

    return produce


def _get_retyping_errors(original: Callable[..., Any]) -> Callable[..., Any]:
    def get(self: Any) -> Any:
        try:
            return original(self)
        except StopIteration:
            raise
        except Exception as error:
            raise RuntimeError(f"the prefetch thread failed: {error}") from error

    return get


def _shutdown_without_join(self: Any) -> None:
    self._stop.set()


def _run_catching_exception_only(self: Any) -> None:
    while not self._stop.is_set():
        if not self._slots.acquire(timeout=prefetch_thread._POLL_S):
            continue
        try:
            self._results.put(self._produce())
        except Exception as error:  # a KeyboardInterrupt ends the thread and never reaches the consumer
            self._results.put(prefetch_thread._Failure(error))
            return


def _stop_forgetting_the_thread(self: Any) -> None:
    self._close_iterator()
    self.prefetcher = None  # dropped, not shut down: its thread keeps running
    self._head = None


def _foreign_stop_ends_the_call(self: Any) -> None:
    self.cut_short = True


def _drain_call_logging_every_call(self: Any) -> bool:
    """A drain call that hands the loggers the last values after every call, at the previous call's logging step."""
    connector = self.trainer._logger_connector
    connector.on_batch_start(None)
    saw_end = self._run_drain_call()
    connector.on_batch_end()
    connector.update_train_step_metrics()
    return saw_end


@contextlib.contextmanager
def _drain_calls_forgetting_the_last_call(self: Any) -> Iterator[None]:
    yield  # nothing restored: the last drain call stays the fetcher's call, and the last real call's count is lost


def _drain_call_as_any_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, optimizer: Any, batch_idx: int, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop._data_fetcher
        if not isinstance(fetcher, _Fetcher) or not fetcher.call.drain:
            return original(self, optimizer, batch_idx, kwargs)
        try:  # Lightning's way: the optimizer_step hook is entered before the step runs
            return _AutomaticOptimization.run(self, optimizer, batch_idx, kwargs)
        except StopIteration:
            fetcher.step_stopped()
            return {}
        finally:
            fetcher.end_step_call()

    return run


def _writer_indices_of_the_last_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, prediction: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
        original(self, prediction, dataloader_idx, consumed[-1:], cut_short)

    return method


# --------------------------------------------------------------------------------------------------- the catalogue
C01 = "test_c01_selection.py::"
C01_OBJECT = "test_c01_trainer_object.py::"
C02 = "test_c02_items.py::"
C03 = "test_c03_exactly_once.py::"
C04 = "test_c04_transfer.py::"
C05 = "test_c05_end_of_data.py::"
C06 = "test_c06_progress.py::"
C07 = "test_c07_limits.py::"
C08 = "test_c08_hooks.py::"
C09 = "test_c09_optimisation.py::"
C10 = "test_c10_logging.py::"
C11 = "test_c11_resume.py::"
C12 = "test_c12_errors.py::"
C13 = "test_c13_interrupts.py::"
C14 = "test_c14_misuse.py::"
C15 = "test_c15_evaluation.py::"
C16 = "test_c16_distributed.py::"
C17 = "test_c17_pipelining.py::"
C18 = "test_c18_features.py::"
C19 = "test_c19_real_pipelines.py::"
SIZED = "sized and not unsized"
# the prefetcher ships without a thread; a defect in its thread's lifetime is applied with one running all the time
WITH_THREAD = {"depth": 2}

CATALOGUE: tuple[Defect, ...] = (
    # C1 Selection
    Defect("regular_accumulation_by_step_calls", "C1", "batch_processor",
           "counts accumulation in the flavour's step calls for the regular flavour too",
           (_EpochLoop, "_accumulated_batches_reached"),
           _instead(lambda self: self._step_calls % self.trainer.accumulate_grad_batches == 0),
           (C01 + "test_regular_flavour_with_trainer_options_as_stock",), "accumulate3"),
    Defect("options_pickled_with_their_locks", "C1", "prefetcher",
           "pickles its loops' options as they are, thread locks included, instead of rebuilding them on unpickling",
           (prefetch_options.Options, "__reduce__"), _instead(object.__reduce__),
           (C01_OBJECT + "test_trainer_pickles_and_copies_before_and_after_fit",), "regular and no_profiler"),
    Defect("profiler_left_serialised", "C1", "prefetcher",
           "leaves its serialising start/stop on the user's profiler after the prefetch thread stopped",
           (prefetch_options.Options, "thread_stopped_recording"), _instead(lambda self, profiler: None),
           (C01_OBJECT + "test_trainer_pickles_and_copies_before_and_after_fit",), "dataloader_iter and simple",
           options=WITH_THREAD),
    Defect("step_calls_in_regular_checkpoints", "C1", "batch_processor",
           "writes its step-call count and last call's batch count into every checkpoint, a regular module's too",
           (_EpochLoop, "on_save_checkpoint"), _instead(_saves_step_calls_for_every_module),
           (C01_OBJECT + "test_regular_module_checkpoint_is_stock_lightnings",)),
    Defect("progress_saved_twice", "C1", "prefetcher",
           "keeps a second reference to its evaluation loops' batch progress, which Lightning saves as loop state",
           (prefetch_loops._PrefetchingEvaluationSteps, "__init__"), _after(_keeps_counted_progress),
           (C01_OBJECT + "test_regular_module_checkpoint_is_stock_lightnings",)),
    # C2 Items
    Defect("batch_idx_from_one", "C2", "batch_processor", "numbers the batches of an epoch from 1",
           (_EpochLoop, "_hand_out"), _after(lambda self, item, _: (item[0], item[1] + 1, item[2])),
           (C02 + "test_next_returns_batch_index_and_dataloader_index",), SIZED),
    Defect("batch_idx_counts_step_calls", "C2", "prefetcher", "hands out the step-call index as `batch_idx`",
           (_Fetcher, "consume"), _after(lambda self, item, _: (item[0], self.call.index - 1, item[2])),
           (C02 + "test_next_returns_batch_index_and_dataloader_index",), SIZED),
    Defect("batch_idx_across_epochs", "C2", "batch_processor",
           "numbers batches across epochs (total instead of current progress)",
           (_EpochLoop, "_hand_out"),
           _after(lambda self, item, _: (item[0], self.batch_progress.total.ready - 1, item[2])),
           (C02 + "test_batch_idx_restarts_from_zero_each_epoch",), SIZED),
    # C3 Exactly once, in order
    Defect("read_ahead_batch_dropped", "C3", "prefetcher", "drops the read-ahead batch whenever a step call closes",
           (_Fetcher, "end_step_call"), _after(lambda self, _, *args: setattr(self, "_head", None)),
           (C03 + "test_fixed_patterns_receive_the_loader_sequence_every_epoch",), SIZED, {"depth": 0}),
    # depth 0 for both: in a thread a lost or repeated batch would also unbalance the prefetch slots (a hang)
    Defect("batch_repeated", "C3", "prefetcher", "hands out every fifth batch a second time (a retried get())",
           (prefetch_thread.PrefetchThread, "get"), _redelivers_every_fifth,
           (C03 + "test_fixed_patterns_receive_the_loader_sequence_every_epoch",), SIZED, {"depth": 0}),
    # C4 Device and transfer hooks
    Defect("after_transfer_hook_skipped", "C4", "prefetcher", "never calls `on_after_batch_transfer`",
           (_Fetcher, "_transfer"), _instead(_transfer_without_after_hook),
           (C04 + "test_every_batch_passes_each_transfer_hook_once",), SIZED),
    Defect("transfer_hooks_twice", "C4", "batch_processor",
           "transfers a batch when the hooks peek at it and again when it is handed out",
           (bp_lookahead.LookAhead, "take"),
           _after(lambda self, item: (self._transfer(item[0], item[2]), item[1], item[2])),
           (C04 + "test_every_batch_passes_each_transfer_hook_once",), SIZED),
    Defect("precision_conversion_skipped", "C4", "prefetcher", "skips the precision plugin's input conversion",
           (_Fetcher, "_transfer"), _instead(_transfer_without_precision),
           (C04 + "test_batches_arrive_on_the_module_device_in_its_precision",)),
    # C5 End of data
    Defect("done_never_true", "C5", "prefetcher", "never sets `dataloader_iter.done`",
           (prefetch_fetcher._StepIterator, "done"), _instead(property(lambda self: False)),
           (C05 + "test_done_is_true_exactly_once_the_last_batch_is_handed_out",), SIZED),
    Defect("cut_short_batches_uncounted", "C5", "batch_processor",
           "does not count the batches of a step call cut short by StopIteration",
           (_EpochLoop, "_run_step"),
           _after(_forget_a_cut_short_calls_batches),
           (C05 + "test_stop_iteration_in_step_counts_its_consumed_batches",), SIZED),
    Defect("optimizer_step_on_cut_short_call", "C5", "batch_processor",
           "takes an optimizer step for a step call cut short by StopIteration",
           (_EpochLoop, "_run_step"),
           _after(_step_after_a_cut_short_call),
           (C05 + "test_stop_iteration_in_step_takes_no_optimizer_step",), SIZED),
    # C6 Progress counts batches
    Defect("progress_counts_step_calls", "C6", "prefetcher", "advances batch progress once per step call",
           (lightning_changes.ConsumedBatchProgress, "count_consumed"), _counts_only_a_calls_first_batch,
           (C06 + "test_completed_progress_equals_batches_consumed",), SIZED),
    Defect("completed_counts_one_per_call", "C6", "batch_processor",
           "completes at most one batch per step call",
           (lightning_changes.ConsumedBatchProgress, "_completed_up_to_processed"),
           _instead(_complete_one_batch_per_call),
           (C06 + "test_completed_progress_equals_batches_consumed",), SIZED),
    # C7 Limits
    Defect("limit_off_by_one", "C7", "prefetcher", "delivers one batch more than `limit_train_batches`",
           (_Fetcher, "reset"),
           _after(lambda self, _: setattr(self, "length", None if self.length is None else self.length + 1)),
           (C07 + "test_limit_train_batches_delivers_exactly_n_batches",), SIZED),
    Defect("validation_on_multiples_only", "C7", "prefetcher",
           "validates only when the batch count lands on a multiple of `val_check_interval`",
           (prefetch_loops._PrefetchingEpochLoop, "_should_check_val_fx"), _validates_on_multiples_only,
           (C07 + "test_val_check_interval_counts_batches",)),
    Defect("drain_forgets_the_last_calls_batches", "C7", "prefetcher",
           "forgets in its drain calls how many batches the epoch's last step call took, so a validation due there is"
           " lost", (_Fetcher, "drain_calls"), _instead(_drain_calls_forgetting_the_last_call),
           (C07 + "test_val_check_interval_counts_batches_of_any_loader",), "across-epochs and " + SIZED),
    # C8 Hooks
    Defect("stale_start_hook_batch", "C8", "prefetcher",
           "gives `on_train_batch_start` the previous step's batch (stock Lightning's behaviour)",
           (_Fetcher, "__next__"),
           lambda original: lambda self: _keeping(self, ("_batch", "_batch_idx"), original),
           (C08 + "test_start_hook_gets_the_first_batch_the_step_receives",), SIZED),
    Defect("end_hook_gets_first_batch", "C8", "batch_processor",
           "gives `on_train_batch_end` the step's first batch instead of its last",
           (_EpochLoop, "_hand_out"), _keeps_the_steps_first_batch_for_the_end_hook,
           (C08 + "test_end_hook_gets_the_last_batch_the_step_received",), SIZED),
    Defect("start_hook_per_batch", "C8", "batch_processor", "calls `on_train_batch_start` for every batch handed out",
           (_EpochLoop, "_hand_out"), _calls_the_start_hook_per_batch,
           (C08 + "test_batch_hooks_once_per_step_call_in_order",), SIZED),
    Defect("minus_one_counts_the_batch_held_back", "C8", "batch_processor",
           "counts the looked-ahead batch when `on_train_batch_start` returns -1",
           (_EpochLoop, "advance"), _counts_the_batch_held_back_on_minus_one,
           (C08 + "test_minus_one_from_start_hook_ends_epoch_without_consuming",), SIZED),
    # C9 Optimisation
    Defect("accumulation_counts_batches", "C9", "prefetcher",
           "closes accumulation windows by batches instead of step calls",
           (prefetch_loops._PrefetchingEpochLoop, "_accumulated_batches_reached"),
           _instead(lambda self: self.batch_progress.current.ready % self.trainer.accumulate_grad_batches == 0),
           (C09 + "test_accumulation_counts_step_calls",)),
    Defect("window_open_at_epoch_end", "C9", "batch_processor",
           "leaves the last accumulation window of an epoch without an optimizer step",
           (lightning_changes.StepFirstAutomaticOptimization, "close_window"), _skips_the_epochs_last_window,
           (C09 + "test_accumulation_counts_step_calls",)),
    # C10 Logging
    Defect("batch_size_in_batches", "C10", "prefetcher", "infers `self.log`'s batch size as the number of batches",
           (log_batch_size, "samples_in"), _instead(lambda batches: len(batches) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED),
    Defect("batch_size_of_first_batch", "C10", "batch_processor",
           "infers `self.log`'s batch size from the step's first batch only",
           (log_batch_size, "samples_in"),
           _instead(lambda batches: extract_batch_size(batches[0]) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED),
    # C11 Exactly-once resume
    Defect("checkpoint_of_produced_batches", "C11", "prefetcher",
           "checkpoints the loader state of the batches produced ahead, not of those consumed",
           (prefetch_loops._PrefetchingFitLoop, "on_save_checkpoint"), _instead(_FitLoop.on_save_checkpoint),
           (C11 + "test_resume_delivers_exactly_the_unconsumed_batches",)),
    Defect("batch_idx_renumbered_on_resume", "C11", "batch_processor",
           "hands out the loader's own index, which restarts at 0 after a resume",
           (_EpochLoop, "_hand_out"), _after(lambda self, handed, item: (handed[0], item[1], item[2])),
           (C11 + "test_resume_delivers_exactly_the_unconsumed_batches",)),
    # C12 Errors surface
    Defect("loading_error_ends_the_epoch", "C12", "prefetcher", "ends the epoch quietly when a batch fails to load",
           (_Fetcher, "_produce"), _produce_ending_on_error,
           (C12 + "test_dataset_error_reaches_fit_with_its_type",), "main"),
    Defect("loading_error_retyped", "C12", "prefetcher", "re-raises a loading error as a RuntimeError",
           (prefetch_thread.PrefetchThread, "get"), _get_retyping_errors,
           (C12 + "test_dataset_error_reaches_fit_with_its_type",), "main"),
    Defect("thread_not_joined", "C12", "prefetcher", "stops its prefetch thread without joining it",
           (prefetch_thread.PrefetchThread, "shutdown"), _instead(_shutdown_without_join),
           (C12 + "test_error_in_the_step_while_loading_leaves_no_thread_running",), options=WITH_THREAD),
    # C13 Interrupts and early stops
    Defect("interrupt_kills_the_thread", "C13", "prefetcher",
           "lets a KeyboardInterrupt end its thread instead of reaching the step",
           (prefetch_thread.PrefetchThread, "_run"), _instead(_run_catching_exception_only),
           (C13 + "test_keyboard_interrupt_while_loading_takes_the_interrupt_path",), options=WITH_THREAD),
    # the leaked thread polls until the process ends; w0: no worker processes are kept alive with it
    Defect("early_stop_leaves_the_thread", "C13", "prefetcher",
           "drops its prefetcher at an early stop without shutting the thread down",
           (_Fetcher, "stop"), _instead(_stop_forgetting_the_thread),
           (C13 + "test_early_stop_leaves_nothing_running_and_loses_no_batch",), "w0 and max_steps",
           options=WITH_THREAD),
    # C14 Misuse
    Defect("iterator_stays_open", "C14", "prefetcher",
           "keeps an epoch's `dataloader_iter` usable after the epoch, handing out the next epoch's batches",
           (prefetch_fetcher._StepIterator, "close"), _instead(lambda self: None),
           (C14 + "test_iterator_used_after_its_loop_ended",), "next_epoch"),
    Defect("iterator_per_step_call", "C14", "prefetcher",
           "closes a step's `dataloader_iter` when the step returns and hands the next call a new one",
           (_Fetcher, "end_step_call"), _after(lambda self, _: self._close_iterator()),
           (C14 + "test_iterator_is_one_object_per_epoch",)),
    Defect("empty_steps_spin", "C14", "batch_processor", "calls a step that consumes nothing forever",
           (common.NoProgressGuard, "step_returned"), _instead(lambda self, consumed: None),
           (C14 + "test_step_that_keeps_consuming_nothing_ends_with_an_error",), SIZED + " and never"),
    Defect("mixed_signature_accepted", "C14", "batch_processor",
           "accepts a step taking both a batch and `dataloader_iter`",
           (bp_training, "refuse_mixed_step_signature"), _instead(lambda step, hook_name: None),
           (C14 + "test_step_taking_a_batch_and_dataloader_iter_is_refused",)),
    Defect("foreign_stop_iteration_ends_the_epoch", "C14", "prefetcher",
           "ends the epoch on a StopIteration that did not come from `dataloader_iter`",
           (_Fetcher, "step_stopped"), _instead(_foreign_stop_ends_the_call),
           (C14 + "test_stop_iteration_not_from_the_iterator_is_an_error",), SIZED),
    # C15 Evaluation steps
    Defect("evaluation_iterator_spans_dataloaders", "C15", "prefetcher",
           "lets one evaluation step call's iterator run on into the next dataloader",
           (_Fetcher, "done_for"), _instead(lambda self, dataloader_idx: self._peek_on_every_rank() is None),
           (C15 + "test_multiple_dataloaders_one_step_call_one_dataloader",), "validate"),
    Defect("evaluation_batch_idx_spans_dataloaders", "C15", "prefetcher",
           "numbers evaluation batches across dataloaders instead of from 0 in each",
           (_Fetcher, "consume"), _after(lambda self, item, _: (item[0], self.fetched - 1, item[2])),
           (C15 + "test_multiple_dataloaders_each_sequence_once_with_its_dataloader_idx",), "validate and " + SIZED),
    # C16 Distributed
    Defect("no_end_of_data_vote", "C16", "prefetcher", "ends an uneven shard's epoch without the ranks' vote",
           (prefetch_fetcher, "every_rank_has_a_batch"), _instead(lambda trainer, has_batch: has_batch),
           (C16 + "test_uneven_shards_stop_every_rank_at_the_same_step_or_raise_the_same_error",)),
    # C17 Steps with work in flight
    Defect("never_drains", "C17", "batch_processor",
           "ends the epoch without drain calls, while a pipelining step still holds a batch",
           (_EpochLoop, "_drain_held_batches"), _instead(lambda self: None),
           (C17 + "test_pipelining_step_trains_every_batch_once_per_epoch",), "sized-w0"),
    Defect("no_drain_calls", "C17", "prefetcher",
           "ends the epoch without drain calls, while a pipelining step still holds a batch",
           (prefetch_loops._PrefetchingEpochLoop, "_drain_held_batches"), _instead(lambda self: None),
           (C17 + "test_held_batch_is_trained_at_a_limit",)),
    Defect("drain_call_logs_again", "C17", "batch_processor",
           "writes the epoch's last logger row again in a drain call that trains nothing, and a held batch's at the"
           " previous row's step", (_EpochLoop, "_drain_call"), _instead(_drain_call_logging_every_call),
           (C17 + "test_drain_calls_log_and_count_as_the_regular_flavour",), "automatic-1"),
    # C18 Lightning's own features
    Defect("lr_finder_counts_batches", "C18", "batch_processor",
           "lets the LR finder read `batch_idx` in batches, as stock Lightning's loop reports it",
           (bp_training.IteratorFitLoop, "batch_idx"), _instead(_FitLoop.batch_idx),
           (C18 + "test_lr_find_matches_the_regular_flavour",), "2-2"),
    Defect("transfer_hooks_unprofiled", "C18", "prefetcher",
           "runs the transfer hooks on its thread without recording them in the profiler",
           (common, "profiled"), _instead(lambda profiler, action, function: function),
           (C18 + "test_profiler_records_the_training_batches_actions",), "SimpleProfiler"),
    Defect("drain_call_enters_optimizer_step", "C18", "prefetcher",
           "enters the `optimizer_step` hook in a drain call before the step runs, even when it trains nothing",
           (prefetch_loops._StepCallAutomaticOptimization, "run"), _drain_call_as_any_call,
           (C18 + "test_profiler_records_the_training_batches_actions",), "SimpleProfiler"),
    Defect("writer_gets_the_last_batchs_indices", "C18", "batch_processor",
           "gives a prediction writer the sample indices of a step call's last batch only",
           (bp_evaluation.IteratorPredictionLoop, "_on_step_returned"), _writer_indices_of_the_last_batch,
           (C18 + "test_prediction_writer_gets_each_step_calls_predictions_and_indices",), "2 and sized"),
    # C19 Real pipelines: what the suite's own pipelining steps (C17, one batch held) cannot see
    Defect("drains_once", "C19", "prefetcher",
           "ends the draining after one drain call, while a pipeline still holds a second batch",
           (prefetch_loops._PrefetchingEpochLoop, "_drain_call"), _after(lambda self, ended: True),
           (C19 + "test_train_pipeline_trains_every_batch_once_per_epoch",), "TrainPipelineSparseDist and sized-w0"),
    Defect("evaluation_never_drains", "C19", "prefetcher",
           "ends an evaluation dataloader without drain calls, while the validation step still holds batches",
           (prefetch_loops._PrefetchingEvaluationLoop, "_drain_dataloader"), _instead(lambda self, idx: None),
           (C19 + "test_eval_pipeline_evaluates_every_batch_once_per_validation_run",), "sized-w0"),
)

