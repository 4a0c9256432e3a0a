"""What every design shares, through Lightning's public API only: the registry entry type, the test for the flavour,
the iterator a step call receives, the batch-transfer path and the misuse checks with their messages. The designs that
change Lightning's loops also share the record of their step calls (``prototypes.step_calls``) and the ranks' vote
(``prototypes.ranks``).

Designs import these modules and, if they change Lightning's loops, ``prototypes.lightning_changes``; they never
import each other.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.profilers import PassThroughProfiler, Profiler
from pytorch_lightning.utilities.model_helpers import is_overridden

DATALOADER_ITER = "dataloader_iter"


def takes_dataloader_iter(step: Callable[..., Any]) -> bool:
    """True when ``step`` declares a parameter named ``dataloader_iter`` (clause C1: selection by name)."""
    try:
        return DATALOADER_ITER in inspect.signature(step).parameters
    except (TypeError, ValueError):  # builtins and C callables have no inspectable signature
        return False


@dataclass(frozen=True)
class Design:
    """One registry entry: a name, a one-line summary, and how to build a configured Trainer.

    ``make_trainer(trainer_kwargs, **options)`` returns a ``pytorch_lightning.Trainer``; ``options`` are the
    design's own knobs (for example a prefetch depth). ``suite_variants`` lists extra option sets the
    conformance suite runs by default besides ``options``.

    What the benchmarks judge a design by, declared here rather than inferred from its name:
    ``prefetch_depth_option`` names the option that sets how many batches it loads ahead of the step (None: it
    does not prefetch; S4 runs it at each depth, and the overlap targets of S1 and S6 judge its ``thread_options``,
    or its default where it declares none). ``promised_s1_efficiency`` (S1 point such as ``"L=C"`` -> efficiency)
    and ``promised_s4_efficiency_at_depth`` (depth -> efficiency) are floors it promises, asserted in measure mode.

    ``thread_options`` are the options that give the design a prefetch thread when ``options`` (what ships) run
    without one: the configuration the overlap targets (S1, S6) and the RFC's thread decision judge. The decision
    rendered from those measurements and ``options`` must agree (``tests/test_render.py``): a measurement that makes
    the thread the default makes ``options`` these, or that test fails.

    ``changes_lightning_loops``: the design changes how Lightning's loops run the flavour (limits, validation points,
    logging, accumulation), so its runs must agree with those of every other design that declares it
    (``tests/conformance/test_agreement.py``). Declared, not read from the loops' types: a patched Lightning whose
    loops are Lightning's own types changes them too.

    ``unavailable_reason()``: None where this environment can run the design; otherwise why it cannot, in one
    sentence that names the command building an environment that can (a design of a patched Lightning needs that
    package installed). The default selections leave such a design out, and naming it is an error with that sentence.
    """

    name: str
    summary: str
    make_trainer: Callable[..., pl.Trainer]
    options: Mapping[str, Any] = field(default_factory=dict)
    suite_variants: tuple[Mapping[str, Any], ...] = ()
    prefetch_depth_option: str | None = None
    promised_s1_efficiency: Mapping[str, float] = field(default_factory=dict)
    promised_s4_efficiency_at_depth: Mapping[int, float] = field(default_factory=dict)
    thread_options: Mapping[str, Any] = field(default_factory=dict)
    changes_lightning_loops: bool = False
    unavailable_reason: Callable[[], str | None] = field(default=lambda: None)

    @property
    def id(self) -> str:
        """``name`` or ``name[key=value,...]``: how reports and ``--design`` spell this entry."""
        if not self.options:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v!r}' for k, v in sorted(self.options.items()))}]"

    def trainer(self, **trainer_kwargs: Any) -> pl.Trainer:
        """A ``pytorch_lightning.Trainer`` built with ``trainer_kwargs`` and configured for this design."""
        return self.make_trainer(trainer_kwargs, **self.options)

    def variant(self, **options: Any) -> Design:
        """The same design with some options changed, e.g. ``DESIGNS["prefetcher"].variant(depth=4)``."""
        accepted = list(inspect.signature(self.make_trainer).parameters)[1:]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise TypeError(
                f"design {self.name!r} has no option(s) {unknown}; its options are {accepted or 'none'}"
            )
        return replace(self, options={**self.options, **options})


# [RFC 1]
def refuse_mixed_step_signature(step: Callable[..., Any], hook_name: str) -> None:
    """Raise a clear error when a step asks for ``dataloader_iter`` *and* a batch (clause C14).

    Lightning selects the flavour by the parameter name and then calls the step with the iterator alone, so a
    ``training_step(self, batch, dataloader_iter)`` would otherwise fail with Python's "missing 1 required
    positional argument", which names neither the conflict nor the fix.
    """
    parameters = inspect.signature(step).parameters
    if DATALOADER_ITER not in parameters:
        return
    required = [
        name
        for name, p in parameters.items()
        if name not in (DATALOADER_ITER, "self")
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        taken = ", ".join(f"`{name}`" for name in required)
        raise TypeError(
            f"`{hook_name}` takes both `dataloader_iter` and {taken}: a step receives either a batch "
            f"(`{hook_name}(self, batch, batch_idx)`) or the iterator (`{hook_name}(self, dataloader_iter)`), not "
            f"both. Remove {taken} and get each batch with `batch, batch_idx, dataloader_idx = next(dataloader_iter)`,"
            " or drop `dataloader_iter` to use the regular flavour."
        )


# The misuse messages, shared by every loop that hands out dataloader_iter, so that one wording names each fix.
ITERATOR_USED_AFTER_ITS_LOOP = (
    "dataloader_iter was used after the loop over its dataloader ended (the epoch, the evaluation run or fit"
    " returned): a batch taken now would belong to no step call. Pull batches only while the loop runs, from the step"
    " or from a thread the step started (stop it when the loop ends: in TorchRec, `pipeline.reset()` at the next"
    " epoch's start), and take the new dataloader_iter the next step call receives."
)
ITERATOR_USED_AFTER_ITS_STEP = (
    "dataloader_iter was used after the {step} that received it returned. Each step call gets its own iterator:"
    " call next(dataloader_iter) only inside the step that received it (the loop counts, transfers and checkpoints"
    " batches per step call); to use a batch in a later step, keep the batch, not the iterator."
)
def warn_declined(hook_name: str, left: int) -> None:
    """The loop ends the epoch's data at a declined call (``StepCall.declined``), saying what it leaves untrained."""
    if left:
        warnings.warn(
            f"`{hook_name}(dataloader_iter)` found fewer batches left than it needs (`has_batches`) and took none, so"
            f" the epoch ends here and its last {left} batch(es) are not trained. Make the epoch a multiple of the"
            " batches each call takes (`drop_last`, or the loader's length) to train all of it.",
            stacklevel=3,
        )


