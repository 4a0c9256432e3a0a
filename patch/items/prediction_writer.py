"""[RFC 15] BasePredictionWriter accepts ``predict_step(self, dataloader_iter)``."""

from patch.edits import LightningSource
from patch.items import Item


def _accept_the_flavour(source: LightningSource) -> None:
    writer = source.module("callbacks.prediction_writer")
    # the guard was the whole override: Callback.setup is what remains
    writer.remove("BasePredictionWriter.setup")
    writer.remove_imported_name("is_param_in_hook_signature")
    writer.extend_docstring(
        "BasePredictionWriter.write_on_batch_end",
        """
        With ``predict_step(self, dataloader_iter)``, ``batch_indices`` holds the sample indices of every batch the
        step call consumed, and ``batch`` and ``batch_idx`` are those the batch-end hooks receive. A call made after
        the dataloader's last batch, for a step that still held batches it pulled ahead, has no batch of its own: it
        is written with ``batch=None`` and ``batch_idx=None``, and with the indices of the batches it took, if any.
        """,
    )


ITEM = Item(
    15,
    "BasePredictionWriter accepts predict_step(self, dataloader_iter)",
    """
`BasePredictionWriter.setup` raised NotImplementedError for any module whose `predict_step` takes
`dataloader_iter`, before any loop ran. The prediction loop now gives the writers, per step call, the sample indices
of every batch the call consumed (item 7), so the guard goes. `write_on_batch_end`'s docstring says what a writer
gets for the flavour, a drain call's `batch=None` and `batch_idx=None` included.
""",
    _accept_the_flavour,
    changelog=(
        ("Fixed", (
            "`BasePredictionWriter` accepts a `predict_step` taking `dataloader_iter` and gets the sample "
            "indices of every batch each call consumed"
        )),
    ),
    tests=("callbacks/test_prediction_writer_dataloader_iter.py",),
)
