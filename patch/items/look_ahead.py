"""A step taking ``dataloader_iter`` gets its batches from a fetcher that looks one batch ahead: the fetcher, and the
training loop that counts, transfers and ends the epoch by what the step took."""

import ast

from patch.edits import LightningSource
from patch.items import Item, issue
from patch.items.lightning_test_updates import UPDATED_TESTS
from patch.items.training_loop import training_loop


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _fetcher(source: LightningSource) -> None:
    fetchers = source.module("loops.fetchers")
    for line in (
        "import threading",
        "from collections import deque",
        "from collections.abc import Callable",
        "from pytorch_lightning.utilities.warnings import PossibleUserWarning",
        "import warnings",
        "from lightning_fabric.utilities.types import _Stateful",
    ):
        fetchers.add_import(line)
    fetchers.replace_statement(
        "_DataLoaderIterDataFetcher",
        lambda node: _is_docstring(node) and "pre-fetching" in node.value.value,  # type: ignore[attr-defined]
        '''
        """Gives a step that takes ``dataloader_iter`` an iterator over the batches, one per dataloader.

        The fetcher looks one batch ahead, so that ``done`` is known before the step is called and the batch hooks
        receive the batch the step takes first. The batches go through the transfer hooks before they are handed out.

        Example::

            class MyModel(LightningModule):
                def training_step(self, dataloader_iter: Iterator) -> STEP_OUTPUT:
                    batch, batch_idx, dataloader_idx = next(dataloader_iter)
                    ...

        """
        ''',
    )
    fetchers.insert_in_body(
        "_DataLoaderIterDataFetcher.__init__",
        """
        self._transfer: Callable[[Any, int], Any] = _transfer_nothing
        self._ahead: deque[tuple[_ITERATOR_RETURN, list[dict[str, Any]]]] = deque()
        self._exhausted = False
        self._taken: list[_ITERATOR_RETURN] = []  # the batches handed out since the last step call ended
        self._batches_per_call: list[int] = []
        self._declined = False
        self._has_stateful_loaders = False
        self._lock = threading.RLock()  # a step's pipeline may take batches on a thread of its own
        self.iterator_wrapper: Optional[_DataFetcherWrapper] = None
        """,
        at_end=True,
    )
    fetchers.remove("_DataLoaderIterDataFetcher.__iter__")
    fetchers.replace(
        "_DataLoaderIterDataFetcher.__next__",
        '''
        @override
        def __next__(self) -> "_DataFetcherWrapper":  # type: ignore[override]
            if not self._fetch_ahead(1):
                self.iterator_wrapper = None  # the loop over the data ended
                raise StopIteration
            (self._batch, self._batch_idx, self._dataloader_idx), _ = self._ahead[0]
            if self.iterator_wrapper is None or self.iterator_wrapper.dataloader_idx != self._dataloader_idx:
                self.iterator_wrapper = _DataFetcherWrapper(self, self._dataloader_idx)
                self._batches_per_call = []
            self._batches_per_call.append(0)
            return self.iterator_wrapper

        def _fetch_ahead(self, count: int) -> bool:
            """Fetches until ``count`` batches are held, or the data ends.

            Args:
                count: The number of batches to hold.

            Returns:
                Whether ``count`` batches are held.

            """
            with self._lock:
                while len(self._ahead) < count and not self._exhausted:
                    # the loaders' states before the batch: what a checkpoint records while the batch is held
                    states = self.combined_loader._state_dicts() if self._has_stateful_loaders else []
                    try:
                        batch, batch_idx, dataloader_idx = super().__next__()
                    except StopIteration:
                        self._exhausted = True
                        break
                    if self.combined_loader._mode != "sequential":
                        # the loader counts from 0 again after a resumed run, the fetcher from the batches trained
                        batch_idx = self.fetched - 1
                    self._ahead.append(((self._transfer(batch, dataloader_idx), batch_idx, dataloader_idx), states))
                    self._exhausted = self.length is not None and self.fetched >= self.length
                self.done = not self._ahead and self._exhausted
                return len(self._ahead) >= count

        def _loader_states(self) -> list[dict[str, Any]]:
            """The loaders' states as of the batches handed out, before those fetched ahead."""
            return self._ahead[0][1] if self._ahead else self.combined_loader._state_dicts()

        def _end_step_call(self) -> int:
            """Records the end of a step call.

            Returns:
                The number of batches handed out since the previous step call ended.

            """
            taken, self._taken = self._taken, []
            self._batches_per_call[-1] = len(taken)
            if not taken and len(self._batches_per_call) >= 100 and not any(self._batches_per_call[-100:]):
                raise RuntimeError(
                    "The step taking `dataloader_iter` took no batch in 100 calls in a row. Call"
                    " `next(dataloader_iter)` in the step, or return `None` when `dataloader_iter.has_batches(n)` is"
                    " `False` to end the data."
                )
            if self._declined and not taken:
                warnings.warn(
                    "The step taking `dataloader_iter` took no batch after `dataloader_iter.has_batches()` returned"
                    f" `False`, so the data ends there: the {len(self._ahead)} batch(es) left are not trained.",
                    category=PossibleUserWarning,
                )
                self._ahead.clear()
                self._exhausted = self.done = True
            self._declined = False
            return len(taken)
        ''',
    )
    fetchers.insert_in_body(
        "_DataLoaderIterDataFetcher.reset",
        """
        self._ahead = deque()
        self._exhausted = self.done
        self._taken = []
        self.iterator_wrapper = None
        self._has_stateful_loaders = self._combined_loader is not None and any(
            isinstance(loader, _Stateful) for loader in self._combined_loader.flattened
        )
        """,
        at_end=True,
    )
    fetchers.insert_in_body(
        "_DataFetcherWrapper",
        '''
        """The ``dataloader_iter`` a step receives: the batches of one dataloader, as ``(batch, batch_idx,
        dataloader_idx)``."""
        ''',
        at_start=True,
    )
    fetchers.add_parameters("_DataFetcherWrapper.__init__", "dataloader_idx: int = 0")
    fetchers.insert_in_body("_DataFetcherWrapper.__init__", "self.dataloader_idx = dataloader_idx", at_end=True)
    fetchers.replace_statement(
        "_DataFetcherWrapper.done",
        lambda node: isinstance(node, ast.Return),
        '''
        """Whether the last batch of the dataloader has been handed out."""
        return self.data_fetcher.iterator_wrapper is not self or not self._holds(1)
        ''',
    )
    fetchers.replace(
        "_DataFetcherWrapper.__next__",
        '''
        def has_batches(self, count: int) -> bool:
            """Whether at least ``count`` more batches of the dataloader remain, found without handing any out.

            Args:
                count: The number of batches the step needs.

            """
            remain = self._holds(count)
            self.data_fetcher._declined = not remain
            return remain

        def _holds(self, count: int) -> bool:
            """Whether at least ``count`` more batches of the dataloader remain (``has_batches``, without noting a
            decline)."""
            fetcher = self.data_fetcher
            return count < 1 or (
                fetcher._fetch_ahead(count) and fetcher._ahead[count - 1][0][2] == self.dataloader_idx
            )

        @override
        def __next__(self) -> _ITERATOR_RETURN:
            fetcher = self.data_fetcher
            if fetcher.iterator_wrapper is not self:
                raise RuntimeError(
                    "`next(dataloader_iter)` was called after the loop over its dataloader ended. Take batches only in"
                    " the step that received the iterator, or in hooks that run before its dataloader ends."
                )
            with fetcher._lock:
                if not self._holds(1):
                    raise StopIteration
                (batch, batch_idx, dataloader_idx), _ = fetcher._ahead.popleft()
                fetcher._fetch_ahead(1)
                fetcher._taken.append((batch, batch_idx, dataloader_idx))
                fetcher._batch, fetcher._batch_idx, fetcher._dataloader_idx = batch, batch_idx, dataloader_idx
            return batch, batch_idx, dataloader_idx
        ''',
    )
    fetchers.insert(
        """
        def _transfer_nothing(batch: Any, dataloader_idx: int) -> Any:
            return batch
        """
    )


