"""The iterator the loop owns: batches fetched one ahead of the step, handed to one step call at a time."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from typing import Any

from pytorch_lightning.loops.fetchers import _DataFetcher

from prototypes.common import ITERATOR_USED_AFTER_ITS_STEP, StepCall, StepCalls, StepItem, StepIterator


class LookAhead:
    """The run's batches, fetched one ahead of the step so the loop knows whether another remains.

    ``fetch`` returns the next raw ``(batch, batch_idx, dataloader_idx)`` or raises ``StopIteration``; it is
    never called again after that. ``transfer(batch, dataloader_idx)`` moves a batch to the device; it runs once
    per batch, when the batch is first needed (handed out or shown to a batch-start hook), not when it is
    fetched, so a step that pipelines its own work decides when the copy happens. ``snapshot``, if given,
    returns the loaders' state; ``consumed_loader_states`` is then their state as of the batches taken so far (the
    batch held back excluded), which is what a checkpoint must record.
    """

    def __init__(
        self,
        fetch: Callable[[], StepItem],
        transfer: Callable[[Any, int], Any],
        snapshot: Callable[[], Any] | None = None,
    ) -> None:
        self._fetch = fetch
        self._transfer = transfer
        self._snapshot = snapshot or (lambda: None)
        self._head: StepItem | None = None
        self._head_transferred = False
        self._fetch_error: Exception | None = None
        self.exhausted = False
        self.consumed_loader_states: Any = None
        # what a step's look-ahead (``count_ahead``) fetched beyond the head, in order: each with the loaders' state
        # before its fetch, and the batch, or the error the fetch raised, or None for the end
        self._ahead: deque[tuple[Any, StepItem | Exception | None]] = deque()
        self._fetch_head()

    def _fetch_one(self) -> tuple[Any, StepItem | Exception | None]:
        # Why snapshot before fetching: the fetch advances the loaders past a batch no step has received yet
        before = self._snapshot()
        try:
            return before, self._fetch()
        except StopIteration:
            # nothing is held back, and a loader's state after its end makes a resumed run start a new epoch
            return self._snapshot(), None
        except Exception as error:
            # the failure belongs to the batch being looked ahead at, not to the one being handed out now:
            # raise it when that batch is asked for, with its original type and traceback
            return before, error

    def _fetch_head(self) -> None:
        self.consumed_loader_states, fetched = self._ahead.popleft() if self._ahead else self._fetch_one()
        self._head, self._fetch_error = (None, fetched) if isinstance(fetched, Exception) else (fetched, None)
        self.exhausted = fetched is None
        self._head_transferred = False

    def count_ahead(self, dataloader_idx: int, wanted: int) -> int:
        """How many of the next ``wanted`` batches are of ``dataloader_idx`` (a step's look-ahead), fetching up to
        ``wanted - 1`` beyond the head; they are handed out in order later, each transferred when first needed."""
        while self._head is not None and len(self._ahead) + 1 < wanted:
            if self._ahead and not isinstance(self._ahead[-1][1], tuple):
                break  # the end, or an error, is already ahead
            self._ahead.append(self._fetch_one())
        queued = [self._head, *(item for _, item in self._ahead)]
        return sum(1 for _ in itertools.takewhile(
            lambda item: isinstance(item, tuple) and item[2] == dataloader_idx, queued[:wanted]
        ))

    def drop_rest(self) -> None:
        """End here, with batches left (the ranks' vote ended the epoch): none is handed out any more."""
        self._head, self._fetch_error, self.exhausted = None, None, True
        self._ahead.clear()

    def exhausted_for(self, dataloader_idx: int) -> bool:
        """No batch of ``dataloader_idx`` remains: the loaders ran out or (sequential mode) moved to the next one."""
        return self.exhausted or (self._head is not None and self._head[2] != dataloader_idx)

    def peek(self) -> StepItem:
        """The next batch, transferred, without taking it; ``StopIteration`` when none remains."""
        if self._fetch_error is not None:
            raise self._fetch_error
        if self._head is None:
            raise StopIteration
        if not self._head_transferred:
            batch, batch_idx, dataloader_idx = self._head
            self._head = (self._transfer(batch, dataloader_idx), batch_idx, dataloader_idx)
            self._head_transferred = True
        return self._head

    def take(self) -> StepItem:
        """The next batch, transferred; fetches the one after it so ``exhausted`` is exact afterwards."""
        item = self.peek()
        self._fetch_head()
        return item


class LookAheadStepCalls(StepCalls):
    """The training loop's record of one epoch's step calls (``common.StepCalls``), with the look-ahead they draw from
    (``batches``; None between fits), the batch the running call will get first (``upcoming_batch``, None in a drain
    call) and the last batch handed out with its ``batch_idx`` (``last_handed_out``), which the batch-end hooks get."""

    def __init__(self, batches: LookAhead | None, last: StepCall | None = None) -> None:
        super().__init__("training_step", last)
        self.batches = batches
        self.upcoming_batch: Any = None
        self.last_handed_out: tuple[Any, int] = (None, -1)


class LookAheadStepIterator(StepIterator):
    """A step call's ``dataloader_iter`` over the look-ahead: the batches of ``dataloader_idx`` as ``hand_out`` passes
    them on (the loop counts them there)."""

    closed_message = ITERATOR_USED_AFTER_ITS_STEP  # closed when its call returns: stricter than the contract

    def __init__(
        self,
        batches: LookAhead,
        hand_out: Callable[[StepItem], StepItem],
        dataloader_idx: int = 0,
        step: str = "training_step",
    ) -> None:
        super().__init__(step)
        self._batches, self._hand_out, self._dataloader_idx = batches, hand_out, dataloader_idx

    def _take(self) -> StepItem:
        if self._batches.exhausted_for(self._dataloader_idx):
            raise StopIteration
        return self._hand_out(self._batches.take())

    def _has_next(self) -> bool:
        return not self._batches.exhausted_for(self._dataloader_idx)

    def _count_ahead(self, wanted: int) -> int:
        return self._batches.count_ahead(self._dataloader_idx, wanted)


def fetch_within_limits(data_fetcher: _DataFetcher) -> StepItem:
    # the combined loader does not stop at a `limit_*_batches`; the fetcher's `done` counts against it
    if data_fetcher.done:
        raise StopIteration
    length = data_fetcher.length
    if length is not None and data_fetcher.fetched >= length:
        # Why: a run resumed from a checkpoint written after the epoch's last batch (an on-exception checkpoint in a
        # drain call) restores `fetched` to the whole epoch while `done` stays as `reset()` left it; reading on would
        # start the loader's next epoch and train its first batch in this one
        raise StopIteration
    # the plain profiled fetch; Lightning's `_DataLoaderIterDataFetcher.__next__` hands out its own wrapper
    return _DataFetcher.__next__(data_fetcher)
