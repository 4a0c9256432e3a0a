"""The prefetcher's record of one loop over the data's step calls, on the loop's thread: the shared record
(``step_calls.StepCalls``: the running call, drain calls) with the peeked next batch (the head), the ranks' end-of-data
vote and the batches taken between calls. No loop and no thread in here."""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

from prototypes.prefetcher.producer import Produced
from prototypes.ranks import BATCHES_LEFT_WHEN_A_PEER_ENDED, RanksVote, VoteInGradients, start_vote, vote
from prototypes.step_calls import PULLED_AHEAD, StepCall, StepCalls, makes_drain_calls


class HeldBatches:
    """What the record holds beyond the head for a step's look-ahead of k (``available``), and how it lets go of
    everything it holds (``drop_rest``). On the loop's thread, or under the record's ``lock``."""

    head: Produced | None
    ahead: deque[Produced]  # the batches after the head, taken from the producer; non-empty only with a head
    exhausted: bool
    peek: Callable[[], Produced | None]  # the head, taken from the producer if need be

    @staticmethod
    def head_of(dataloader_idx: int, head: Produced | None) -> Produced | None:
        """``head`` if it is a batch of ``dataloader_idx``: an iterator never spans two dataloaders (C15)."""
        return head if head is not None and head.dataloader_idx == dataloader_idx else None

    def drop_rest(self) -> int:
        """End here, with batches left (the ranks' vote, or a step that declined them, ended the epoch); returns how
        many of them were taken from the producer already."""
        held = (self.head is not None) + len(self.ahead)
        self.head, self.exhausted = None, True
        self.ahead.clear()
        return held

    def available(self, count: int, dataloader_idx: int, take_ahead: Callable[[], Produced | None]) -> int:
        """How many of the next ``count`` batches are of ``dataloader_idx``: a look-ahead of ``count`` (under
        ``lock``); ``take_ahead`` takes from the producer what the head does not cover."""
        if self.head_of(dataloader_idx, self.peek()) is None:
            return 0
        # Why `exhausted` first: once the producer found the end, asking it again raises StopIteration
        while len(self.ahead) + 1 < count and not self.exhausted and (produced := take_ahead()) is not None:
            self.ahead.append(produced)
        following = [p.dataloader_idx == dataloader_idx for p in list(self.ahead)[: count - 1]]
        return 1 + (following.index(False) if False in following else len(following))


