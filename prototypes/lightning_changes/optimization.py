"""The optimisation loops: the optimizer step decided after the step returns (automatic), and a step's StopIteration
seen by the loop (manual)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.optimization.automatic import Closure, _AutomaticOptimization
from pytorch_lightning.loops.optimization.manual import _ManualOptimization
from pytorch_lightning.loops.utilities import _block_parallel_sync_behavior
from torch.nn.parallel import DistributedDataParallel

from prototypes.batches_per_call import CALL_CUT_SHORT, CutShortCallWarning
from prototypes.step_calls import StepCall


# ----------------------------------------------------------------------- [RFC 1] the optimizer step after the step
class StepFirstAutomaticOptimization(_AutomaticOptimization):
    """Lightning's automatic optimisation, with the optimizer step (or accumulation) decided after the step returns.

    Lightning calls ``optimizer.step(closure)`` and runs the step inside it, deciding beforehand whether to step.
    When the step pulls its batches, only its return tells whether it took the epoch's last batch (which closes the
    accumulation window), and a call cut short by StopIteration must not reach ``optimizer.step`` at all. Here
    Lightning's closure (step, zero_grad, backward) runs first; then the optimizer steps with the loss already
    computed, or the window stays open. The step call's index in the epoch stands in for ``batch_idx``: windows and
    the optimizer hooks count step calls (C9); a drain call (C17) is a window of its own. ``run`` stays Lightning's.
    Under DDP a call inside a window skips the gradient all-reduce, as Lightning's does (``blocks_gradient_sync``);
    a window closed by a call that skipped it is synchronised once when it closes (``close_window``).
    """

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self._window_open = False  # gradients accumulated since the last optimizer step
        self._window_loss: torch.Tensor | None = None  # the loss of the window's last call
        self._window_unsynced = False  # the window's last backward skipped DDP's gradient all-reduce

    def start_epoch(self) -> None:
        """The epoch's first step call starts a window."""
        self._window_open, self._window_loss, self._window_unsynced = False, None, False

    def run_step_call(
        self, kwargs: Any, optimizer: torch.optim.Optimizer, call: StepCall, data_ended: Callable[[], bool],
        backward_ended: Callable[[], None] | None = None, before_synced_backward: Callable[[], None] | None = None,
    ) -> dict:
        """One step call, ``call`` its record; ``data_ended()`` says whether it took the epoch's last batch. The ranks'
        vote rides in a backward that syncs (``before_synced_backward()`` runs first), else ``backward_ended()`` starts
        it after the backward to travel while the optimizer steps (a paired drain call's vote follows its backward:
        collectives keep one order on every rank). A drain or declining call that computed no loss steps nothing.

        A StopIteration from the step propagates (no backward ran): the loop tells the end of the data from a stray
        one, then calls :meth:`close_window`, as Lightning steps on an epoch's final batch even mid-window.
        """
        trainer, step_call_idx = self.trainer, call.index - 1
        # a drain call is a window of its own, so it zeroes (Lightning zeroes at multiples of accumulate_grad_batches)
        zero_grad = self._zero_grad_fn_of_a_drain_call if call.drain and not self._skip_backward else None
        # Why accumulate_grad_batches first: without accumulation no call skips the sync and every call closes its
        # window, and asking the strategy and the loop is a chain of calls on every batch
        every_call_closes = trainer.accumulate_grad_batches == 1 or trainer.strategy.handles_gradient_accumulation
        blocked = not every_call_closes and blocks_gradient_sync(trainer, call)
        closure = Closure(
            step_fn=self._make_step_fn(kwargs),
            backward_fn=first_where_synced(before_synced_backward, self._make_backward_fn(optimizer), blocked),
            zero_grad_fn=(zero_grad or self._make_zero_grad_fn)(step_call_idx, optimizer),
        )
        if blocked:
            with _block_parallel_sync_behavior(trainer.strategy):
                closure()
        else:  # Why not the context manager with block=False: it does nothing, in a generator's frames on every batch
            closure()
        result = closure.consume_result()
        if backward_ended is not None:
            backward_ended()
        if result.loss is None and (call.drain or call.declined):
            return {}  # it only saw the end: no optimizer hook, as for a call Lightning never makes
        if result.loss is not None:  # a backward ran: DDP synchronised what the window holds, or it did not
            self._window_unsynced = blocked
        self._window_open, self._window_loss = True, result.loss
        if every_call_closes:
            self.close_window(step_call_idx)
        # Why after close_window where every call closes its window: the ranks' vote travels during the optimizer step
        if data_ended():
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
        if not (every_call_closes or trainer.fit_loop._should_accumulate()):
            self.close_window(step_call_idx)  # by its index, or at the data's end
        return {} if result.loss is None else result.asdict()

    def close_window(self, step_call_idx: int) -> None:
        """Step the optimizer for the open window with the loss its last call computed; nothing if none is open. A
        window whose last backward skipped DDP's gradient all-reduce (the data's end closed it unforeseen) has its
        gradients averaged over the ranks first, once."""
        if not self._window_open:
            return
        if self._window_unsynced:
            average_gradients_over_ranks(self.trainer.strategy.model)
            self._window_unsynced = False
        loss, evaluated = self._window_loss, []

        def computed_loss() -> Any:
            # the closure's loss was computed already; mixed-precision plugins skip the step if it is None
            if evaluated:
                raise RuntimeError(
                    "the optimizer evaluated its closure more than once (as LBFGS does); with"
                    " training_step(self, dataloader_iter) each evaluation would need new batches. Use manual"
                    " optimisation (self.automatic_optimization = False) and call optimizer.step(closure) yourself."
                )
            evaluated.append(True)
            return loss

        self._optimizer_step(step_call_idx, computed_loss)
        self._window_open, self._window_loss = False, None

    def _zero_grad_fn_of_a_drain_call(self, batch_idx: int, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def zero_grad_fn() -> None:
            self._on_before_zero_grad(optimizer)
            self._optimizer_zero_grad(batch_idx, optimizer)

        return zero_grad_fn


# [RFC 3]
def first_where_synced(
    before: Callable[[], None] | None, backward_fn: Callable[[torch.Tensor], None] | None, blocked: bool
) -> Callable[[torch.Tensor], None] | None:
    """``backward_fn``, calling ``before()`` first where given and the backward all-reduces the gradients under DDP
    (no accumulation window ``blocked`` it): the step returned its loss, and the ranks' vote rides in that all-reduce
    (``ranks.VoteInGradients``). Lightning calls it only with a loss."""
    if before is None or backward_fn is None or blocked:
        return backward_fn

    def backward(loss: torch.Tensor) -> None:
        before()
        backward_fn(loss)

    return backward


# [RFC 1]
def blocks_gradient_sync(trainer: pl.Trainer, call: StepCall) -> bool:
    """Whether this call's backward skips DDP's gradient all-reduce, decided before it runs, alike on every rank:
    a call inside an accumulation window that neither its index nor any rank's look-ahead (the ranks' vote
    before the call, ``_a_rank_ends_within_this_call``) says closes it. Lightning decides the same before the
    call, from the batch count and its look-ahead of one batch; a step pulling batches may end the data
    unforeseen (it took more than the look-ahead assumed), and ``StepFirstAutomaticOptimization.close_window`` then
    synchronises once.
    Only DDP's all-reduce can be run again after the fact: other strategies synchronise every backward."""
    accumulate = trainer.accumulate_grad_batches
    if accumulate == 1 or call.drain or call.index % accumulate == 0:
        return False
    if trainer.strategy.handles_gradient_accumulation or not isinstance(trainer.strategy.model,
                                                                       DistributedDataParallel):
        return False
    return not trainer.fit_loop.epoch_loop._a_rank_ends_within_this_call()


# [RFC 1]
def average_gradients_over_ranks(model: DistributedDataParallel) -> None:
    """What DDP's backward does to the gradients, done once after the fact: each parameter's gradient averaged over
    the model's process group, in one all-reduce of them all. Every rank calls it at the same point (its window's
    close, which the ranks agree on), so each gives the same parameters in the same order; a parameter without a
    gradient on this rank contributes zeros and keeps none."""
    import torch.distributed as dist

    parameters = [p for p in model.parameters() if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in parameters])
    dist.all_reduce(flat, group=model.process_group)
    flat /= dist.get_world_size(model.process_group)
    for parameter, averaged in zip(parameters, flat.split([p.numel() for p in parameters]), strict=True):
        if parameter.grad is not None:
            parameter.grad.copy_(averaged.view_as(parameter))


