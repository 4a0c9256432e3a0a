"""Drain calls, on request: ``LightningModule.drain_dataloader_iter`` has the loop call a step taking
``dataloader_iter`` again after its data ended, until it returns ``None``; without it, a warning where the loop can
tell that the step holds batches."""

import ast

from patch.edits import LightningSource
from patch.items import Item, issue
from patch.statements import assigns

END_OF_DATA = '''
def _end_of_data(self, step_call: Callable[[], Any], drain: bool) -> None:
    """Calls ``step_call`` after the dataloader's last batch while it returns an output, if ``drain``.

    Warns if the step may still hold batches then: if its first call took more batches than each later one (but the
    last), and fewer calls after the end of the data returned an output.

    Args:
        step_call: Calls the step and returns whether it returned an output.
        drain: Whether the module asked for the calls.

    """
    counts = self._batches_per_call
    held = counts[0] - max(counts[1:-1]) if len(counts) > 2 else 0
    if drain:
        held -= self._drain(step_call)
    if held > 0:
        fix = (
            "return an output from each call after the end of the data that uses one"
            if drain
            else "set `self.drain_dataloader_iter = True` in your `LightningModule`, and the loop calls the step"
            " again until it returns `None`"
        )
        self._warning_cache.warn(
            f"The step taking `dataloader_iter` took {held} more batch(es) in its first call than in each later"
            f" call, so it may still hold them now that the data has ended: they are not trained or evaluated. To"
            f" use them, {fix}.",
            category=PossibleUserWarning,
        )

def _drain(self, step_call: Callable[[], Any]) -> int:
    """Calls ``step_call`` until it returns no output or raises ``StopIteration``.

    Returns:
        The number of calls that returned an output.

    """
    for calls in range(100):
        try:
            if not step_call():
                return calls
        except StopIteration:
            return calls
    raise RuntimeError(
        "The step taking `dataloader_iter` was called 100 times after the end of its data and returned an output"
        " every time. Return `None` or raise `StopIteration` once it holds no more batches."
    )
'''


def _drain(source: LightningSource) -> None:
    module = source.module("core.module")
    module.insert_in_body(
        "LightningModule.__init__",
        """
        #: Whether a step taking ``dataloader_iter`` is called again after the end of its data, until it returns
        #: ``None``: for a step that holds batches it has taken but not yet used.
        self.drain_dataloader_iter: bool = False
        """,
        after=lambda node: isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "self._strict_loading",
    )

    fetchers = source.module("loops.fetchers")
    fetchers.add_import("from pytorch_lightning.utilities.rank_zero import WarningCache")
    fetchers.insert_in_body("_DataLoaderIterDataFetcher.__init__", "self._warning_cache = WarningCache()", at_end=True)
    fetchers.insert(END_OF_DATA, after="_DataLoaderIterDataFetcher._end_step_call")

    loop = source.module("loops.training_epoch_loop")
    loop.add_import("from collections.abc import Iterator")
    loop.add_import("from pytorch_lightning.loops.fetchers import _DataFetcherWrapper")
    loop.insert(
        '''
        def _drain_call(self, dataloader_iter: Iterator) -> bool:
            """Calls the step after the end of the data.

            Returns:
                Whether the call returned an output.

            """
            trainer = self.trainer
            kwargs = OrderedDict(any=dataloader_iter)
            trainer._logger_connector.on_batch_start(None)
            with trainer.profiler.profile("run_training_batch"):
                if trainer.lightning_module.automatic_optimization:
                    # a window of its own: its optimization zeroes the gradients first
                    output = self.automatic_optimization.run(trainer.optimizers[0], 0, kwargs)
                else:
                    output = self.manual_optimization.run(kwargs)
            trainer._logger_connector.on_batch_end()
            if output:
                self.update_lr_schedulers("step", update_plateau_schedulers=False)
                self._batches_that_stepped += 1
                trainer._logger_connector.update_train_step_metrics()
            return bool(output)
        ''',
        after="_TrainingEpochLoop._look_for_end_of_data",
    )
    advance = "_TrainingEpochLoop.advance"
    # no drain call after a call cut short: the step took what was left, and holds nothing it could finish
    loop.replace_statement(
        advance, assigns("should_skip_rest_of_epoch"), "should_skip_rest_of_epoch = call_cut_short = False", nth=0
    )
    loop.insert_in_body(
        advance,
        "call_cut_short = True",
        after=lambda node: isinstance(node, ast.If)
        and ast.unparse(node.test).startswith("not trainer.lightning_module"),
    )
    loop.insert_in_body(
        advance,
        """
        if (
            isinstance(dataloader_iter, _DataFetcherWrapper)
            and self.batch_progress.is_last_batch
            and not call_cut_short
        ):
            drain_call = functools.partial(self._drain_call, dataloader_iter)
            dataloader_iter.data_fetcher._end_of_data(drain_call, trainer.lightning_module.drain_dataloader_iter)
        """,
        at_end=True,
    )

    for dotted, step, drain_call in (
        ("loops.evaluation_loop", "_EvaluationLoop._evaluation_step", '''
            def _drain_call(self, dataloader_iter: Iterator, dataloader_idx: int) -> bool:
                """Calls the step after the end of its dataloader.

                Returns:
                    Whether the call returned an output.

                """
                trainer = self.trainer
                trainer._logger_connector.on_batch_start(None, dataloader_idx if self.num_dataloaders > 1 else None)
                hook_name = "test_step" if trainer.testing else "validation_step"
                output = call._call_strategy_hook(trainer, hook_name, dataloader_iter)
                trainer._logger_connector.on_batch_end()
                if output is not None and not trainer.sanity_checking:
                    trainer._logger_connector.update_eval_step_metrics(self._seen_batches_per_dataloader[dataloader_idx])
                    self._seen_batches_per_dataloader[dataloader_idx] += 1
                return output is not None
            '''),
        ("loops.prediction_loop", "_PredictionLoop._predict_step", '''
            def _drain_call(self, dataloader_iter: Iterator, dataloader_idx: int) -> bool:
                """Calls the step after the end of its dataloader.

                Returns:
                    Whether the call returned a prediction.

                """
                predictions = call._call_strategy_hook(self.trainer, "predict_step", dataloader_iter)
                if predictions is not None and self._return_predictions:
                    self._predictions[dataloader_idx].append(move_data_to_device(predictions, torch.device("cpu")))
                return predictions is not None
            '''),
    ):
        module = source.module(dotted)
        module.add_import("from pytorch_lightning.loops.fetchers import _DataFetcherWrapper")
        module.insert_in_body(
            step,
            """
            if isinstance(dataloader_iter, _DataFetcherWrapper) and dataloader_iter.done:
                drain_call = functools.partial(self._drain_call, dataloader_iter, dataloader_idx)
                dataloader_iter.data_fetcher._end_of_data(drain_call, trainer.lightning_module.drain_dataloader_iter)
            """,
            at_end=True,
        )
        module.insert(drain_call, after=step)


