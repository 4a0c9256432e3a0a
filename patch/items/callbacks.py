"""``ThroughputMonitor`` and ``BasePredictionWriter`` see every batch a step taking ``dataloader_iter`` took in a
call."""

import ast

from patch.edits import LightningSource
from patch.items import Item, issue
from patch.statements import assigns, calls


def _every_batch_of_the_call(source: LightningSource) -> None:
    fetchers = source.module("loops.fetchers")
    fetchers.insert_in_body(
        "_DataLoaderIterDataFetcher.__init__",
        "self._step_batches: list[_ITERATOR_RETURN] = []  # the batches the last step call took",
        at_end=True,
    )
    fetchers.insert_in_body(
        "_DataLoaderIterDataFetcher._end_step_call",
        "self._step_batches = taken",
        after=lambda node: isinstance(node, ast.Assign) and "self._taken" in ast.unparse(node.targets[0]),
    )

    monitor = source.module("callbacks.throughput_monitor")
    monitor.add_import("from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher")
    monitor.replace_statement(
        "ThroughputMonitor.on_train_batch_end",
        calls("self._update"),
        """
        data_fetcher = trainer.fit_loop._data_fetcher
        # a step taking `dataloader_iter` may have taken several batches in its call
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            for step_batch in [taken[0] for taken in data_fetcher._step_batches]:
                self._update(trainer, pl_module, step_batch, trainer.fit_loop.total_batch_idx + 1)
        else:
            self._update(trainer, pl_module, batch, trainer.fit_loop.total_batch_idx + 1)
        """,
    )

    writer = source.module("callbacks.prediction_writer")
    writer.remove("BasePredictionWriter.setup")  # its only work was to refuse a step taking `dataloader_iter`
    writer.remove_imported_name("is_param_in_hook_signature")

    prediction = source.module("loops.prediction_loop")
    step = "_PredictionLoop._predict_step"
    prediction.replace_statement(
        step,
        assigns("any_on_epoch"),
        """
        any_on_epoch = (
            self._store_data_for_prediction_writer([batch_idx], dataloader_idx) if not using_dataloader_iter else False
        )
        """,
    )
    prediction.insert_in_body(
        step,
        """
        # the writers get the indices of every batch the call took
        batch_idxs = [batch_idx for _, batch_idx, _ in data_fetcher._step_batches]
        any_on_epoch = self._store_data_for_prediction_writer(batch_idxs, dataloader_idx)
        """,
        after=calls("self.batch_progress.increment_by"),
    )
    store = "_PredictionLoop._store_data_for_prediction_writer"
    prediction.substitute(store, r"batch_idx: int", "batch_idxs: list[int]")
    prediction.replace_statement(
        store,
        assigns("batch_indices"),
        "batch_indices = [index for batch_idx in batch_idxs for index in batch_indices[batch_idx]]",
        nth=1,
    )


ITEM = Item(
    5,
    "Count every batch of a dataloader_iter step call in ThroughputMonitor and prediction writers",
    """
`ThroughputMonitor` counted one batch per call of a step taking `dataloader_iter`, the call's last, and
`BasePredictionWriter.setup` refused such a `predict_step`. The monitor now counts every batch the call took, and
the writers get the sample indices of all of them.
""",
    _every_batch_of_the_call,
    changelog=(
        ("Fixed", "`ThroughputMonitor` and `BasePredictionWriter` count every batch a step taking `dataloader_iter`"
                  f" took ({issue(18498)})"),
    ),
    tests=("callbacks/test_dataloader_iter_callbacks.py",),
)
