"""[RFC 12] The LR finder asks the loop whether the running step call steps the optimizer."""

from patch.edits import LightningSource
from patch.items import Item


def _ask_the_loop(source: LightningSource) -> None:
    finder = source.module("tuner.lr_finder")
    for hook in ("on_train_batch_start", "on_train_batch_end"):
        # Lightning's finder computes the window from `fit_loop.batch_idx`, which counts batches; the loop's own
        # answer counts what the window counts (step calls, once the step pulls its batches: item 5)
        finder.replace_condition(
            f"_LRCallback.{hook}", "trainer.accumulate_grad_batches", "trainer.fit_loop._should_accumulate()"
        )


ITEM = Item(
    12,
    "The LR finder asks the loop whether the running step call steps the optimizer",
    """
The finder recorded a learning rate and a loss whenever `(fit_loop.batch_idx + 1) % accumulate_grad_batches == 0`.
With `training_step(self, dataloader_iter)` taking several batches per call, `batch_idx` counts batches while the
accumulation window counts step calls, so the finder recorded rates more than once per optimizer step and suggested
another rate. It now asks the loop (`fit_loop._should_accumulate()`), which is the same answer for the regular
flavour, and also closes the window at the epoch's last batch as the optimisation loop does.
""",
    _ask_the_loop,
    changelog=(
        ("Fixed", (
            "The learning-rate finder records one learning rate per optimizer step when a "
            "`training_step(dataloader_iter)` takes several batches per call"
        )),
    ),
    tests=("tuner/test_lr_finder_dataloader_iter.py",),
)
