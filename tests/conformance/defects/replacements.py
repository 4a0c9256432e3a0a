"""What the catalogue's defects put in place of a design's attribute: each a realistic mistake."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.trainer import call

from prototypes.batches_per_call import CALL_CUT_SHORT, CutShortCallWarning
from prototypes.lightning_changes.draining import OptimizerSteps
from prototypes.prefetcher import fetcher as prefetch_fetcher
from prototypes.prefetcher import prefetch_thread
from prototypes.prefetcher import producer as prefetch_producer
from prototypes.ranks import RanksVote


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
    def next_produced(self: Any) -> Any:
        self.gets = getattr(self, "gets", 0) + 1
        if self.gets % 5 == 0 and hasattr(self, "last"):
            return self.last  # "a retry after a slow produce() hands out the previous result again"
        self.last = original(self)
        return self.last

    return next_produced


def _keeps_the_steps_first_batch_for_the_end_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def hand_out(self: Any, item: Any) -> Any:
        calls = self._calls
        first = calls.last_handed_out if calls.call.batches else None
        result = original(self, item)
        if first is not None:
            calls.last_handed_out = first
        return result

    return hand_out


def _calls_the_start_hook_per_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def hand_out(self: Any, item: Any) -> Any:
        if self._calls.call.batches:  # not the step's first batch
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
        cut_short = self._calls.call
        for counts in (self.batch_progress.total, self.batch_progress.current):
            counts.ready -= cut_short.consumed
            counts.started -= cut_short.consumed
        cut_short.batches, cut_short.batch_indices = [], []
    return output


def _step_after_a_cut_short_call(self: Any, output: Any) -> Any:
    if output is None and self.trainer.lightning_module.automatic_optimization:
        self.automatic_optimization._optimizer_step(self._calls.call.index - 1, lambda: None)
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
    state_dict.update(step_calls=self._calls.call.index, last_step_consumed=self._calls.call.consumed)
    return state_dict


def _keeps_counted_progress(self: Any, result: None, *args: Any) -> None:
    self.__dict__["counted_progress"] = self.batch_progress  # Lightning saves every progress a loop holds


def _transfer_without_after_hook(self: Any, batch: Any, dataloader_idx: int, *, pin: Any = None) -> Any:
    batch = self._before(self._convert_input(batch), dataloader_idx)
    return self._to_device(batch, self._device, dataloader_idx)


def _transfer_without_precision(self: Any, batch: Any, dataloader_idx: int, *, pin: Any = None) -> Any:
    return self._batch_to_device(self._before(batch, dataloader_idx), dataloader_idx)


def _counts_only_a_calls_first_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def count_consumed(self: Any) -> None:
        if self.current.ready == self.current.completed:  # nothing counted yet in this step call
            original(self)

    return count_consumed


def _validates_on_multiples_only(original: Callable[..., Any]) -> Callable[..., Any]:
    def should_check(self: Any, data_fetcher: Any) -> bool:
        interval = self.trainer.val_check_batch
        if self.trainer.fit_loop.prefetching_fetcher is None or not isinstance(interval, int):
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
            raise prefetch_producer.LoaderExhausted(None) from None  # "a broken batch ends the epoch"

    return produce


def _get_retyping_errors(original: Callable[..., Any]) -> Callable[..., Any]:
    def next_produced(self: Any) -> Any:
        try:
            return original(self)
        except StopIteration:
            raise
        except Exception as error:
            raise RuntimeError(f"loading failed: {error}") from error

    return next_produced


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
    self.prefetch_thread = None  # dropped, not shut down: its thread keeps running
    self.calls.head = None


def _foreign_stop_ends_the_call(self: Any) -> None:
    self.calls.call.cut_short = True


def _drain_call_logging_every_call(self: Any) -> bool:
    """A drain call that hands the loggers the last values after every call, at the previous call's logging step."""
    connector = self.trainer._logger_connector
    connector.on_batch_start(None)
    saw_end = self._run_drain_call()
    connector.on_batch_end()
    connector.update_train_step_metrics()
    return saw_end


@contextlib.contextmanager
def _drain_call_as_any_call(original: Callable[..., Any]) -> Callable[..., Any]:
    def run(self: Any, optimizer: Any, batch_idx: int, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop._data_fetcher
        if not isinstance(fetcher, prefetch_fetcher._PrefetchingIterFetcher) or not fetcher.calls.call.drain:
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


def _warns_but_keeps_the_gradients(trainer: Any, consumed: int) -> None:
    """Reports a call cut short but leaves the gradients it produced on the parameters."""
    if consumed and not trainer.fit_loop.cut_short_call_reported:
        trainer.fit_loop.cut_short_call_reported = True
        warnings.warn(CALL_CUT_SHORT.format(consumed=consumed), CutShortCallWarning, stacklevel=2)


@contextlib.contextmanager
def _counts_only_wrapper_steps(trainer: Any) -> Iterator[OptimizerSteps]:
    """Counts a drain call's optimizer steps from ``global_step``: the raw optimizer's steps go unseen."""
    steps = OptimizerSteps()
    before = trainer.global_step
    try:
        yield steps
    finally:
        if trainer.global_step > before:
            steps.configured.append(trainer.optimizers[0])


@contextlib.contextmanager
def _sees_only_configured_optimizers(trainer: Any) -> Iterator[OptimizerSteps]:
    """Records the configured optimizers' steps only: an optimizer the module made itself steps unseen."""
    steps = OptimizerSteps()
    handles = [optimizer.register_step_post_hook(lambda opt, *_: steps.configured.append(opt))
               for optimizer in trainer.optimizers]
    try:
        yield steps
    finally:
        for handle in handles:
            handle.remove()


def _discards_silently(trainer: Any, consumed: int) -> None:
    """Discards a call cut short's gradients without telling the user."""
    if consumed and not trainer.lightning_module.automatic_optimization:
        for optimizer in trainer.optimizers:
            optimizer.zero_grad()


def _divides_the_runs_batches(trainer: Any, batches_per_call: int, last_call_trained: bool = True) -> float:
    """The formula the RFC used to give: the run's batches divided by the batches per call."""
    return trainer.estimated_stepping_batches // batches_per_call


def _this_ranks_vote_alone(trainer: Any, has_batch: bool, **flags: bool) -> Any:
    """The ranks' vote started (``start_vote``) and answered from this rank alone: no collective."""
    alone = RanksVote(has_batch, flags.get("cut_short", False), flags.get("ends_within_the_next_call", False))
    return lambda: alone


def _skips_the_vote_for_equal_shards(original: Callable[..., Any]) -> Callable[..., Any]:
    """The rule before it was made safe: no vote when every training loader is a map-style dataset behind a
    DistributedSampler, as though equal shards ended every rank at the same step call whatever the calls take."""
    from torch.utils.data import DataLoader, DistributedSampler

    def needed(trainer: Any) -> bool:
        loaders = trainer.fit_loop._combined_loader.flattened
        equal = all(isinstance(loader, DataLoader) and isinstance(loader.sampler, DistributedSampler)
                    for loader in loaders)
        return original(trainer) and not equal

    return needed


def _looks_ahead_only_at_what_it_holds(self: Any, count: int, dataloader_idx: int, take_ahead: Any) -> int:
    """A look-ahead of k that counts the batches already taken from the producer and takes no more."""
    if self.head_of(dataloader_idx, self.peek()) is None:
        return 0
    return min(count, 1 + len(self.ahead))
