"""Under distributed training, the ranks agree after each call of a step taking ``dataloader_iter`` whether the data
has ended, in one all-reduce in place of the SIGTERM broadcast."""

import ast

from patch.edits import LightningSource
from patch.items import Item, issue


def _vote(source: LightningSource) -> None:
    loop = source.module("loops.training_epoch_loop")
    loop.add_import("import warnings")
    loop.replace_condition(
        "_TrainingEpochLoop.advance",
        "self.trainer.world_size",
        "torch.distributed.is_available() and torch.distributed.is_initialized() and self.trainer.world_size > 1"
        " and not isinstance(data_fetcher, _DataLoaderIterDataFetcher)",
    )
    loop.extend_docstring(
        "_TrainingEpochLoop._look_for_end_of_data",
        """
        Under distributed training the ranks agree on both, so that they stop at the same step call and synchronize
        the same gradients, in one all-reduce that also carries the SIGTERM flag in place of its broadcast.
        """,
    )
    loop.insert_in_body(
        "_TrainingEpochLoop._look_for_end_of_data",
        """
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.trainer.world_size > 1:
            # the furthest state of any rank: 1 the next call may take the last batch, 2 the data ended, 3 SIGTERM
            state = 3 if self.trainer.received_sigterm else 2 if ended else int(last_call)
            votes = torch.tensor([state], dtype=torch.int, device=self.trainer.strategy.root_device)
            try:
                torch.distributed.all_reduce(votes, op=torch.distributed.ReduceOp.MAX)
            except RuntimeError as error:
                raise RuntimeError(
                    f"rank {self.trainer.global_rank} waited in vain for the other ranks after a call of"
                    " `training_step`: one is still inside its call, waiting for this rank, as a pipeline-parallel"
                    " stage does when another stage ran out of batches. Start a call only where"
                    " `dataloader_iter.has_batches(n)` says its `n` batches remain."
                ) from error
            furthest = votes.item()
            if furthest == 3:
                with contextlib.suppress(Exception):
                    torch.distributed.barrier()  # prevent deadlocks by syncing all ranks before exit
                raise SIGTERMException()
            if furthest == 2 and not ended:
                warnings.warn(
                    f"rank {self.trainer.global_rank}: the data of another rank ended, so the batches left on this rank"
                    " are not trained. Give every rank the same number of step calls.",
                    category=PossibleUserWarning,
                )
            ended, last_call = furthest == 2, furthest >= 1
        """,
        before=lambda node: isinstance(node, ast.Assign) and "is_last_batch" in ast.unparse(node.targets[0]),
    )


PAGE = """
Distributed training
====================

Under DDP, the ranks agree after each call whether the data has ended on any of them, so that every rank stops at the
same call. A rank that still has batches then warns that they are not trained: give every rank the same number of
calls, for example with a ``DistributedSampler`` and ``drop_last=True``. The agreement is one all-reduce per call,
which replaces the broadcast Lightning makes before each regular batch, and one more per epoch, before the first call.
"""


ITEM = Item(
    3,
    "Stop every rank at the same dataloader_iter step call",
    """
Under DDP, a rank whose data ended left the epoch while its peers waited in the next call's gradient all-reduce.
After each call of a step taking `dataloader_iter` the ranks now agree, in one all-reduce, whether the data has
ended on any rank and whether the next call may take the last batch (so that every rank syncs its gradients in
it). The all-reduce carries the SIGTERM flag and replaces the broadcast made before each batch; one more runs
before the epoch's first call. It sends one number, as the broadcast does: the states are ordered (data that ended
has no batch for the next call), so the furthest state any rank reached says all three. A rank left with batches
warns that they are not trained.
""",
    _vote,
    changelog=(
        ("Fixed", "Ranks stop at the same call of a `training_step(dataloader_iter)` when their data is uneven, instead"
                  f" of hanging ({issue(20404)})"),
    ),
    tests=("loops/test_dataloader_iter_ddp.py",),
    docs=(("data/dataloader_iter.rst", PAGE),),
)
