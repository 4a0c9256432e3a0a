"""What every design shares, through Lightning's public API only: the registry entry type, the test for the flavour,
the iterator a step call receives and the record of an epoch's step calls, the batch-transfer path, the DDP vote and
the misuse checks with their messages.

Designs import this module and, if they change Lightning's loops, ``prototypes.lightning_changes``; they never
import each other.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
import weakref
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


# [RFC 8] under DDP the ranks agree on the end of data, in the one collective stock Lightning makes per step call
@dataclass(frozen=True)
class RanksVote:
    """What the ranks agreed between two step calls (``vote``): whether every rank makes another call (it has a
    batch, or it drains batches it holds), whether any rank's last call was cut short by its data's end, whether any
    rank's look-ahead sees its data end within the next call, whether every rank's step pulled batches ahead
    (``pulled_ahead``: the drain rule), rank 0's SIGTERM flag (what stock Lightning broadcasts before every call),
    and whether every rank makes another call over the current dataloader (a batch of it, or a drain call)."""

    every_rank_has_a_batch: bool
    a_call_was_cut_short: bool = False
    a_rank_ends_within_the_next_call: bool = False
    sigterm: bool = False
    every_rank_pulled_ahead: bool = False
    every_rank_continues_the_dataloader: bool = False

    def drains(self, rule: str) -> bool:
        """Whether the ranks make drain calls after the call that ended a dataloader's data, by what they agreed: no
        rank's call was cut short, and every rank continues the dataloader or, by ``rule``, every rank pulled ahead."""
        return not self.a_call_was_cut_short and (
            self.every_rank_continues_the_dataloader or makes_drain_calls(rule, self.every_rank_pulled_ahead)
        )


def vote(
    trainer: pl.Trainer, has_batch: bool, *, cut_short: bool = False, ends_within_the_next_call: bool = False,
    pulled_ahead: bool = False, continues_the_dataloader: bool = False,
) -> RanksVote:
    """The ranks' vote on the end of data (``start_vote``), read at once."""
    return start_vote(
        trainer, has_batch, cut_short=cut_short, ends_within_the_next_call=ends_within_the_next_call,
        pulled_ahead=pulled_ahead, continues_the_dataloader=continues_the_dataloader,
    )()


