"""[RFC 15] BasePredictionWriter accepts ``predict_step(self, dataloader_iter)``."""

from patch.edits import LightningSource
from patch.items import Item


def _accept_the_flavour(source: LightningSource) -> None:
    writer = source.module("callbacks.prediction_writer")
    # the guard was the whole override: Callback.setup is what remains
    writer.remove("BasePredictionWriter.setup")
    writer.remove_imported_name("is_param_in_hook_signature")


ITEM = Item(
    15,
    "BasePredictionWriter accepts predict_step(self, dataloader_iter)",
    """
`BasePredictionWriter.setup` raised NotImplementedError for any module whose `predict_step` takes
`dataloader_iter`, before any loop ran. The prediction loop now gives the writers, per step call, the sample indices
of every batch the call consumed (item 7), so the guard goes.
""",
    _accept_the_flavour,
)