PAGE = """
Steps that hold batches
=======================

A step that takes batch ``i + 1`` before it trains batch ``i`` still holds a batch when the data ends. To train it, set
``self.drain_dataloader_iter = True``. Lightning then calls the step again after the last batch, with ``done`` already
``True``, until a call returns ``None`` or raises ``StopIteration``. Each such call is a step call: its loss is
backpropagated and stepped, and no batch hook runs around it.

.. code-block:: python

    class Pipelined(LightningModule):
        def __init__(self):
            super().__init__()
            self.drain_dataloader_iter = True
            self.held = None

        def training_step(self, dataloader_iter):
            if self.held is None:
                # with nothing held after the end, this raises `StopIteration`: the loop stops calling
                self.held = next(dataloader_iter)
            batch, _, _ = self.held
            self.held = next(dataloader_iter, None)  # start loading the next batch
            return self.compute_loss(batch)

Under automatic optimization a call that returns ``None`` counts as an optimizer step, as for any training step, so
end with ``StopIteration`` there. Validation, test and prediction steps are called again at each dataloader's end in
the same way. Under DDP every rank
must hold as many batches, because each of these calls all-reduces its gradients.

Without ``drain_dataloader_iter`` Lightning never calls a step after its data ended. Where the step's first call took
more batches than its later calls, Lightning warns that the step may still hold them.
"""


ITEM = Item(
    4,
    "Call a dataloader_iter step again after its data ends, when the module asks for it",
    """
A step that pipelines (it takes batch i+1 before it trains batch i) holds a batch when its data ends, and the loop
never called it again for sized loaders. `LightningModule.drain_dataloader_iter = True` has the training,
evaluation and prediction loops call the step again after each dataloader's last batch until it returns `None` or
raises `StopIteration`. Without it the loop makes no such call, and warns where the step's first call took more
batches than its later ones, as a step that holds batches does.
""",
    _drain,
    changelog=(
        ("Added", "`LightningModule.drain_dataloader_iter`: the loops call a step taking `dataloader_iter` again"
                  f" after its data ends, until it returns `None` ({issue(18498)})"),
    ),
    tests=("loops/test_dataloader_iter_drain.py",),
    docs=(("data/dataloader_iter.rst", PAGE),),
)