def start_vote(
    trainer: pl.Trainer, has_batch: bool, *, cut_short: bool = False, ends_within_the_next_call: bool = False,
    pulled_ahead: bool = False, continues_the_dataloader: bool = False, carrier: VoteInGradients | None = None,
) -> Callable[[], RanksVote]:
    """The ranks' vote on the end of data: one all-reduce(MAX) of six flags, started here; the function it returns
    waits for it and reads its result (one host read). With a ``carrier``, called where a step call's backward is
    about to all-reduce the gradients, the flags ride in that all-reduce instead (``VoteInGradients``).

    Why: under DDP each step call ends in a gradient all-reduce. A rank whose data ends early and stops would leave
    its peers blocked in that collective until the process-group timeout (the hang of HF Accelerate #2258), so all
    ranks must stop at the same step call. Why the flags in one collective: stock Lightning already broadcasts rank
    0's SIGTERM flag before every step call (``_TrainingEpochLoop._broadcast_sigterm_tensor``, a collective and a
    host sync); carried here (only rank 0 sets it, so MAX is that broadcast), it makes the vote cost no collective
    and no host sync that stock does not pay. Why started apart from its reading: unlike a broadcast, whose root
    need not wait for its peers, an all-reduce waits for the slowest rank; started as a step call's backward ends and
    read after its optimizer step, that wait overlaps the optimizer step. Why "every rank pulled ahead" rather than
    "any": a drain call in which one rank trains a held batch and a peer, holding none, ends the draining would pair
    that batch's gradient all-reduce with nothing; the ranks drain only where all hold batches.

    Why a rank that holds batches counts as having one (``has_batch``, ``continues_the_dataloader``): a pipeline's
    own loading thread (TorchRec's ``EvalPipelineSparseDist``) takes a dataloader's last batch inside a call on one
    rank and just after it on another, so one rank's data ends a call before its peer's. The first then makes a drain
    call where the peer makes a regular one, each training one batch: their calls, and the votes after them, pair.
    Without a process group it answers from this rank alone.
    """
    import torch
    import torch.distributed as dist

    received_sigterm = bool(getattr(trainer, "received_sigterm", False))
    if not (dist.is_available() and dist.is_initialized()) or trainer.world_size == 1:
        alone = RanksVote(has_batch, cut_short, ends_within_the_next_call, received_sigterm, pulled_ahead,
                          continues_the_dataloader)
        return lambda: alone
    sigterm = received_sigterm and trainer.global_rank == 0
    flags = [int(sigterm), int(not has_batch), int(cut_short), int(ends_within_the_next_call), int(not pulled_ahead),
             int(not continues_the_dataloader)]
    agreed = torch.tensor(flags, device=trainer.strategy.root_device)

    def agreed_on(flags_set: list) -> RanksVote:
        sigterm_flag, a_rank_has_none, cut, ends, a_rank_did_not_pull_ahead, a_rank_ends_it = flags_set
        return RanksVote(not a_rank_has_none, bool(cut), bool(ends), bool(sigterm_flag), not a_rank_did_not_pull_ahead,
                         not a_rank_ends_it)

    def explain(error: RuntimeError) -> None:
        if cut_short:
            raise RuntimeError(VOTE_FAILED_AFTER_A_CALL_CUT_SHORT.format(rank=trainer.global_rank)) from error

    def start() -> Callable[[], RanksVote]:
        try:
            work = dist.all_reduce(agreed, op=dist.ReduceOp.MAX, async_op=True)
        except RuntimeError as error:  # torch.distributed's DistError and the backends' timeouts
            explain(error)
            raise

        def read() -> RanksVote:
            try:
                work.wait()
            except RuntimeError as error:
                explain(error)
                raise
            return agreed_on(agreed.tolist())

        return read

    if carrier is None:
        return start()
    carrier.pending = agreed

    def read_carried() -> RanksVote:
        # Why a vote of its own where nothing carried it: a loss no parameter contributes to runs a backward without
        # DDP's all-reduce on every rank alike, and stock Lightning trains on
        carried = carrier.take()
        return start()() if carried is None else agreed_on(carried)

    return read_carried


