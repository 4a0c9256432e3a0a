"""Steps that keep work in flight across step calls, as real pipelines write them (clauses C11 and C17)."""

from __future__ import annotations

from typing import Any

from tests.conformance.harness import RecordingModule, ids


class PipeliningModule(RecordingModule):
    """A step that keeps work in flight across step calls: it trains a batch pulled by an earlier call (C17).

    ``record.trained`` lists, per epoch, the batches in the order the step trained them; each trained batch is one
    loss (one optimizer step at ``accumulate_grad_batches=1``), as in a plain loop over the loader.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trained: list[list[tuple[int, ...]]] = []
        self.drain_dataloader_iter = True  # the opt-in to drain calls (C17)

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.trained.append([])

    def train_one(self, batch: Any) -> Any:
        if not self.trained:  # a resumed run starts mid-epoch, without on_train_epoch_start
            self.trained.append([])
        self.trained[-1].append(ids(batch))
        self.step_calls += 1
        return self.finish_step([batch])


class Handle:
    """Stands for an asynchronous operation started on a batch (a copy, a sparse-index exchange)."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def wait(self) -> Any:
        return self.batch


class AsyncHandleModule(PipeliningModule):
    """The async-handle pattern of Lightning's own tests of the flavour.

    The first call takes batch 0 and starts its operation; every call then pulls batch i+1 and starts its operation
    (catching the StopIteration at the end of the data), waits for batch i, trains it and keeps i+1's handle for the
    next call. The handle of the batch being waited for is the only state carried across calls.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handle: Handle | None = None

    def training_step(self, dataloader_iter):
        if self.handle is None:
            batch, _, _ = next(dataloader_iter)  # at the end of the data with nothing held this ends the epoch
            self.handle = Handle(self.receive(batch))
        following = None
        try:
            batch, _, _ = next(dataloader_iter)
            following = Handle(self.receive(batch))
        except StopIteration:
            pass  # the last batch is in flight: train it, hold nothing
        current = self.handle.wait()
        self.handle = following
        return self.train_one(current)


class TrainPipelineModule(PipeliningModule):
    """The train-pipeline pattern (TorchRec's ``TrainPipelineBase.progress(dataloader_iter)``).

    The pipeline fills once per epoch, then every call pulls the next batch, noting the end instead of raising (a
    loader asked again after its end may hang, so it is never asked twice), trains the current batch and moves on.
    Once it holds nothing it raises StopIteration itself.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reconnect()

    def reconnect(self) -> None:
        self.current: Any = None
        self.filled = self.exhausted = False

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.reconnect()  # a new epoch, a new dataloader_iter: anything still held from the last one is dropped

    def _pull(self, dataloader_iter) -> Any:
        if self.exhausted:
            return None
        try:
            batch, _, _ = next(dataloader_iter)
        except StopIteration:
            self.exhausted = True
            return None
        return self.receive(batch)

    def training_step(self, dataloader_iter):
        if not self.filled:
            self.current, self.filled = self._pull(dataloader_iter), True
        if self.current is None:
            raise StopIteration
        current, self.current = self.current, self._pull(dataloader_iter)
        return self.train_one(current)
