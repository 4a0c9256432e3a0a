"""The record of a loop's step calls, shared by the designs that change Lightning's loops: the call running or the last
one, what each call took (the drain rules read it), and the guard against calls that take nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


# [RFC 1]
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


# [RFC 4]
def makes_drain_calls(rule: str, pulled_ahead: bool) -> bool:
    """Whether the loop makes drain calls under ``rule`` after a dataloader's last batch, when the step (on every
    rank) ``pulled_ahead``."""
    return rule == ALWAYS or (rule == PULLED_AHEAD and pulled_ahead)


# [RFC 4]
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