# [RFC 8] the vote rides in DDP's gradient all-reduce where a step call's backward makes one
class VoteInGradients:
    """The ranks' vote carried in DDP's gradient all-reduce of a step call's backward: no collective of its own.

    Why: a vote in a collective of its own, even in the place of stock Lightning's SIGTERM broadcast, is a second
    meeting of the ranks per call beside the gradients' all-reduce, and an all-reduce waits for the slowest rank
    where a broadcast's root does not (on two ranks of a small step, about a tenth of the call). A call whose
    backward all-reduces the gradients meets the peers there anyway: its flags ride at the end of DDP's first bucket
    (bucket 0, the first ready and at most DDP's first-bucket cap unless one parameter is larger: the one copy this
    costs), summed with the peers' (a flag is set on some rank where its sum is positive); the one host read of the
    result replaces stock's read of the broadcast flag.

    Installed as the DDP model's communication hook (``install``) for a fit of the flavour under automatic
    optimisation: DDP takes one hook, so where a hook is registered already (a user's compression, DDP's mixed
    precision) the vote keeps its own all-reduce. Every other bucket gets DDP's default all-reduce. A call whose
    backward skips the sync (inside an accumulation window) or runs none votes in its own all-reduce, alike on every
    rank: DDP's reducer syncs on every rank or none.
    """

    def __init__(self, model: Any) -> None:
        self.group = model.process_group
        self.pending: Any = None  # the flags for the next synced backward's first bucket
        self.carried: Any = None  # the ranks' flags summed, once that bucket's all-reduce completed

    @staticmethod
    def install(trainer: pl.Trainer) -> VoteInGradients | None:
        """The carrier of the training step calls' votes on the trainer's DDP model, registered there on first use;
        None where the vote keeps its own all-reduce (one rank, manual optimisation, no DDP model, a hook of its
        own, DDP's compiled reducer, which calls hooks per parameter)."""
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if not (isinstance(model, DistributedDataParallel) and end_of_data_vote_needed(trainer)
                and trainer.lightning_module.automatic_optimization):
            return None
        carrier = _VOTE_CARRIERS.get(model)
        if carrier is None and not (model._comm_hooks or getattr(model, "_use_python_reducer", False)):
            carrier = _VOTE_CARRIERS[model] = VoteInGradients(model)
            model.register_comm_hook(None, carrier.hook)
        return carrier

    # Why no annotations: DDP checks a hook's annotations as objects, and this module's are strings
    def hook(self, state, bucket):
        """DDP's default all-reduce of ``bucket`` (the gradients averaged over the ranks), the pending flags at the
        end of bucket 0."""
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if bucket.index() != 0 or self.pending is None:
            return default_hooks.allreduce_hook(self.group, bucket)
        gradients, flags, self.pending = bucket.buffer(), self.pending, None
        count = gradients.numel()
        carrying = torch.cat([gradients.div_(self.group.size()), flags.to(gradients.dtype)])

        def split(done: torch.futures.Future) -> torch.Tensor:
            summed = done.value()[0]
            self.carried = summed[count:]
            return summed[:count]

        return dist.all_reduce(carrying, group=self.group, async_op=True).get_future().then(split)

    def take(self) -> list[int] | None:
        """The flags the ranks' last synced backward carried, as a vote's MAX would give them (one host read); None
        where it all-reduced no gradients."""
        carried, self.pending, self.carried = self.carried, None, None
        return None if carried is None else [int(total > 0) for total in carried.tolist()]


_VOTE_CARRIERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP model -> its ``VoteInGradients``


VOTE_FAILED_AFTER_A_CALL_CUT_SHORT = (
    "rank {rank}'s step call was cut short by the end of its data (StopIteration inside the step), and the ranks'"
    " end-of-data vote after it failed: a peer never reached it. Where the ranks are the stages of a pipeline-parallel"
    " schedule, the peer is still inside its step, waiting for an activation or gradient this rank will not send;"
    " the loop cannot end a call it did not start. A step that runs a pipeline-parallel schedule over k micro-batches"
    " must not start a call the data cannot finish: `if not dataloader_iter.has_batches(k): return None` first."
)


def every_rank_has_a_batch(trainer: pl.Trainer, has_batch: bool) -> bool:
    """Whether *every* rank can start another step call (``vote``'s first answer), for a vote of its own where no
    collective of stock Lightning's stands at that point (after a drain call)."""
    return vote(trainer, has_batch).every_rank_has_a_batch


# [RFC 8]
def end_of_data_vote_needed(trainer: pl.Trainer) -> bool:
    """Whether the ranks of a ``*_step(self, dataloader_iter)`` must vote on the end of data
    (``every_rank_has_a_batch``) after every step call: under DDP with more than one rank, always.

    Why no skip for loaders that give every rank the same number of batches (a ``DistributedSampler``): equal
    batches end every rank at the same step call only if every rank's calls take the same number of batches, and
    that is the step's to decide, call by call (a data-dependent micro-batch count, as sequence packing gives). A
    rank sees only its own calls, so no rank can prove it without the communication the vote is; one that skipped on
    its own evidence while a peer voted would pair the vote with the peer's gradient all-reduce. The regular flavour
    takes one batch per call by construction and keeps stock Lightning's loop, without a vote.
    """
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and trainer.world_size > 1


# [RFC 10]
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


