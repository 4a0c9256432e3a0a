"""Evaluation and prediction steps taking ``dataloader_iter``: an iterator per dataloader, batches transferred and
counted."""

import ast

from patch.edits import LightningSource
from patch.items import Item, issue
from patch.statements import calls


def _evaluation_and_prediction(source: LightningSource) -> None:
    for dotted, loop_class, step in (
        ("loops.evaluation_loop", "_EvaluationLoop", "_evaluation_step"),
        ("loops.prediction_loop", "_PredictionLoop", "_predict_step"),
    ):
        module = source.module(dotted)
        module.add_import("import functools")
        module.add_import("from pytorch_lightning.loops.utilities import _transfer_batch")
        module.remove_comment(f"{loop_class}.run", "correctness cannot be guaranteed")
        # a step that runs out of its dataloader's batches ends that dataloader, not the others
        module.replace_statement(
            f"{loop_class}.run",
            lambda node: isinstance(node, ast.Break),
            "if data_fetcher.done:\n    break",
        )
        module.insert_in_body(
            f"{loop_class}.reset",
            """
            if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
                data_fetcher._transfer = functools.partial(_transfer_batch, self.trainer)
            """,
            before=lambda node: isinstance(node, ast.Assign)
            and ast.unparse(node) == "self._data_fetcher = data_fetcher",
        )
        module.replace_statement(
            f"{loop_class}.{step}",
            lambda node: isinstance(node, ast.If) and "using_dataloader_iter :=" in ast.unparse(node.test),
            """
            if not (using_dataloader_iter := isinstance(data_fetcher, _DataLoaderIterDataFetcher)):
                batch = _transfer_batch(trainer, batch, dataloader_idx)
            """,
        )
    module = source.module("core.module")
    for step in ("validation_step", "test_step", "predict_step"):
        module.extend_docstring(
            f"LightningModule.{step}",
            "To take the batches yourself, declare ``dataloader_iter`` in place of ``batch`` and ``batch_idx``:\n"
            "see :ref:`dataloader_iter`.",
        )
    evaluation = source.module("loops.evaluation_loop")
    evaluation.replace_statement(
        "_EvaluationLoop._evaluation_step",
        lambda node: isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "output",
        """
        try:
            output = call._call_strategy_hook(trainer, hook_name, *step_args)
        except StopIteration:
            if not using_dataloader_iter:
                raise
            output = None  # the step ran out of batches: its dataloader ends here
        """,
    )
    evaluation.insert_in_body(
        "_EvaluationLoop._evaluation_step",
        """
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            # progress counts the batches the step took, not its calls
            self.batch_progress.increment_by(data_fetcher._end_step_call() - 1, is_last_batch=data_fetcher.done)
        """,
        after=calls("self.batch_progress.increment_processed"),
    )
    prediction = source.module("loops.prediction_loop")
    prediction.replace_statement(
        "_PredictionLoop._predict_step",
        lambda node: isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "predictions",
        """
        try:
            predictions = call._call_strategy_hook(trainer, "predict_step", *step_args)
        except StopIteration:
            if not using_dataloader_iter:
                raise
            predictions = None  # the step ran out of batches: its dataloader ends here
        if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
            # progress counts the batches the step took, not its calls
            self.batch_progress.increment_by(data_fetcher._end_step_call() - 1)
        """,
    )


PAGE = """
Validation, test and prediction
===============================

``validation_step``, ``test_step`` and ``predict_step`` can take ``dataloader_iter`` as well. Each dataloader gets an
iterator of its own: a call never takes the batches of two dataloaders, ``batch_idx`` starts at 0 for each, and
``done`` turns ``True`` at each dataloader's end. Before, one iterator spanned all the dataloaders.
"""


ITEM = Item(
    2,
    "Give evaluation and prediction steps taking dataloader_iter an iterator per dataloader",
    """
Validation, test and prediction steps taking `dataloader_iter` got one iterator over all their dataloaders, so a
call could take the batches of two of them, and their progress counted calls. Each dataloader now gets an iterator
of its own, its batches pass the transfer hooks, and progress counts batches. A call that runs out of its
dataloader's batches ends that dataloader, not the run.
""",
    _evaluation_and_prediction,
    changelog=(
        ("Changed", "Validation, test and prediction steps taking `dataloader_iter` get one iterator per dataloader,"
                    f" and their progress counts batches ({issue(18498)})"),
    ),
    tests=("loops/test_dataloader_iter_evaluation.py",),
    docs=(("data/dataloader_iter.rst", PAGE),),
)
