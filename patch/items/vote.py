"""[RFC 8] Under DDP the ranks agree on the end of data before each step call, in stock's collective."""

from patch.edits import LightningSource
from patch.items import Item


def _vote(source: LightningSource) -> None:
    # the fetcher's record of the step calls votes before each call (item 2), and the training loop knows whether
    # its ranks vote at all (item 3, for its drain calls); here the vote takes the place of stock's broadcast
    epoch_loop = source.module("loops.training_epoch_loop")
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop._broadcast_sigterm_tensor",
        """
        vote = self._vote_since_the_last_call() if self.trainer.fit_loop.prefetching_fetcher is not None else None
        if vote is not None:
            # the ranks' vote between the step calls carried rank 0's SIGTERM flag: no broadcast of its own
            if vote.sigterm:
                with contextlib.suppress(Exception):
                    torch.distributed.barrier()  # prevent deadlocks by syncing all ranks before exit
                raise SIGTERMException()
            return
        """,
        at_start=True,
    )


ITEM = Item(
    8,
    "Under DDP the ranks agree on the end of data before each step call",
    """
Under DDP each step call ends in a gradient all-reduce. A rank whose data ends first (an unevenly sharded
IterableDataset, or a step that takes a different number of batches per call on each rank) stopped while its peers
waited in that collective until the process-group timeout. With `dataloader_iter`, the ranks now agree on the end of
data between two step calls and after each drain call, so all stop at the same call. The vote between two calls is
the collective Lightning already makes there: one all-reduce carries rank 0's SIGTERM flag (which
`_broadcast_sigterm_tensor` broadcast), whether each rank has a batch, whether a rank's call was cut short and
whether every rank's step pulled batches ahead (the drain decision, item 3), whether a rank's look-ahead sees its
data end within the next call (the accumulation window's gradient sync), and whether each rank continues the
dataloader: a rank whose step holds batches while a peer still has some drains them beside the peer's regular calls,
one call each (a pipeline's loading thread may take the last batch a call earlier on one rank than on another).
Where the call's backward all-reduces the gradients (automatic optimisation, no accumulation window skipping the
sync, no communication hook of the user's on the DDP model), the flags ride in that all-reduce, appended to DDP's
first bucket by the communication hook `_VoteInGradients` registers: the call meets its peers once, where a batch of
the regular flavour meets them in the broadcast and in the gradients' all-reduce. Any other call votes in an
all-reduce of its own where Lightning broadcast, started without waiting as the backward ends and read after the
optimizer step. Each epoch's first call is preceded by a vote of its own (no backward precedes it). The vote lives
in the fetcher's record of the step calls (`_EpochStepCalls` in `loops/fetchers.py`).
""",
    _vote,
    changelog=(
        ("Fixed", (
            "Under DDP, ranks whose `training_step(dataloader_iter)` runs out of data at different step calls"
            " stop at the same call instead of hanging in the gradient all-reduce: the ranks agree on the end"
            " of data in the gradients' all-reduce of each call's backward, or in place of the SIGTERM broadcast"
            " before the call"
        )),
    ),
    tests=("loops/test_dataloader_iter_ddp.py",),
)
