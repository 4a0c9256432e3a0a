"""Progress in batches: Lightning's progress classes, counting the batches a step call consumed."""

from __future__ import annotations

from typing import Any

from pytorch_lightning.loops.progress import _BatchProgress, _Progress


# ----------------------------------------------------------------------- [RFC 1] progress counts batches
class CountsConsumed:
    """Progress in batches consumed, however many a step call takes (mixed into Lightning's progress classes).

    Lightning's loops increment ready and started before each step call and processed and completed after it. While
    ``counts_consumed`` is on (a design turns it on while the step pulls batches), ``count_consumed()`` counts ready
    and started per batch handed out, Lightning's per-call ``increment_ready`` / ``increment_started`` do nothing, and
    its per-call ``increment_processed`` / ``increment_completed`` only bring processed and completed up to that
    count. Off, this is Lightning's class with Lightning's own methods.

    Why the four are shadowed on the instance, not overridden: a regular module's loop calls them for every batch,
    and the regular flavour pays nothing (the per-batch rules, ``prototypes.lightning_changes``). Neither they nor
    the flag are dataclass fields: a checkpoint holds exactly the fields stock Lightning's class has.
    """

    total: Any
    current: Any

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]
        self._counting_consumed = False  # not a dataclass field: no checkpoint holds it

    @property
    def counts_consumed(self) -> bool:
        return self._counting_consumed

    @counts_consumed.setter
    def counts_consumed(self, on: bool) -> None:
        if on == self._counting_consumed:
            return
        self._counting_consumed = on
        if not on:
            for name in _SHADOWED_INCREMENTS:
                delattr(self, name)
            return
        self.increment_ready = self.increment_started = _counted_per_batch
        self.increment_processed = self._processed_up_to_started
        self.increment_completed = self._completed_up_to_processed

    def count_consumed(self) -> None:
        total, current = self.total, self.current
        total.ready, current.ready = total.ready + 1, current.ready + 1
        total.started, current.started = total.started + 1, current.started + 1

    def _processed_up_to_started(self) -> None:
        self.total.processed, self.current.processed = self.total.started, self.current.started

    def _completed_up_to_processed(self) -> None:
        self.total.completed, self.current.completed = self.total.processed, self.current.processed


_SHADOWED_INCREMENTS = ("increment_ready", "increment_started", "increment_processed", "increment_completed")


def _counted_per_batch() -> None:
    """Lightning's per-call ready and started, while ``count_consumed()`` counts them per batch."""


class ConsumedBatchProgress(CountsConsumed, _BatchProgress):
    """The training and evaluation loops' ``_BatchProgress``, counting consumed batches."""


class ConsumedProgress(CountsConsumed, _Progress):
    """The prediction loop's ``_Progress`` (it has no ``is_last_batch`` field), counting consumed batches."""