# [RFC 10]
class NoProgressGuard:
    """Stops a run whose step keeps returning without consuming a batch while batches remain (clause C14).

    A loop that looks ahead knows a batch is pending, so it would call such a step forever. ``LIMIT`` consecutive
    empty step calls is far above any deliberate pattern (a step that skips a few calls to wait for async work)
    and far below a visible hang.
    """

    LIMIT = 100

    def __init__(self, hook_name: str = "training_step") -> None:
        self.hook_name = hook_name
        self.empty_calls = 0

    def step_returned(self, consumed: int) -> None:
        self.empty_calls = 0 if consumed else self.empty_calls + 1
        if self.empty_calls >= self.LIMIT:
            raise RuntimeError(
                f"`{self.hook_name}(dataloader_iter)` returned {self.LIMIT} times in a row without consuming a batch "
                "while batches remain, so the loop can never end. Call `next(dataloader_iter)` in the step (at "
                "least once every few calls), or stop explicitly (in training: return -1 from "
                "`on_train_batch_start` or set `trainer.should_stop = True`)."
            )


@dataclass
class StepCall:
    """One step call as the loop saw it: the loop writes it, the rest of the loops only read it.

    ``index`` counts the epoch's step calls up to this one, drain calls included (gradient accumulation counts step
    calls). ``batches`` and ``batch_indices`` are what the call consumed, in order; ``cut_short``: the call ended in
    the StopIteration of its dataloader's end; ``drain``: a drain call (C17), which finds no batch left; ``open``: the
    call is running.
    """

    index: int = 0
    drain: bool = False
    batches: list[Any] = field(default_factory=list)
    batch_indices: list[int] = field(default_factory=list)
    cut_short: bool = False
    open: bool = False
    fewer_left: int | None = None  # ``has_batches(k)`` answered False: only this many (< k) were left

    @property
    def consumed(self) -> int:
        return len(self.batch_indices)

    @property
    def declined(self) -> bool:
        """The step saw that fewer batches were left than it needs (``has_batches``) and took none: it did not
        start a call it could not finish. Its data ends here; the batches left are not trained (``warn_declined``)."""
        return self.fewer_left is not None and not self.batch_indices and not self.drain


# When the loop makes drain calls: the first rule is the one every loop follows unless an option picks another (the
# others are what the rule is compared with, on unmodified clients)
PULLED_AHEAD = "pulled-ahead"  # only after a dataloader the step pulled ahead of its calls (``BatchesTakenPerCall``)
ALWAYS = "always"  # after every dataloader's last batch
NEVER = "never"  # none: stock Lightning's loop, and what a rule waiting for the step to ask gives a step that does not
DRAIN_RULES = (PULLED_AHEAD, ALWAYS, NEVER)


# [RFC 3]
def makes_drain_calls(rule: str, pulled_ahead: bool) -> bool:
    """Whether the loop makes drain calls under ``rule`` after a dataloader's last batch, when the step (on every
    rank) ``pulled_ahead``."""
    return rule == ALWAYS or (rule == PULLED_AHEAD and pulled_ahead)


# [RFC 3]
class BatchesTakenPerCall:
    """What the step calls over one dataloader took, kept for the drain rule (C17): ``pulled_ahead()``, read after
    the call that took the dataloader's last batch. ``note`` each call once it returned: the batches it took and
    whether it was a whole call (not cut short, not declined). Constant work per call: the vote reads it every call.
    ``resumed_mid_epoch``: the calls seen are not the dataloader's first (a run resumed from a mid-epoch checkpoint).
    """

    def __init__(self) -> None:
        self.calls = self.total = self.first = 0
        self.steady: int | None = None  # the fewest batches a whole call after the first took
        self.resumed_mid_epoch = False

    def note(self, taken: int, whole: bool) -> None:
        self.calls += 1
        self.total += taken
        if self.calls == 1:
            self.first = taken
        elif whole and (self.steady is None or taken < self.steady):
            self.steady = taken

    def pulled_ahead(self) -> bool:
        """Whether the step pulled batches ahead of the calls that train them: the loop makes drain calls only then.

        How the loop tells: a step that trains a batch pulled by an earlier call (TorchRec's pipelines, Lightning's
        async-handle pattern) fills in its first calls and then takes fewer batches per call, so it pulls more
        batches than its calls take at their steady rate. A step that takes the same ``k`` batches in every call
        trains what it pulls (NeMo's step over Megatron's schedules), and a drain call would only start a schedule
        with no batch: on a pipeline stage after the first, one that waits for an activation the first stage, out of
        batches, never sends. After a single whole call there is no steady rate: a call that took more than one batch
        may hold some, and the loop drains (losing held batches silently is the worse error). So does a run resumed
        mid-epoch: a step that restored what it held takes no more in its first call than in the rest.
        """
        if self.resumed_mid_epoch:
            return True
        if self.steady is None:
            return self.first > 1
        return self.holds()

    def holds(self) -> bool:
        """Whether the step holds batches it pulled ahead, by a steady rate seen (``pulled_ahead`` without its
        guesses for a single call and a resumed run): what lets a rank drain while a peer still makes regular calls
        (``vote``)."""
        return not self.resumed_mid_epoch and self.steady is not None and self.total > self.calls * self.steady


