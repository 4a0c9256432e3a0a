"""[RFC 9] ``self.log`` infers the batch size from the samples the step consumed."""

import ast

from patch.edits import LightningSource, ModuleSource, calls
from patch.items import Item, UpdatedTest
from patch.transplant import definition_source
from prototypes.lightning_changes.log_batch_size import samples_in


def _mentions_dataloader_iter(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "dataloader_iter" in ast.unparse(node.test)


def _batch_size_from_the_loop(source: LightningSource) -> None:
    # Why beside `extract_batch_size`: it is its sum over a step call's batches, and `core/module.py` imports
    # utilities, never the loops (which import it)
    source.module("utilities.data").insert(definition_source(samples_in, name="samples_in"),
                                           after="extract_batch_size")
    module = source.module("core.module")
    module.add_import("from pytorch_lightning.utilities.data import samples_in")
    module.insert_in_body(
        "LightningModule.log",
        """
        if batch_size is None and trainer.training and trainer.fit_loop.prefetching_fetcher is not None:
            # the loop knows the batches the running step call consumed (before its first next(), the batch it will
            # get); the guard below still asks for `batch_size=` when their size cannot be inferred
            batch_size = samples_in(trainer.fit_loop.prefetching_fetcher.step_batches())
        """,
        before=_mentions_dataloader_iter,
    )


def _log_without_batch_size(test: ModuleSource) -> None:
    step = "test_fetching_dataloader_iter_opt.TestModel.training_step"
    test.remove_statement(step, lambda node: isinstance(node, ast.With) and "pytest.raises" in ast.unparse(node))
    test.replace_statement(step, calls("self.log"), 'self.log("train_loss", loss["loss"])')


ITEM = Item(
    9,
    "self.log infers the batch size from the samples the step consumed",
    """
With `training_step(self, dataloader_iter)`, `self.log` required `batch_size=`, since Lightning could not know which
batches the step had taken. The loop knows: the batch size is now the samples in the batches the running step call
consumed (before its first `next()`, those of the batch it will get; 1 in a drain call). `batch_size=` is still
asked for when a batch's size cannot be inferred.
""",
    _batch_size_from_the_loop,
    changelog=(
        ("Fixed", (
            "`self.log` in a step taking `dataloader_iter` infers the batch size from the batches the step "
            "consumed, without `batch_size=`"
        )),
    ),
    tests=("core/test_dataloader_iter_log.py",),
    updated_tests=(
        UpdatedTest(
            "loops/test_fetchers.py", "test_fetching_dataloader_iter_opt",
            "`self.log` without `batch_size=` no longer raises: the batch size is inferred from the batches the step "
            "consumed",
            _log_without_batch_size,
        ),
    ),
)