class RanksVoteBetweenCalls:
    """The ranks' end-of-data vote between two step calls (``RanksVote``); part of ``EpochStepCalls``, locked."""

    trainer: pl.Trainer
    lock: threading.RLock
    call: StepCall
    ranks_vote: bool  # whether the ranks vote on the end of data: off for one rank, and once they agreed it ended
    voted_before_call: int | None  # the step call the ranks last agreed to start
    last_vote: RanksVote | None  # what they agreed then
    unread_vote: Callable[[], RanksVote] | None  # the vote before the next call, started and not yet read
    carrier: VoteInGradients | None  # where the votes ride in DDP's gradient all-reduce
    take_ahead: Callable[[], Produced | None] | None  # for ``ends_within_the_next_call``; None: no window to close
    drain_rule: str  # when the loop makes drain calls (``step_calls.DRAIN_RULES``)
    dataloader_idx: int | None  # the dataloader of the last batch handed out (None before the first)
    drained: bool
    peek: Callable[[], Produced | None]
    pulled_ahead: Callable[[], bool]
    holds: Callable[[], bool]
    drop_rest: Callable[[], int]
    available: Callable[..., int]

    def peek_on_every_rank(self) -> Produced | None:
        """The next batch, or None once this rank's data or (under DDP) any rank's data has ended. Why: a rank that
        stopped alone would leave its peers blocked in the step's gradient all-reduce (Accelerate #2258); the ranks
        vote once between two calls (read by whoever asks first, ``done`` or the next call), not inside one: a step
        need not pull on every rank (a pipeline stage after the first only receives activations)."""
        with self.lock:
            if self.ranks_vote:  # Why here too: with one rank, a call fewer on every peek
                self.start_vote()
            if self.unread_vote is None:
                if self.head is None and not self.exhausted:  # Why not `peek()`: a call fewer on every batch
                    self.head = self.take()
                return self.head
            self.last_vote, self.unread_vote = self.unread_vote(), None
            head = self.peek()
            return head if self.last_vote.every_rank_has_a_batch else self.every_rank_ended()

    def start_vote(self, carrier: VoteInGradients | None = None) -> None:
        """Start the ranks' vote between two calls where it is due (``peek_on_every_rank`` reads it); with a
        ``carrier``, in the all-reduce of the backward about to run."""
        with self.lock:
            if not (self.ranks_vote and self.vote_due()):
                return
            self.voted_before_call = self.call.index
            head = self.peek()
            in_this_dataloader = head is not None and head.dataloader_idx in (self.dataloader_idx, None)
            holds = not in_this_dataloader and self.holds_batches()
            self.unread_vote = start_vote(
                self.trainer, head is not None or holds, cut_short=self.call.cut_short,
                ends_within_the_next_call=in_this_dataloader and self.ends_within_the_next_call(head),
                pulled_ahead=self.pulled_ahead(), continues_the_dataloader=in_this_dataloader or holds,
                carrier=carrier,
            )

    def holds_batches(self) -> bool:
        """Whether this rank's step holds batches it pulled ahead that the loop may still drain (``StepCalls.holds``,
        its rule allows it, the last call was whole, no drain yet)."""
        return not (self.drained or self.call.cut_short) and makes_drain_calls(self.drain_rule, True) and self.holds()

    def ends_within_the_next_call(self, head: Produced) -> bool:
        """Whether this rank's look-ahead sees its data end within the next call, if that call takes as many batches
        as the last one did (at least one), where the next call would not close its accumulation window by its index.

        Why: DDP's gradient all-reduce is skipped inside a window and runs in the call that closes it, and a window
        the data's end closes early is closed by a call no index predicts; every rank must choose alike before the
        call, so the look-ahead travels in the vote. A larger call may still end the data unforeseen (synced once).
        """
        accumulate = self.trainer.accumulate_grad_batches
        if self.take_ahead is None or accumulate == 1 or (self.call.index + 1) % accumulate == 0:
            return False
        expected = max(self.call.consumed, 1)
        return self.available(expected + 1, head.dataloader_idx, self.take_ahead) <= expected

    def drains_here(self) -> bool:
        """Whether the loop drains after the call that ended the current dataloader's data on this rank: as the ranks
        agreed after that call (``RanksVote.drains``), or by this rank's own rule where they did not vote."""
        if self.call.cut_short:
            return False
        if self.last_vote is not None and self.voted_before_call == self.call.index:
            return self.last_vote.drains(self.drain_rule)
        return makes_drain_calls(self.drain_rule, self.pulled_ahead())


class RanksVoteAfterDrainCalls:
    """The ranks' vote after each drain call (``drain``'s), locked; part of ``EpochStepCalls``."""

    trainer: pl.Trainer
    carried_drain_vote: Callable[[], RanksVote] | None  # a drain call's vote, riding in its backward's all-reduce
    peek: Callable[[], Produced | None]
    every_rank_ended: Callable[[], None]

    def carry_vote_after_drain_call(self, carrier: VoteInGradients) -> None:
        """A drain call returned a loss, whose backward is about to all-reduce the gradients: it trained a held
        batch, so it did not end the draining (``vote_after_drain_call``'s ``ended``), and its vote rides in that
        all-reduce, pairing with a peer's vote between two regular calls that rides in the peer's."""
        self.carried_drain_vote = start_vote(self.trainer, True, pulled_ahead=True, continues_the_dataloader=True,
                                             carrier=carrier)

    def every_rank_ended(self) -> None:
        """The ranks agreed that one makes no further call: this rank drops what it holds and votes no more."""
        if self.drop_rest():
            warnings.warn(BATCHES_LEFT_WHEN_A_PEER_ENDED.format(rank=self.trainer.global_rank), stacklevel=3)
        self.ranks_vote = False

    def vote_after_drain_call(self, ended: bool) -> RanksVote:
        """The ranks' vote after a drain call (``drain``'s): whether every rank makes another call over the dataloader.
        It pairs with a peer's vote between two regular calls, where the peer's data ended a call later."""
        carried, self.carried_drain_vote = self.carried_drain_vote, None
        if carried is not None:
            agreed = carried()
        else:
            head = self.peek()
            agreed = vote(self.trainer, not ended or head is not None, pulled_ahead=not ended,
                          continues_the_dataloader=not ended)
        if not agreed.every_rank_has_a_batch:
            self.every_rank_ended()
        return agreed


