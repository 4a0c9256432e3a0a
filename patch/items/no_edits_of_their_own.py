"""The items whose change the patch makes elsewhere, or not in Lightning's code: each says where, or why."""

from patch.items import Item

TRANSFER = Item(
    4,
    "Every batch passes the precision conversion and the three transfer hooks when, or before, it is handed out",
    part="item 2's fetcher makes it",
    why="""
No code of its own (its CHANGELOG entry only): the fetcher of item 2 builds each batch with `_BatchTransfer`
(`loops/fetchers.py`), which converts its precision and runs `on_before_batch_transfer`,
`transfer_batch_to_device` and `on_after_batch_transfer` before the step's `next()` returns it. Lightning skipped
all four for a step taking `dataloader_iter`, which had to move its batches itself.
""",
    changelog=(
        ("Fixed", (
            "Batches handed to a step taking `dataloader_iter` pass the precision conversion and the "
            "`on_before_batch_transfer`, `transfer_batch_to_device` and `on_after_batch_transfer` hooks, as a"
            " regular step's batch does"
        )),
    ),
)

LIMITS = Item(
    11,
    "A limit bounds what is read, not only what is trained; the profiler keeps its action names",
    part="item 2's producer makes it",
    why="""
No code of its own (its CHANGELOG entry only): the producer of item 2 (`_BatchProducer` in `loops/fetchers.py`) stops
reading at the loader's length and the `limit_*_batches` limit, so the look-ahead never reads past them, and the
loops keep their own classes, so the profiler's `[_TrainingEpochLoop].train_dataloader_next` names do not change.
""",
    changelog=(
        ('Fixed', (
            '`limit_train_batches`, `limit_val_batches`, `limit_test_batches` and `limit_predict_batches` '
            'bound the batches read for a step taking `dataloader_iter`, not only those it trains'
        )),
    ),
)

TRAINER_OBJECT = Item(
    16,
    "Every loop change leaves the Trainer an object Lightning and its users can copy",
    part="item 2's fetcher makes it",
    why="""
No code of its own (its CHANGELOG entry only): the fetcher of item 2 holds the run's hooks only while a loop over the
data runs (its producer is dropped when the loop stops), so a Trainer pickles (`strategy="ddp_spawn"`) and
deep-copies as before, and the progress objects keep exactly Lightning's fields, so a regular module's checkpoint is
stock Lightning's.
""",
    changelog=(
        ('Changed', (
            'A Trainer whose step takes `dataloader_iter` still pickles (`strategy="ddp_spawn"`), deep-copies'
            " and checkpoints as any Trainer, and a regular module's checkpoint is unchanged"
        )),
    ),
)
