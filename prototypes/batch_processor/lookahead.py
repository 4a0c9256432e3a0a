"""The iterator the loop owns: batches fetched one ahead of the step, handed to one step call at a time."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from pytorch_lightning.loops.fetchers import _DataFetcher

from prototypes.common import ITERATOR_USED_AFTER_ITS_STEP, StepItem, StepIterator
from prototypes.step_calls import StepCall, StepCalls


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
        # beyond the head, for a step's look-ahead of k (``available``): (loader state before it, batch); None: the end
        self._ahead: deque[tuple[Any, StepItem | None]] = deque()
        self._head_transferred = False
        self._fetch_error: Exception | None = None
        self.exhausted = False
        self.consumed_loader_states: Any = None
        self._fetch_head()

    def _fetch_head(self) -> None:
        if self._ahead:  # a look-ahead of k fetched it already
            self.consumed_loader_states, self._head = self._ahead.popleft()
            self._head_transferred, self.exhausted = False, self._head is None
            return
        # Why snapshot before fetching: the fetch advances the loaders past a batch no step has received yet
        self.consumed_loader_states = self._snapshot()
        try:
            self._head = self._fetch()
        except StopIteration:
            self._head, self.exhausted = None, True
            # nothing is held back, and a loader's state after its end makes a resumed run start a new epoch
            self.consumed_loader_states = self._snapshot()
        except Exception as error:
            # the failure belongs to the batch being looked ahead at, not to the one being handed out now:
            # raise it when that batch is asked for, with its original type and traceback
            self._head, self._fetch_error = None, error
        self._head_transferred = False

    def drop_rest(self) -> int:
        """End here, with batches left (the ranks' vote, or a step that declined them, ended the epoch): none is
        handed out any more. Returns how many of them the look-ahead held."""
        held = (self._head is not None) + sum(item is not None for _, item in self._ahead)
        self._head, self._fetch_error, self.exhausted = None, None, True
        self._ahead.clear()
        return held

    def available(self, count: int, dataloader_idx: int) -> int:
        """How many of the next ``count`` batches are of ``dataloader_idx``: a look-ahead of ``count``, fetching
        (not transferring) what the head does not cover; a loader's error while looking ahead is raised here."""
        if self._fetch_error is not None or self.exhausted_for(dataloader_idx):
            return 0
        while len(self._ahead) + 1 < count and not (self._ahead and self._ahead[-1][1] is None):
            snapshot = self._snapshot()
            try:
                self._ahead.append((snapshot, self._fetch()))
            except StopIteration:
                self._ahead.append((self._snapshot(), None))
        following = [item for _, item in self._ahead][: count - 1]
        return 1 + next((i for i, item in enumerate(following) if item is None or item[2] != dataloader_idx),
                        len(following))

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
    """The training loop's record of one epoch's step calls (``step_calls.StepCalls``), with the look-ahead they
    draw from (``batches``; None between fits), the batch the running call will get first (``upcoming_batch``, None
    in a drain call) and the last batch handed out with its ``batch_idx`` (``last_handed_out``), which the batch-end
    hooks get."""

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
        call: StepCall | None = None,
    ) -> None:
        super().__init__(step)
        self._batches, self._hand_out, self._dataloader_idx = batches, hand_out, dataloader_idx
        self._call = call  # the running call, where a short look-ahead is recorded

    def _available(self, count: int) -> int:
        available = self._batches.available(count, self._dataloader_idx)
        if available < count and self._call is not None:
            self._call.fewer_left = available
        return available

    def _take(self) -> StepItem:
        if self._batches.exhausted_for(self._dataloader_idx):
            raise StopIteration
        return self._hand_out(self._batches.take())

    def _has_next(self) -> bool:
        return not self._batches.exhausted_for(self._dataloader_idx)


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