STOP_ITERATION_WITH_BATCHES_LEFT = (
    "{step} raised StopIteration although dataloader_iter still has batches, so it did not come from"
    " dataloader_iter; ending here would silently skip the remaining batches. Catch StopIteration from your own"
    " iterators inside {step}."
)


def profiled(profiler: Profiler, action: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, each call recorded as ``action`` by ``profiler``, as Lightning records the hooks it calls itself;
    ``function`` itself when nothing is recorded (the ``PassThroughProfiler``): no wrapper on the per-batch path."""
    if isinstance(profiler, PassThroughProfiler):
        return function

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        with profiler.profile(action):
            return function(*args)

    return call


# [RFC 1] every batch through the transfer path
class BatchTransfer:
    """What Lightning's regular flavour does to a batch before the step (clause C4), through public API only:
    ``BatchTransfer(trainer)(batch, dataloader_idx)``.

    The precision plugin's ``convert_input``, then ``on_before_batch_transfer``, ``transfer_batch_to_device`` and
    ``on_after_batch_transfer`` (the datamodule's where it overrides them, as Lightning picks them), each recorded
    under the action name Lightning's own dispatch gives it. ``pin`` runs between the first hook and the copy.
    Why not Lightning's dispatch (``trainer._call_lightning_module_hook``): it sets ``module._current_fx_name``, which
    ``self.log`` on the main thread reads, so it cannot run on a prefetch thread; one path serves every loop.
    Why an object: the hooks, their owners and their profiler actions are resolved once per loop over the data
    (build one there), not for every batch.
    """

    def __init__(self, trainer: pl.Trainer) -> None:
        strategy, datamodule, profiler = trainer.strategy, trainer.datamodule, trainer.profiler
        module = strategy.lightning_module

        def hook(name: str) -> Callable[..., Any]:
            owner = datamodule if datamodule is not None and is_overridden(name, datamodule) else module
            kind = "LightningModule" if owner is module else "LightningDataModule"
            return profiled(profiler, f"[{kind}]{type(owner).__name__}.{name}", getattr(owner, name))

        self._convert_input = strategy.precision_plugin.convert_input
        self._before = hook("on_before_batch_transfer")
        self._to_device, self._after = hook("transfer_batch_to_device"), hook("on_after_batch_transfer")
        self._device = strategy.root_device
        self._batch_to_device_profiled = not isinstance(profiler, PassThroughProfiler)
        self._batch_to_device = profiled(
            profiler, f"[Strategy]{type(strategy).__name__}.batch_to_device", self._batch_to_device_and_after
        )

    def __call__(self, batch: Any, dataloader_idx: int, *, pin: Callable[[Any], Any] | None = None) -> Any:
        batch = self._before(self._convert_input(batch), dataloader_idx)
        if pin is not None:
            batch = pin(batch)
        if self._batch_to_device_profiled:
            return self._batch_to_device(batch, dataloader_idx)
        # Why not `_batch_to_device_and_after`: unprofiled, the same two calls without a method's frame per batch
        return self._after(self._to_device(batch, self._device, dataloader_idx), dataloader_idx)

    def _batch_to_device_and_after(self, batch: Any, dataloader_idx: int) -> Any:
        return self._after(self._to_device(batch, self._device, dataloader_idx), dataloader_idx)


StepItem = tuple[Any, int, int]  # (batch, batch_idx, dataloader_idx): what ``next(dataloader_iter)`` returns


# [RFC 1] the iterator a step call receives
class StepIterator(Iterator):
    """What ``*_step(self, dataloader_iter)`` receives (clause C14 a).

    The contract: one object for every step call over one dataloader (in training: the epoch), as stock Lightning
    hands out, valid until the loop over that dataloader ends; a ``next()`` between step calls (a pipeline's own
    loading thread) hands out the next batch, counted toward the next call. A subclass hands out the next
    ``(batch, batch_idx, dataloader_idx)`` in ``_take`` (StopIteration when none remains), says in ``_has_next``
    whether one remains and in ``_available(k)`` how many of the next k remain, handing none out (what
    ``has_batches`` answers; one that cannot look ahead leaves it raising). ``done`` is exact (C5). Once the
    loop closes the iterator, ``next()`` raises an error naming the fix (``closed_message``): a batch taken then would
    belong to no step call. A loop that hands each call a new iterator and closes it when the call returns sets
    ``ITERATOR_USED_AFTER_ITS_STEP``, stricter than the contract.
    """

    closed_message = ITERATOR_USED_AFTER_ITS_LOOP

    def __init__(self, step: str) -> None:
        self._step = step
        self._closed = False

    def _take(self) -> StepItem:
        raise NotImplementedError

    def _has_next(self) -> bool:
        raise NotImplementedError

    def _available(self, count: int) -> int:
        """How many of the next ``count`` batches remain (a look-ahead of ``count``); a subclass records an answer
        below ``count`` in the running call (``StepCall.fewer_left``)."""
        raise NotImplementedError(
            f"this loop's dataloader_iter has no look-ahead: {type(self).__name__}.has_batches is not supported"
        )

    def __next__(self) -> StepItem:
        if self._closed:
            raise RuntimeError(self.closed_message.format(step=self._step))
        return self._take()

    @property
    def done(self) -> bool:
        """True once the last batch of this dataloader (in training: of the epoch) has been handed out."""
        if self._closed:
            raise RuntimeError(self.closed_message.format(step=self._step))
        return not self._has_next()

    # [RFC 1] a look-ahead of k: a step need not start a call it cannot finish
    def has_batches(self, count: int) -> bool:
        """Whether at least ``count`` more batches remain for this iterator, without taking any.

        Why: a step that needs ``count`` batches per call (a micro-batching schedule, a pipeline stage that receives
        before it pulls) must not start a call the data would cut short: in a pipeline, the stage that runs out
        stops while its peer waits for it. A training step that gets False and takes no batch ends its data there;
        the loop warns how many batches were left untrained and makes its drain calls (C17), where this is False too.
        """
        if self._closed:
            raise RuntimeError(self.closed_message.format(step=self._step))
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"has_batches(count) takes a whole number of batches, count >= 1, got {count!r}")
        return self._available(count) >= count

    def close(self) -> None:
        self._closed = True
