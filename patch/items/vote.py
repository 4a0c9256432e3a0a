"""[RFC 8] Under DDP the ranks agree on the end of data before each step call."""

from patch.edits import LightningSource
from patch.items import Item
from patch.items.look_ahead import LIGHTNING_PACKAGE
from patch.transplant import methods_source
from prototypes.lightning_changes.epoch_loop import BatchCountingEpochLoop


def _vote(source: LightningSource) -> None:
    # what the training loop keeps of the vote: whether its drain calls need it (the fetcher's record of the step
    # calls votes before each call itself: item 2)
    epoch_loop = source.module("loops.training_epoch_loop")
    epoch_loop.add_import(f"from {LIGHTNING_PACKAGE}.common import end_of_data_vote_needed")
    epoch_loop.add_import("from pytorch_lightning.utilities.combined_loader import CombinedLoader")
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop.__init__",
        """
        self._vote_decided_for: Optional[CombinedLoader] = None  # the combined loader `_ranks_vote` was decided for
        self._ranks_vote = False
        """,
        at_end=True,
    )
    epoch_loop.insert(
        methods_source(BatchCountingEpochLoop, ("_every_rank_has_a_batch", "_ranks_vote_every_step")),
        after="_TrainingEpochLoop._drain_call",
    )


ITEM = Item(
    8,
    "Under DDP the ranks agree on the end of data before each step call",
    """
Under DDP each step call ends in a gradient all-reduce. A rank whose data ends first (an unevenly sharded
IterableDataset, or a step that takes a different number of batches per call on each rank) stopped while its peers
waited in that collective until the process-group timeout. With `dataloader_iter`, the ranks now agree on the end of
data before each step call and after each drain call (one all-reduce of a one-element flag), so all stop at the same
call. The vote lives in the fetcher's record of the step calls (`loops/_dataloader_iter/step_calls.py`).
""",
    _vote,
)
