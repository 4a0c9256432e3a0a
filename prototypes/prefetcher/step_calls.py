"""The prefetcher's record of one loop over the data's step calls, on the loop's thread: the shared record
(``common.StepCalls``: the running call, drain calls) with the peeked next batch (the head), the ranks' end-of-data
vote and the batches taken between calls. No loop and no thread in here."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl

from prototypes.common import StepCall, StepCalls, every_rank_has_a_batch
from prototypes.prefetcher.producer import Produced


class BatchesAhead:
    """The batches a step's look-ahead (``StepIterator.has_batches``) took from the producer beyond the head, in order,
    each with its producer slot freed at once (``release``) so a look-ahead past the prefetch depth does not wait for
    itself; and the loaders' state after their end, when the producer found it with batches still ahead."""

    def __init__(self, produce: Callable[[], Produced | None], release: Callable[[], None]) -> None:
        self._produce, self._release = produce, release
        self.queue: deque[Produced] = deque()
        self.end_states: list[dict] | None = None  # recorded once the batches ahead are handed out

    def take(self) -> Produced | None:
        """The first batch ahead, else the producer's next (None at the end)."""
        return self.queue.popleft() if self.queue else self._produce()

    def fill(self, count: int) -> None:
        """Take from the producer until ``count`` batches are ahead or it ends."""
        while len(self.queue) < count:
            produced = self._produce()
            if produced is None:
                return
            self._release()
            self.queue.append(produced)


class EpochStepCalls(StepCalls):
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
        release_ahead: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(hook_name)
        self.trainer = trainer
        self.ahead = BatchesAhead(take, release_ahead)  # ``take`` draws from it first
        self.take = self.ahead.take
        self.lock = threading.RLock()
        self.head: Produced | None = None  # the peeked next batch, already taken from the producer
        self.exhausted = exhausted  # no batch is left: the data ended, or the ranks agreed it ended
        # whether the ranks vote on the end of data: off for loaders that end evenly, and once they agreed it ended
        self.ranks_vote = ranks_vote
        self.voted_before_call: int | None = None  # the step call the ranks last agreed to start
        # the batches and their batch_idx a pipeline's thread took between two calls: they count toward the next
        self.taken_between_calls: list[tuple[Any, int]] = []
        self.consumed_loader_states = consumed_loader_states

    def count_ahead(self, dataloader_idx: int, wanted: int) -> int:
        """How many of the next ``wanted`` batches exist in ``dataloader_idx`` (under ``lock``): the step's look-ahead
        (``StepIterator.has_batches``); what it takes stays queued in order (``ahead``)."""
        head = self.peek()
        if head is None:
            return 0
        if not self.exhausted:
            self.ahead.fill(wanted - 1)
        queued = [head, *self.ahead.queue][:wanted]
        return sum(1 for _ in itertools.takewhile(lambda p: p.dataloader_idx == dataloader_idx, queued))

    def peek(self) -> Produced | None:
        if self.head is None and (self.ahead.queue or not self.exhausted):
            self.head = self.take()
        return self.head

    def peek_on_every_rank(self) -> Produced | None:
        """The next batch, or None once this rank's data or (under DDP) any rank's data has ended.

        Why: a rank that stopped alone would leave its peers blocked in the step's gradient all-reduce (Accelerate
        #2258). The ranks vote once between two step calls (whoever asks first: ``done`` or the next call), so all
        end the epoch at the same call, dropping what longer shards still hold. Why not inside a call: a step need
        not pull on every rank (a Megatron-style pipeline stage after the first only receives activations), and a
        vote it does not join would block the ranks that pull. Loaders that give every rank the same number of
        batches need no vote.
        """
        with self.lock:
            head = self.peek()
            if not (self.ranks_vote and self.vote_due()):
                return head
            self.voted_before_call = self.call.index
            if every_rank_has_a_batch(self.trainer, head is not None):
                return head
            # Why stop voting: every rank ended at this call; a rank asking again must not wait for a vote
            self.head, self.exhausted, self.ranks_vote = None, True, False
            self.ahead.queue.clear()
            return None

    def vote_due(self) -> bool:
        """Where the ranks vote at all (``ranks_vote``), whether they vote now: between two calls, once per call. Why
        the callers check ``ranks_vote`` first: it is off for most runs, and they ask on every batch."""
        return not self.call.open and self.voted_before_call != self.call.index

    @staticmethod
    def head_of(dataloader_idx: int, head: Produced | None) -> Produced | None:
        """``head`` if it is a batch of ``dataloader_idx``: an iterator never spans two dataloaders (C15)."""
        return head if head is not None and head.dataloader_idx == dataloader_idx else None

    def hand_out(self, dataloader_idx: int) -> Produced:
        """The next batch of ``dataloader_idx``, handed to the step (under ``lock``): recorded in the running call, or
        between calls toward the next one; its loader state becomes the one a checkpoint records."""
        head = self.head
        ahead = self.ahead
        if head is None and (ahead.queue or not self.exhausted):  # Why not `peek()`: a call fewer on every batch
            head = self.head = self.take()
        if head is None or head.dataloader_idx != dataloader_idx:
            raise StopIteration
        self.head = None
        self.consumed_loader_states = head.loader_states
        if ahead.end_states is not None and not ahead.queue:  # the last batch looked ahead at
            self.consumed_loader_states, ahead.end_states = ahead.end_states, None
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
        if loader_states is not None and (self.ahead.queue or self.head is not None):
            self.ahead.end_states = loader_states
        elif loader_states is not None:
            self.consumed_loader_states = loader_states

    def start_call(self, drain: bool = False) -> StepCall:
        """A new step call (under ``lock``); what a pipeline's thread took since the previous call counts toward it."""
        call = super().start_call(drain)
        if self.taken_between_calls:
            for batch, batch_idx in self.taken_between_calls:
                call.batches.append(batch)
                call.batch_indices.append(batch_idx)
            self.taken_between_calls = []
        return call

    def end(self) -> None:
        """The loop over the data ended: no call is open, and nothing taken between calls counts any more."""
        self.call.open, self.taken_between_calls, self.head = False, [], None
        self.ahead.queue.clear()