class VoteSchedule:
    """When the ranks vote between two step calls (``RanksVoteBetweenCalls``); part of ``EpochStepCalls``."""

    call: StepCall
    ranks_vote: bool
    voted_before_call: int | None
    unread_vote: Callable[[], RanksVote] | None

    def vote_pending(self) -> bool:
        """Whether the end of data is the ranks' vote now: one started and unread, or one due."""
        return self.ranks_vote and (self.unread_vote is not None or self.vote_due())

    def vote_due(self) -> bool:
        """Where the ranks vote at all (``ranks_vote``: the callers check it first, it is off for most runs), whether
        they vote now: between two calls, once per call, not after a drain call (``vote_after_drain_call`` is)."""
        return not (self.call.open or self.call.drain) and self.voted_before_call != self.call.index


class EpochStepCalls(HeldBatches, RanksVoteBetweenCalls, RanksVoteAfterDrainCalls, VoteSchedule, StepCalls):
    """The step calls of one loop over the data (an epoch, an evaluation run), made and read on the loop's thread.

    ``take()`` brings the next batch from the producer (None at the end); the record keeps it as ``head`` until it is
    handed out. A batch handed out while no call is open (a pipeline's thread pulling ahead) counts toward the next
    call. ``consumed_loader_states`` is the loaders' state as of the batches handed out: what a checkpoint
    records. ``lock``: a pipeline's own loading thread (TorchRec's DataLoadingThread) may call next() on the step's
    iterator while the loop's thread peeks for the end of data between calls; both move the head.
    """

    def __init__(
        self, trainer: pl.Trainer, hook_name: str, take: Callable[[], Produced | None], *, exhausted: bool = False,
        ranks_vote: bool = False, consumed_loader_states: list[dict] | None = None,
        take_ahead: Callable[[], Produced | None] | None = None, drain_rule: str = PULLED_AHEAD,
        carrier: VoteInGradients | None = None,
    ) -> None:
        super().__init__(hook_name)
        self.trainer, self.take = trainer, take
        self.lock = threading.RLock()
        self.head: Produced | None = None  # the peeked next batch, already taken from the producer
        self.ahead: deque[Produced] = deque()
        self.exhausted = exhausted  # no batch is left: the data ended, or the ranks agreed it ended
        self.ranks_vote, self.take_ahead, self.drain_rule = ranks_vote, take_ahead, drain_rule
        self.dataloader_idx: int | None = None
        self.voted_before_call: int | None = None
        self.last_vote: RanksVote | None = None
        self.unread_vote: Callable[[], RanksVote] | None = None
        self.carrier = carrier
        self.carried_drain_vote: Callable[[], RanksVote] | None = None
        # the batches and their batch_idx a pipeline's thread took between two calls: they count toward the next
        self.taken_between_calls: list[tuple[Any, int]] = []
        self.consumed_loader_states = consumed_loader_states

    def peek(self) -> Produced | None:
        if self.head is None and not self.exhausted:
            self.head = self.take()
        return self.head

    def hand_out(self, dataloader_idx: int) -> Produced:
        """The next batch of ``dataloader_idx``, handed to the step (under ``lock``): recorded in the running call, or
        between calls toward the next one; its loader state becomes the one a checkpoint records."""
        head = self.head
        if head is None and not self.exhausted:  # Why not `peek()`: a call fewer on every batch
            head = self.head = self.take()
        if head is None or head.dataloader_idx != dataloader_idx:
            raise StopIteration
        self.head = self.ahead.popleft() if self.ahead else None
        self.consumed_loader_states, self.dataloader_idx = head.loader_states, head.dataloader_idx
        call = self.call
        if call.open:
            call.batches.append(head.batch)
            call.batch_indices.append(head.batch_idx)
        else:
            self.taken_between_calls.append((head.batch, head.batch_idx))
        return head

    def loader_ended(self, loader_states: list[dict] | None) -> None:
        """The producer found the end: nothing unconsumed is left, so a resumed run starts from the loaders' state
        after their end (None: a limit cut them short, the last handed-out batch's state stands)."""
        self.exhausted = True
        if loader_states is not None:
            self.consumed_loader_states = loader_states

    def start_call(self, drain: bool = False) -> StepCall:
        """A new step call (under ``lock``); batches a pipeline's thread took since the previous call count toward
        it."""
        call = super().start_call(drain)
        if self.taken_between_calls:
            for batch, batch_idx in self.taken_between_calls:
                call.batches.append(batch)
                call.batch_indices.append(batch_idx)
            self.taken_between_calls = []
        return call

    def end(self) -> None:
        """The loop over the data ended: no call is open, nothing taken between calls counts any more, and no vote
        rides in DDP's gradients (the carrier holds the process group, which a Trainer pickled after fit must not)."""
        self.call.open, self.taken_between_calls, self.head, self.carrier = False, [], None, None
        self.ahead.clear()