PAGE = """
:orphan:

.. _dataloader_iter:

#########################################
Steps that take their batches themselves
#########################################

A step that declares ``dataloader_iter`` in place of ``batch`` and ``batch_idx`` takes its batches itself. It can take
several batches in one call, or take the next batch before it trains the current one, so that loading the next batch
overlaps the work on this one.

.. code-block:: python

    class LitModel(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            return self.compute_loss(batch)

The flavour is experimental: Lightning warns when a step takes ``dataloader_iter``.

What the iterator gives
=======================

- ``next(dataloader_iter)`` returns ``(batch, batch_idx, dataloader_idx)``. The batch has passed the precision
  conversion and the transfer hooks, as in a regular step. ``batch_idx`` counts the epoch's batches from 0.
- ``dataloader_iter.done`` is ``True`` once the last batch has been taken. Lightning looks one batch ahead, so it is
  known before the step is called, and the step is never called when no batch is left.
- ``dataloader_iter.has_batches(n)`` tells whether ``n`` more batches remain, without taking any.

The iterator is valid until the loop over its dataloader ends. Taking a batch after that is an error.

What is counted
===============

Progress, the progress bar, ``limit_train_batches`` and ``val_check_interval`` count batches.
``accumulate_grad_batches`` counts calls of the step, and ``max_steps`` counts optimizer steps.
``on_train_batch_start`` gets the batch the call takes first, and ``on_train_batch_end`` the last batch it took.
``self.log`` needs no ``batch_size``: it takes the size of the call's first batch.

When the data ends inside a call
================================

If ``next(dataloader_iter)`` raises ``StopIteration`` inside the step, the epoch ends. The batches of that call are
counted but not trained, and Lightning warns with
:class:`~lightning.pytorch.utilities.warnings.CutShortCallWarning`. To avoid it, ask before taking ``n`` batches:

.. code-block:: python

    def training_step(self, dataloader_iter):
        if not dataloader_iter.has_batches(2):
            return None  # the data ends here, and Lightning warns that the batches left are not trained
        batches = [next(dataloader_iter)[0] for _ in range(2)]
        return self.compute_loss(torch.cat(batches))

A ``StopIteration`` that the step raises itself while batches remain is an error.

What changed
============

Before, progress and limits counted calls, the batch hooks got the previous call's batch, the batches skipped the
transfer hooks, and ``done`` was known only after a ``next()`` past the end. A step that takes one batch per call needs
no change. A step that takes several batches per call states ``limit_train_batches`` and ``val_check_interval`` in
batches, and may drop its own ``.to(device)``.
"""


