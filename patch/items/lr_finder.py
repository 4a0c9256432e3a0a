"""The LR finder records a rate per optimizer step whatever the batches a step call takes."""

from patch.edits import LightningSource
from patch.items import Item, issue


def _ask_the_loop(source: LightningSource) -> None:
    finder = source.module("tuner.lr_finder")
    for hook in ("on_train_batch_start", "on_train_batch_end"):
        finder.replace_condition(
            f"_LRCallback.{hook}", "trainer.accumulate_grad_batches", "trainer.fit_loop._should_accumulate()"
        )


ITEM = Item(
    6,
    "Let the LR finder ask the loop whether the optimizer steps",
    """
The LR finder recorded a rate and a loss whenever `(fit_loop.batch_idx + 1) % accumulate_grad_batches == 0`.
`batch_idx` counts batches, the accumulation window counts calls of a step taking `dataloader_iter`: the finder
recorded several rates per optimizer step. It now asks the loop whether the running call steps the optimizer, the
same answer for a regular step, which also closes the window at the epoch's last batch.
""",
    _ask_the_loop,
    changelog=(
        ("Fixed", "The LR finder records one rate per optimizer step when a `training_step(dataloader_iter)` takes"
                  f" several batches per call ({issue(18498)})"),
    ),
    tests=("tuner/test_lr_finder_dataloader_iter.py",),
)