class StepCalls:
    """The step calls of one loop over the data (an epoch, an evaluation run), on the loop's thread: the running call,
    or the last one (``call``), and the guard against calls that consume nothing. A loop makes one per pass over
    the data, and extends it with what its way of holding batches needs."""

    def __init__(self, hook_name: str = "training_step", last: StepCall | None = None) -> None:
        self.call = last or StepCall()  # ``last``: the call a resumed run's checkpoint recorded
        self.no_progress = NoProgressGuard(hook_name)
        self.taken = BatchesTakenPerCall()  # what the drain rule reads
        self.taken.resumed_mid_epoch = last is not None
        self._noted: StepCall | None = self.call
        self.drained = False  # the loop made its drain calls over the current dataloader

    def start_call(self, drain: bool = False) -> StepCall:
        """A new step call (``drain``: a drain call, which finds no batch left)."""
        self._note_taken()
        self.call = StepCall(self.call.index + 1, drain, open=True)
        return self.call

    def _note_taken(self) -> None:
        call = self.call
        if call is not self._noted and not call.drain:
            # Why spelled out: once per step call, and a call declines only where `has_batches` answered False
            declined = call.fewer_left is not None and call.declined
            self.taken.note(len(call.batch_indices), whole=not (call.cut_short or declined))
            self._noted = call

    def new_dataloader(self) -> None:
        """The calls over one dataloader ended (an evaluation run moves on to the next): ``pulled_ahead`` starts
        over."""
        self.taken, self.drained = BatchesTakenPerCall(), False

    def pulled_ahead(self) -> bool:
        """``BatchesTakenPerCall.pulled_ahead`` of this loop's calls over the current dataloader."""
        self._note_taken()
        return self.taken.pulled_ahead()

    def holds(self) -> bool:
        """``BatchesTakenPerCall.holds`` of this loop's calls over the current dataloader."""
        self._note_taken()
        return self.taken.holds()

    @contextlib.contextmanager
    def drain_calls(self) -> Iterator[None]:
        """While the loop makes drain calls (C17). Afterwards ``call`` is again the call that took the epoch's last
        batch: the validation interval and a checkpoint look at its batches, not a drain call's."""
        last = self.call
        try:
            yield
        finally:
            index = self.call.index
            self.call = last
            self.call.index = index  # the drain calls were step calls too
            self.drained = True


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


BATCHES_LEFT_WHEN_A_PEER_ENDED = (
    "rank {rank} ends the epoch with batches left, not trained: another rank's data ran out first (its shard was"
    " shorter, or its step calls took more batches each), and under DDP all ranks stop at the same step call. Give"
    " every rank the same number of batches, and make every rank's step calls take the same number of them."
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


# [RFC 4] every batch through the transfer path
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


# [RFC 2] the iterator a step call receives
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

    # [RFC 2] a look-ahead of k: a step need not start a call it cannot finish
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