# ----------------------------------------------------------------------- [RFC 1] misuse: a stray StopIteration
class _StepRaisedStopIteration(Exception):
    """Carries a step's StopIteration past Lightning's manual-optimisation loop, which suppresses it."""


# [RFC 1]
class ManualOptimizationSeesStopIteration(_ManualOptimization):
    """Lightning's manual optimisation, except that a ``StopIteration`` raised by the step reaches the caller.

    Why: ``_ManualOptimization.run`` wraps the step in ``suppress(StopIteration)`` (stock Lightning uses the
    exception only to end the epoch). A loop that tells the end of data from a stray ``StopIteration`` (C14 f) and
    ends the epoch on the former must see it under manual optimisation as under automatic optimisation.
    """

    def advance(self, kwargs: Any) -> None:
        try:
            super().advance(kwargs)
        except StopIteration as stop:
            raise _StepRaisedStopIteration from stop

    def run(self, kwargs: Any) -> Any:
        try:
            return super().run(kwargs)
        except _StepRaisedStopIteration as carried:
            raise carried.__cause__ from None


# ----------------------------------------------------------------------- [RFC 1] a call cut short
def discard_cut_short_call(trainer: pl.Trainer, consumed: int) -> None:
    """A training step call that took ``consumed`` batches was cut short by the end of the data (C5): no optimizer
    steps on them. Under manual optimisation the call may have run backward on some of them (Megatron's schedule runs
    each micro-batch's backward before it pulls the next): the loop zeroes every configured optimizer's gradients, so
    none reaches the next epoch's first step whatever the step's order of zero_grad and step (under automatic
    optimisation no backward ran). The first such call of a fit with batches warns (``CutShortCallWarning``)."""
    if not consumed:
        return  # a call that found the end at its first next() trained nothing
    if not trainer.lightning_module.automatic_optimization:
        for optimizer in trainer.optimizers:
            optimizer.zero_grad()
    fit_loop = trainer.fit_loop
    if not fit_loop.cut_short_call_reported:
        fit_loop.cut_short_call_reported = True
        warnings.warn(CALL_CUT_SHORT.format(consumed=consumed), CutShortCallWarning, stacklevel=2)
