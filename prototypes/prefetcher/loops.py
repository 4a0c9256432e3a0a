"""Lightning's loops with the prefetching fetcher installed: what this design changes beyond
``prototypes.lightning_changes``."""


from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.evaluation_loop import _EvaluationLoop
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from pytorch_lightning.loops.prediction_loop import _PredictionLoop
from pytorch_lightning.loops.progress import _BatchProgress
from pytorch_lightning.trainer import call

from prototypes.common import refuse_mixed_step_signature, takes_dataloader_iter
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ConsumedBatchProgress,
    ConsumedProgress,
    CountsConsumed,
    ManualOptimizationSeesStopIteration,
    PredictionWriterSeesStepCalls,
    StepFirstAutomaticOptimization,
    StockProfilerActions,
    discard_cut_short_call,
    drain,
    evaluation_drain_call,
    prediction_drain_call,
    supply_log_batch_size,
)
from prototypes.prefetcher.fetcher import FetcherStepIterator, _PrefetchingIterFetcher
from prototypes.prefetcher.options import RunResources
from prototypes.prefetcher.threaded import fetcher_for
from prototypes.ranks import RanksVote


class _StepCallAutomaticOptimization(StepFirstAutomaticOptimization):
    """The shared step-first automatic optimisation, for step calls the prefetching fetcher hands an iterator to."""

    def run(self, optimizer: torch.optim.Optimizer, batch_idx: int, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is None:
            return super().run(optimizer, batch_idx, kwargs)
        return self.run_fetched_step_call(fetcher, optimizer, kwargs)

    def run_fetched_step_call(
        self, fetcher: _PrefetchingIterFetcher, optimizer: torch.optim.Optimizer, kwargs: Any
    ) -> Any:
        """A step call fed by the prefetching fetcher: the step-first optimisation, with the call's end of data."""
        calls = fetcher.calls
        step_call_idx = calls.call.index - 1
        try:
            output = self.run_step_call(
                kwargs, optimizer, calls.call, fetcher.data_ended_after_call,
                fetcher.backward_ended if calls.ranks_vote else None,  # one rank: nothing to start as backward ends
                fetcher.before_synced_backward if calls.carrier is not None else None,
            )
        except StopIteration:
            fetcher.step_stopped()
            # Why: the step's next() found the end of the data: no backward ran, earlier calls' gradients are still
            # pending. Returning lets Lightning's loop finish the call as usual (end hooks, batch counts).
            fetcher.end_step_call()
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
            self.close_window(step_call_idx)
            discard_cut_short_call(self.trainer, fetcher.calls.call.consumed)
            return {}
        finally:
            if fetcher.calls.call.open:  # Why ask: mostly the call read the data's end, which closed it
                fetcher.end_step_call()
        return output


class _StepCallManualOptimization(ManualOptimizationSeesStopIteration):
    def run(self, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is None:
            return super().run(kwargs)
        try:
            return super().run(kwargs)
        except StopIteration:
            fetcher.step_stopped()  # the end of the data ends the call; any other StopIteration is an error
            discard_cut_short_call(self.trainer, fetcher.calls.call.consumed)
            return {}
        finally:
            fetcher.end_step_call()


class _PrefetchingEpochLoop(BatchCountingEpochLoop):
    """Lightning's training epoch loop with the shared changes, active while the prefetching fetcher is installed."""

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1, **_: Any) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.batch_progress = ConsumedBatchProgress()
        self.automatic_optimization = _StepCallAutomaticOptimization(trainer)
        self.manual_optimization = _StepCallManualOptimization(trainer)

    def _steps_pull_batches(self) -> bool:
        return self.trainer.fit_loop.prefetching_fetcher is not None

    def _step_calls_this_epoch(self) -> int:
        return self.trainer.fit_loop.prefetching_fetcher.calls.call.index

    def _consumed_by_last_call(self) -> int:
        return self.trainer.fit_loop.prefetching_fetcher.calls.call.consumed

    def _pulled_ahead(self) -> bool:
        return self.trainer.fit_loop.prefetching_fetcher.calls.pulled_ahead()

    def _drain_rule(self) -> str:
        return self.trainer.fit_loop.prefetching_fetcher.drain_rule

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        self.automatic_optimization.start_epoch()
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is not None:  # the drain rule cannot see the calls before the checkpoint
            fetcher.calls.taken.resumed_mid_epoch = self.batch_progress.current.ready > 0

    def advance(self, data_fetcher: _DataFetcher) -> None:
        super().advance(data_fetcher)
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        # Why ask first: on one rank there is nothing to do before the data's end, and this runs after every call.
        # Why the record's `ranks_vote`, not `_ranks_vote_every_step()`: the same answer without a call; it goes off
        # only where the ranks agreed the data ended, which made this the last batch
        if fetcher is not None and (self.batch_progress.is_last_batch or fetcher.calls.ranks_vote):
            self._drain_if_the_data_ended(fetcher.calls.call.cut_short)

    def _vote_after_drain_call(self) -> Callable[[bool], RanksVote]:
        return self.trainer.fit_loop.prefetching_fetcher.calls.vote_after_drain_call

    def _vote_since_the_last_call(self) -> RanksVote | None:
        calls = self.trainer.fit_loop.prefetching_fetcher.calls
        calls.peek_on_every_rank()  # the ranks vote here unless they did since the last call (or do not vote)
        return calls.last_vote if calls.voted_before_call == calls.call.index else None

    def _a_rank_ends_within_this_call(self) -> bool:
        calls = self.trainer.fit_loop.prefetching_fetcher.calls
        vote = calls.last_vote
        # the vote before this call was made after the previous one (or before the epoch's first)
        return vote is None or calls.voted_before_call != calls.call.index - 1 or vote.a_rank_ends_within_the_next_call

    @contextlib.contextmanager
    def _draining(self) -> Iterator[None]:
        with self.trainer.fit_loop.prefetching_fetcher.calls.drain_calls():
            yield

    def _run_drain_call(self) -> tuple[bool, Any]:
        trainer = self.trainer
        fetcher = trainer.fit_loop.prefetching_fetcher
        kwargs = OrderedDict(any=fetcher.start_step_call(drain=True))
        with trainer.profiler.profile("run_training_batch"):
            if trainer.lightning_module.automatic_optimization:
                outputs = self.automatic_optimization.run(trainer.optimizers[0], fetcher.batch_idx, kwargs)
            else:
                outputs = self.manual_optimization.run(kwargs)
        return fetcher.calls.call.cut_short, outputs


class _InstallsPrefetchingFetcher:
    """What every loop of the design changes: the fetcher installed for a step taking ``dataloader_iter``."""

    trainer: pl.Trainer
    resources: RunResources  # the run's, with the design's options
    step_name: str
    _drain_dataloader: Callable[[int], None] | None = None  # the drain calls at a dataloader's end, where drained
    prefetching_fetcher: _PrefetchingIterFetcher | None = None
    """The installed fetcher if it is the design's (the step takes ``dataloader_iter``), else None.

    Why an attribute set with the fetcher: the loops ask on every batch, several times (Lightning calls
    ``_accumulated_batches_reached`` six times per batch), and what runs per batch does no type check (the per-batch
    rules, ``prototypes.lightning_changes``). The fetcher changes only in the setter below."""

    @property
    def counted_progress(self) -> CountsConsumed:
        """The batch progress that counts consumed batches. Why a property: Lightning saves every progress object a
        loop holds as an attribute, and a checkpoint must hold what stock Lightning's loops hold (C1)."""
        return self.batch_progress  # type: ignore[attr-defined]

    # Why its own attribute, not ``self.__dict__["_data_fetcher"]``: a loop keeps its inline attribute layout (the
    # per-batch rules, ``prototypes.lightning_changes``)
    _installed_fetcher: _DataFetcher | None = None

    @property
    def _data_fetcher(self) -> _DataFetcher | None:
        return self._installed_fetcher

    @_data_fetcher.setter
    def _data_fetcher(self, fetcher: _DataFetcher | None) -> None:
        # Why a setter: the loops assign Lightning's choice (`_select_data_fetcher`) and use it. The fit loop assigns
        # it before setup/iter, so the replacement starts the loader itself; the evaluation loops assign it set up
        # and iterated, so the replacement adopts its loader iterator. Either way the workers start once.
        if type(fetcher) is _DataLoaderIterDataFetcher:
            refuse_mixed_step_signature(getattr(self.trainer.lightning_module, self.step_name), self.step_name)
            started = fetcher
            fetcher = fetcher_for(
                self.trainer, self.resources, self.step_name, self.counted_progress, self._drain_dataloader
            )
            if started.iterator is not None:
                fetcher.adopt(started)
        self._installed_fetcher = fetcher
        self.prefetching_fetcher = fetcher if isinstance(fetcher, _PrefetchingIterFetcher) else None
        if fetcher is not None:
            self.counted_progress.counts_consumed = self.prefetching_fetcher is not None

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        self.resources.end_run()


# [RFC 2]
class _PrefetchingEvaluationSteps(_InstallsPrefetchingFetcher):
    """The evaluation and prediction loops: Lightning's, with the design's fetcher and one call per dataloader."""

    def __init__(self, *args: Any, resources: RunResources, **kwargs: Any) -> None:
        self.resources = resources
        super().__init__(*args, **kwargs)
        # the counting twin of the class Lightning's loop chose (prediction keeps a `_Progress`, without is_last_batch)
        counting = ConsumedBatchProgress if isinstance(self.batch_progress, _BatchProgress) else ConsumedProgress
        self.batch_progress = counting()

    def run(self) -> Any:
        if not takes_dataloader_iter(getattr(self.trainer.lightning_module, self.step_name)):
            return super().run()  # type: ignore[misc]
        # Why shadow the strategy's step on the instance: Lightning calls the step through it, the one frame between
        # the user's step and the loop, which ends the whole run (every dataloader) at a StopIteration.
        strategy = self.trainer.strategy
        # Why keep a shadow already there: a run inside this run (the batch-size finder's trials, started from
        # on_validation_start) must leave the step shadowed for the rest of the outer run.
        outer_run_shadows = isinstance(getattr(strategy, self.step_name), _ShadowedStep)
        if not outer_run_shadows:
            setattr(strategy, self.step_name, _ShadowedStep(_step_call, self, getattr(strategy, self.step_name)))
        try:
            return super().run()  # type: ignore[misc]
        finally:
            if not outer_run_shadows:
                delattr(strategy, self.step_name)
            if isinstance(self._data_fetcher, _PrefetchingIterFetcher):
                self._data_fetcher.stop()  # Why: the prefetch thread must not outlive the evaluation run

    def _on_step_returned(self, output: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
        """After each step call, before its batch-end hooks; ``consumed``: the ``batch_idx`` of each batch it took."""

    def _run_drain_call(self) -> tuple[bool, Any]:
        """One drain call at the end of the current dataloader: whether a StopIteration ended it, and its output."""
        fetcher = self._data_fetcher
        # through the strategy, whose step ``run`` shadows with ``_step_call``: the call ends as any call does
        output = call._call_strategy_hook(self.trainer, self.step_name, fetcher.start_step_call(drain=True))
        return fetcher.calls.call.cut_short, output


class _ShadowedStep(functools.partial):
    """The strategy's evaluation step as ``run`` shadows it: ``_step_call`` around the strategy's own."""


def _step_call(
    loop: _PrefetchingEvaluationSteps, step: Callable[..., Any], dataloader_iter: Any, *args: Any, **kwargs: Any
) -> Any:
    """An evaluation step call: the StopIteration at the end of its dataloader ends the call (returning None)."""
    if not isinstance(dataloader_iter, FetcherStepIterator):
        return step(dataloader_iter, *args, **kwargs)
    fetcher = loop._data_fetcher
    try:
        output = step(dataloader_iter, *args, **kwargs)
    except StopIteration:
        fetcher.step_stopped()
        output = None
    finally:
        fetcher.end_step_call()
    step_call = fetcher.calls.call
    if not step_call.drain:  # a drain call's output is its drain rule's to place (`evaluation_drain_call` and kin)
        loop._on_step_returned(output, dataloader_iter.dataloader_idx, step_call.batch_indices, step_call.cut_short)
    return output


class _PrefetchingEvaluationLoop(StockProfilerActions, _PrefetchingEvaluationSteps, _EvaluationLoop):
    @property
    def step_name(self) -> str:
        return "test_step" if self.trainer.testing else "validation_step"

    def _drain_dataloader(self, dataloader_idx: int) -> None:
        """The drain calls at the end of a dataloader's batches (C17 for evaluation), before the loop moves on."""
        with self._data_fetcher.calls.drain_calls():
            drain_call = functools.partial(evaluation_drain_call, self, dataloader_idx, self._run_drain_call)
            drain(self.trainer, drain_call, self.step_name, self._data_fetcher.calls.vote_after_drain_call)


class _PrefetchingPredictionLoop(
    StockProfilerActions, PredictionWriterSeesStepCalls, _PrefetchingEvaluationSteps, _PredictionLoop
):
    step_name = "predict_step"

    def _drain_dataloader(self, dataloader_idx: int) -> None:
        """The drain calls at the end of a dataloader's batches (C17 for prediction), before the loop moves on."""
        calls = self._data_fetcher.calls
        with calls.drain_calls():
            drain_call = functools.partial(
                prediction_drain_call, self, dataloader_idx, self._run_drain_call, lambda: calls.call.batch_indices
            )
            drain(self.trainer, drain_call, self.step_name, calls.vote_after_drain_call)

    def _predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int, dataloader_iter: Any) -> None:
        super()._predict_step(batch, batch_idx, dataloader_idx, dataloader_iter)
        fetcher = self.prefetching_fetcher
        if fetcher is not None and fetcher.calls.call.cut_short and self.return_predictions:
            # Why: a call ended by StopIteration returned no prediction; Lightning stored its None
            self._predictions[fetcher.dataloader_idx].pop()


class _PrefetchingFitLoop(_InstallsPrefetchingFetcher, BatchCountingFitLoop):
    """Lightning's fit loop; the one change is which fetcher ``setup_data`` installs for the training step."""

    step_name = "training_step"

    def __init__(self, trainer: pl.Trainer, *, resources: RunResources, **kwargs: Any) -> None:
        self.resources = resources
        super().__init__(trainer, **kwargs)

    @property
    def counted_progress(self) -> ConsumedBatchProgress:
        return self.epoch_loop.batch_progress  # type: ignore[return-value]

    def run(self) -> None:
        module = self.trainer.lightning_module
        if not takes_dataloader_iter(module.training_step):
            return super().run()
        undo = supply_log_batch_size(module, self._step_batches)
        try:
            super().run()
        finally:
            undo()

    def _step_batches(self) -> list[Any] | None:
        return self.prefetching_fetcher.step_batches() if self.prefetching_fetcher is not None else None

    def advance(self) -> None:
        try:
            super().advance()
        finally:
            # Why: the prefetch thread must not outlive the epoch, whether it ended, stopped early or raised.
            if self.prefetching_fetcher is not None:
                self.prefetching_fetcher.stop()

    def consumed_loader_states(self) -> list[dict] | None:
        return self.prefetching_fetcher.consumed_loader_states if self.prefetching_fetcher is not None else None