ITEM = Item(
    1,
    "Hand a dataloader_iter step its batches through a fetcher that looks one batch ahead",
    """
A training step taking `dataloader_iter` got Lightning's fetcher unchanged: progress, `limit_train_batches` and
`val_check_interval` counted calls, `accumulate_grad_batches` zeroed the gradients by the hooks' stale batch index,
`on_train_batch_start` got the previous call's batch, `done` was known only after a `next()` past the end, the
transfer hooks never ran, and a checkpoint recorded the loader's state after the batch fetched ahead.

The fetcher now looks one batch ahead and transfers each batch before it hands it out; the iterator tells
`done` and `has_batches(n)` without taking a batch. The training loop counts the batches a call took, accumulates
over calls, steps the optimizer in a call that may take the last batch, and ends the epoch when a call runs out of
batches (`CutShortCallWarning`) or declines the rest. A `StopIteration` the step raises itself while batches remain
is an error: the manual optimization loop no longer swallows it.
""",
    lambda source: (_fetcher(source), training_loop(source)),
    changelog=(
        ("Added", "`dataloader_iter.has_batches(n)` and `CutShortCallWarning` for steps that take several batches per"
                  f" call ({issue(18498)})"),
        ("Changed", "A `training_step(dataloader_iter)` gets its batches through the transfer hooks, one batch looked"
                    " ahead; progress, `limit_train_batches` and `val_check_interval` count batches and"
                    f" `accumulate_grad_batches` counts calls ({issue(18334)}, {issue(18498)},"
                    f" {issue(18831)})"),
    ),
    docs=(("data/dataloader_iter.rst", PAGE),),
    updated_tests=UPDATED_TESTS,
    tests=(
        "helpers/dataloader_iter.py",
        "loops/test_dataloader_iter_compatibility.py",
        "loops/test_dataloader_iter_fetcher.py",
        "loops/test_dataloader_iter_misuse.py",
        "loops/test_dataloader_iter_resume.py",
    ),
)
