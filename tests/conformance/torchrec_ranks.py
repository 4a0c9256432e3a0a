"""TorchRec on two gloo ranks (clause C19): each rank's fit under Lightning's DDP, then the same pipelines driven by
a plain loop in the same process group, both reported to the test by C16's launcher (``ddp.launch``).

The tables are sharded table-wise, one per rank, so every batch's features go through TorchRec's input all-to-all
and its pooled embeddings through the output all-to-all (gloo runs both on the CPU). Each rank trains its own
batches (no sampler: each rank's loader holds its own ids, the same number on every rank) with
``TrainPipelineSparseDist`` and validates, after each epoch, with ``EvalPipelineSparseDist`` over two validation
dataloaders of its own.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader

from tests.conformance.ddp import LAUNCH_DEADLINE_S, PG_TIMEOUT_S, WORLD, describe_error, launch
from tests.conformance.harness import QUIET
from tests.conformance.torchrec_client import (
    N_ITEMS,
    TorchRecModule,
    loader_ids,
    make_loader,
    parameters_of,
    plain_loop,
)

RANK_EPOCHS = 2
VALIDATION_LOADERS = 2
PIPELINE = "TrainPipelineSparseDist"
KINDS = ["sized", "unsized"]
# A passing launch (a fit and a plain loop per rank and loader kind, the kinds on process groups of their own at
# once) takes 3-10 s on two busy cores; a failing one is bounded by the process group's timeout (a rank that raised
# exits, so its peer's collective fails at once), then by this deadline.
RANKS_DEADLINE_S = LAUNCH_DEADLINE_S + 30
RANKS_TEST_TIMEOUT_S = RANKS_DEADLINE_S + 30


class ShardedModelDDPStrategy(DDPStrategy):
    """Lightning's DDP for a model that ``DistributedModelParallel`` has already made distributed.

    DMP shards the tables over the ranks and wraps the dense part in torch's ``DistributedDataParallel`` itself, so
    each rank's module holds different parameters (its own table, the other's as an empty shard). Lightning's
    ``DDPStrategy`` wraps the module in a second ``DistributedDataParallel``, whose construction compares the
    parameters across the ranks and fails (measured: "params[2] in this process with sizes [0] appears not to match
    sizes of the same param in process 0" on rank 1, "Connection closed by peer" on rank 0). This strategy keeps
    the rest of Lightning's DDP (the gloo process group, the ranks' collectives, the designs' end-of-data vote) and
    leaves the module unwrapped.
    """

    def configure_ddp(self) -> None:
        """DistributedModelParallel is the module's data-parallel wrapper: nothing to add."""


def rank_loader(kind: str, rank: int, validation: int | None = None) -> DataLoader:
    """Rank ``rank``'s training loader, or (``validation`` = 0, 1) one of its validation loaders: ids of its own."""
    block = 0 if validation is None else 1 + validation
    return make_loader(kind, num_workers=0, first=(block * WORLD + rank) * N_ITEMS)


def expected_batches(kind: str, rank: int) -> tuple[list, list]:
    """What rank ``rank`` must train in each epoch, and evaluate in each validation run (its loaders in turn)."""
    validated = [ids for v in range(VALIDATION_LOADERS) for ids in loader_ids(rank_loader(kind, rank, v))]
    return loader_ids(rank_loader(kind, rank)), validated


def fit_on_rank(design, rank: int, kind: str, _pattern: tuple) -> dict[str, Any]:
    """The rank's fit under ``design``, then (where the fit ended cleanly) the plain loop from the same weights."""
    module = TorchRecModule(PIPELINE, eval_pipeline=True)
    validation = [rank_loader(kind, rank, v) for v in range(VALIDATION_LOADERS)]
    error, trainer = None, None
    try:
        strategy = ShardedModelDDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
        trainer = design.trainer(**{**QUIET, "accelerator": "cpu", "devices": WORLD, "strategy": strategy,
                                    "use_distributed_sampler": False, "max_epochs": RANK_EPOCHS})
        trainer.fit(module, rank_loader(kind, rank), validation)
    except BaseException as raised:  # noqa: BLE001 - every outcome is reported to the test process
        error = describe_error(raised)
    outcome = dict(
        error=error, trained=module.trained, validated=module.validated, losses=module.validation_losses,
        global_step=None if trainer is None else trainer.global_step,
        weights=_listed(parameters_of(module.model)) if module.model is not None else {},
    )
    if error is None:
        try:
            trained, weights, evaluated = plain_loop(PIPELINE, module.initial, rank_loader(kind, rank),
                                                     tuple(validation), RANK_EPOCHS)
            outcome["plain_loop"] = dict(
                trained=trained, weights=_listed(weights),
                validated=[[ids for ids, _ in run] for run in evaluated],
                losses=[[loss for _, loss in run] for run in evaluated],
            )
        except BaseException as raised:  # noqa: BLE001 - as above
            outcome["plain_loop_error"] = describe_error(raised)
    return outcome


def _listed(parameters: dict) -> dict[str, list]:
    return {name: value.tolist() for name, value in parameters.items()}


_LAUNCHES: dict[str, dict] = {}


def ranks_outcome(design, kind: str) -> dict:
    """The two ranks' outcomes for ``kind``; the launch of both kinds runs once per design, on first use."""
    if design.id not in _LAUNCHES:
        _LAUNCHES[design.id] = launch(design, [[(k, ())] for k in KINDS], fit=fit_on_rank,
                                      deadline_s=RANKS_DEADLINE_S)
    return _LAUNCHES[design.id][kind, ()]
