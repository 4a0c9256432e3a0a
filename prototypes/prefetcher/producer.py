"""The producer: loads the epoch's batches one at a time and transfers them, on the step's thread (on the prefetch
thread where one runs). It knows no loop and no step call: what it makes of one batch is a :class:`Produced`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from lightning_fabric.utilities.data import sized_len
from pytorch_lightning.utilities.combined_loader import CombinedLoader

from prototypes.lightning_changes import loader_state_reader


class Produced(NamedTuple):
    batch: Any
    batch_idx: int
    dataloader_idx: int
    loader_states: list[dict] | None  # the loaders' state right after this batch: what a checkpoint records


class LoaderExhausted(StopIteration):
    """The epoch's data ended; carries the loaders' state after their end, or None when a limit cut them short."""

    def __init__(self, loader_states: list[dict] | None) -> None:
        super().__init__()
        self.loader_states = loader_states


class BatchProducer:
    """One loop over the data (an epoch, an evaluation run), one batch per call.

    Reads the loader iterator up to its length and limits, numbers the batches from the count the loader resumed at,
    snapshots the loaders' state after each batch (on the thread that drives the loader: consistent), and transfers
    the batch with ``transfer`` (None leaves it to the consumer). Raises :class:`LoaderExhausted` at the end.
    """

    def __init__(
        self, iterator: Iterator, combined_loader: CombinedLoader, length: int | None, resumed_at: Callable[[], int],
        transfer: Callable[[Any, int], Any] | None,
    ) -> None:
        self.iterator, self.length = iterator, length
        self._loader = combined_loader
        self._read_loader_states = loader_state_reader(combined_loader)
        # Why a callable, read at the first batch: the loop restores the count of a resumed run after the iterator
        # started
        self._resumed_at_count = resumed_at
        self._resumed_at = 0  # the batch count the loader resumed at (after a checkpoint)
        self._produced: int | None = None  # batches taken from the loader, counted from `_resumed_at`
        self._transfer_path = transfer

    def loader_states(self) -> list[dict] | None:
        """The loaders' state now (None when no loader can be resumed)."""
        return None if self._read_loader_states is None else self._read_loader_states()

    def __call__(self) -> Produced:
        if self._produced is None:  # the first call: after a resume the loader continues at the restored batch
            self._produced = self._resumed_at = self._resumed_at_count()
        if self.length is not None and self._produced >= self.length and self._limited():
            # Why not read on: the combined loader does not stop at a `limit_*_batches`, and a limit must bound
            # what is read (a streaming source consumes what is read), not only what is trained
            raise LoaderExhausted(None)
        try:
            # Past Lightning's length of an unlimited loader this finds its end: a loader that ended yields the state
            # that makes a resumed run start the next epoch rather than an empty rest of this one.
            batch, loader_batch_idx, dataloader_idx = next(self.iterator)
        except StopIteration:
            raise LoaderExhausted(self.loader_states()) from None
        self._produced += 1
        # Why add: the combined loader counts from 0 again after a resume (and for each evaluation dataloader)
        batch_idx = self._resumed_at + loader_batch_idx
        if self.length is not None and self._produced > self.length:
            raise LoaderExhausted(None)  # a loader yielding more than its length says: Lightning stops at its length
        states = None if self._read_loader_states is None else self._read_loader_states()
        if self._transfer_path is not None:
            batch = self._transfer_path(batch, dataloader_idx)
        return Produced(batch, batch_idx, dataloader_idx, states)

    def _limited(self) -> bool:
        """Whether a ``limit_*_batches`` cuts any loader short of its length."""
        loader = self._loader
        limits = loader.limits or []
        return any(limit < (sized_len(dl) or float("inf")) for dl, limit in zip(loader.flattened, limits, strict=False))

