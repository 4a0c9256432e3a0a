"""A TorchRec client, written as a TorchRec user writes it (clause C19).

An ``EmbeddingBagCollection`` of two tables plus a linear head, its tables sharded table-wise by TorchRec's
``DistributedModelParallel`` over the ranks of a gloo group on the CPU (one rank, or two: then each rank holds one
table and the input all-to-all routes the other table's features to its peer), with FBGEMM's fused CPU kernel
(the tables' optimizer runs inside the backward, as on a GPU), trained by one of TorchRec's train pipelines,
unmodified: under a Lightning ``training_step(self, dataloader_iter)`` and, as the reference, under a plain loop
over the same batches.

Two kinds of pipeline: ``TrainPipelineBase``, ``TrainPipelineSparseDist``, ``TrainPipelineSemiSync`` and
``PrefetchTrainPipelineSparseDist`` run forward, backward and the optimizer step inside ``progress()`` and raise
StopIteration once empty; ``StagedTrainPipeline`` only runs the stages before the forward (here a copy and a
post-processing stage, two batches in flight) and returns the next batch, or None once empty; the caller trains it.

*CPU stand-ins* for the stream objects of the semi-sync and prefetch pipelines: ``torchrec_cpu_streams.py``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.train_pipeline import (
    EvalPipelineSparseDist,
    StagedTrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)
from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage
from torchrec.distributed.train_pipeline.train_pipelines import PrefetchTrainPipelineSparseDist, TrainPipelineSemiSync
from torchrec.streamable import Pipelineable

from tests.conformance.torchrec_cpu_streams import with_cpu_side_streams

N_ITEMS = 16  # 8 batches per epoch
BATCH_SIZE = 2
EPOCHS = 3
TABLES = ("t0", "t1")  # one per rank when sharded over two
TABLE_ROWS = 8
LR = 0.1
SEMI_SYNC_START = 2  # TorchRec's synchronous warm-up, in batches, before semi-sync training (its default: 900)


def staged_pipeline(model: nn.Module, optimizer: Any, device: torch.device) -> StagedTrainPipeline:
    """TorchRec's ``StagedTrainPipeline`` with the stages of its own example: a copy to the device, then a
    post-processing stage (the identity here), each on a stream of its own (the CPU's stream objects)."""
    return StagedTrainPipeline(pipeline_stages=[
        PipelineStage(name="data_copy", runnable=lambda batch: batch.to(device, non_blocking=True),
                      stream=torch.Stream(device.type)),
        PipelineStage(name="postproc", runnable=lambda batch: batch, stream=torch.Stream(device.type)),
    ], compute_stream=torch.Stream(device.type))


def prefetch_pipeline(model: nn.Module, optimizer: Any, device: torch.device) -> TrainPipelineSparseDist:
    return with_cpu_side_streams(PrefetchTrainPipelineSparseDist(model, optimizer, device))


def semi_sync_pipeline(model: nn.Module, optimizer: Any, device: torch.device) -> TrainPipelineSparseDist:
    return with_cpu_side_streams(TrainPipelineSemiSync(model, optimizer, device, start_batch=SEMI_SYNC_START))


# name -> (the pipeline given model, optimizer and device; whether progress() trains the batch itself)
PIPELINES = {
    "TrainPipelineBase": (TrainPipelineBase, True),
    "TrainPipelineSparseDist": (TrainPipelineSparseDist, True),
    "StagedTrainPipeline": (staged_pipeline, False),
    "TrainPipelineSemiSync": (semi_sync_pipeline, True),
    "PrefetchTrainPipelineSparseDist": (prefetch_pipeline, True),
}


def start_epoch(pipeline: Any) -> None:
    """TorchRec's own way to start an epoch: ``flush_end()`` refills a staged pipeline, ``reset()`` the others."""
    if isinstance(pipeline, StagedTrainPipeline):
        pipeline.flush_end()
    else:
        pipeline.reset()


# --------------------------------------------------------------------------------------------------- process group
class SingleProcessGroup:
    """A gloo process group of one rank, as ``DistributedModelParallel`` needs one; torn down by ``close``."""

    def __init__(self) -> None:
        self._folder = tempfile.TemporaryDirectory()
        store = Path(self._folder.name) / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)

    def close(self) -> None:
        dist.destroy_process_group()
        self._folder.cleanup()


# --------------------------------------------------------------------------------------------------- data
@dataclass
class Batch(Pipelineable):
    """What the loader yields: the sample ids (what the tests follow), a sparse feature per table and a label."""

    ids: torch.Tensor
    features: KeyedJaggedTensor
    label: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> Batch:
        return Batch(self.ids.to(device, non_blocking=non_blocking),
                     self.features.to(device, non_blocking=non_blocking),
                     self.label.to(device, non_blocking=non_blocking))

    def record_stream(self, stream: Any) -> None:
        if not isinstance(stream, torch.cuda.Stream):
            return  # the pipelines pass the CPU's stream object: no allocator to tell
        self.ids.record_stream(stream)
        self.features.record_stream(stream)
        self.label.record_stream(stream)

    def pin_memory(self) -> Batch:
        return Batch(self.ids.pin_memory(), self.features.pin_memory(), self.label.pin_memory())


def collate(ids: list[int]) -> Batch:
    ids_tensor = torch.tensor(ids)
    # two values per sample and table (a KeyedJaggedTensor lists every sample of one key, then of the next), so in
    # each table every sample touches rows a neighbouring sample touches too
    values = torch.cat([torch.stack([ids_tensor + shift, ids_tensor + shift + 1], dim=1).flatten() % TABLE_ROWS
                        for shift in range(len(TABLES))])
    features = KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{table}" for table in TABLES], values=values,
                                                   lengths=torch.full((len(TABLES) * len(ids),), 2))
    return Batch(ids_tensor, features, (ids_tensor % 3).float())


class SizedIds(Dataset):
    """Ids ``first`` .. ``first + N_ITEMS - 1`` (each rank and each validation loader has its own ``first``)."""

    def __init__(self, first: int) -> None:
        self.first = first

    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> int:
        return self.first + i


class UnsizedIds(IterableDataset):
    """``SizedIds`` without ``__len__``; with workers, worker k yields ids first+k, first+k+W, ..."""

    def __init__(self, first: int) -> None:
        self.first = first

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(self.first + start, self.first + N_ITEMS, step))


def make_loader(kind: str, num_workers: int, first: int = 0) -> DataLoader:
    dataset = SizedIds(first) if kind == "sized" else UnsizedIds(first)
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=num_workers, collate_fn=collate)


def loader_ids(loader: DataLoader) -> list[list[int]]:
    """The sample ids of each batch, in the loader's order: what each epoch must train."""
    return [batch.ids.tolist() for batch in loader]


# --------------------------------------------------------------------------------------------------- model
class SparseModel(nn.Module):
    """TorchRec's model contract: ``forward(batch) -> (loss, output)``; the output says which samples trained."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=table, embedding_dim=4, num_embeddings=TABLE_ROWS,
                                       feature_names=[f"f_{table}"]) for table in TABLES],
            device=torch.device("meta"),
        )
        self.head = nn.Linear(4 * len(TABLES), 1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.ebc(batch.features).values()
        loss = nn.functional.mse_loss(self.head(pooled).squeeze(-1), batch.label)
        return loss, torch.cat([loss.detach().view(1), batch.ids.float()])


def sharded_model(initial: dict[str, torch.Tensor] | None = None) -> DistributedModelParallel:
    """The model sharded by DistributedModelParallel over the process group's ranks, each table whole on one rank
    with FBGEMM's fused CPU kernel; with ``initial``, its parameters (this rank's shards) copied from it."""
    torch.manual_seed(0)
    module = SparseModel()
    constraints = {table: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
                   for table in TABLES}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=dist.get_world_size(), compute_device="cpu"),
                                       constraints=constraints)
    plan = planner.collective_plan(module, None, dist.GroupMember.WORLD)
    model = DistributedModelParallel(module, device=torch.device("cpu"), plan=plan)
    if initial is not None:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(initial[name])
    return model


def parameters_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


def trained_ids(output: torch.Tensor) -> list[int]:
    return output[1:].long().tolist()


# --------------------------------------------------------------------------------------------------- the two drivers
class TorchRecModule(pl.LightningModule):
    """The Lightning side, as a TorchRec user writes it.

    The model is sharded in ``configure_model``, where Lightning has set up the process group TorchRec needs. The
    pipeline gets ``self.optimizers()`` (Lightning's wrapper of the SGD it configures), so each of the pipeline's
    ``optimizer.step()`` calls counts in ``trainer.global_step``; given the raw ``torch.optim.SGD``, as TorchRec's
    examples do, ``global_step`` would stay 0. The step strips the ``(batch, batch_idx, dataloader_idx)`` triples
    and hands the pipeline the batches; an epoch starts with TorchRec's own way to start one (``start_epoch``);
    validation runs, after TorchRec's ``detach()``, the model's own forward or (``eval_pipeline``) TorchRec's
    ``EvalPipelineSparseDist``, ``reset()`` at each validation dataloader's start. Nothing else: the pipeline runs
    forward, backward and the optimizer step itself, or, after a staged pipeline, the step does, as TorchRec's
    example loop does, returning None once it is empty.

    ``raw_optimizer``: TorchRec's own example style instead: the pipeline (and, after a staged pipeline, the step) gets
    the raw optimizer, ``self.optimizers(use_pl_optimizer=False)``, and the step returns None.
    """

    def __init__(self, pipeline: str, eval_pipeline: bool = False, raw_optimizer: bool = False) -> None:
        super().__init__()
        self.drain_dataloader_iter = True  # the opt-in to drain calls (C17)
        self.raw_optimizer = raw_optimizer
        self.automatic_optimization = False  # the pipeline (or the step, after a staged pipeline) steps it
        self.model: DistributedModelParallel | None = None
        self.initial: dict[str, torch.Tensor] = {}
        self.make_pipeline, self.pipeline_trains = PIPELINES[pipeline]
        self.pipeline: Any = None
        self.evaluates_with_pipeline = eval_pipeline  # validation through TorchRec's EvalPipelineSparseDist
        self.eval_pipeline: EvalPipelineSparseDist | None = None
        self.evaluated_loader = 0  # the validation dataloader the eval pipeline was last reset for
        self.validation_losses: list[list[float]] = []  # per validation run, each batch's loss
        self.trained: list[list[list[int]]] = []  # per epoch, the sample ids of each batch trained, in order
        self.validated: list[list[list[int]]] = []  # per validation run, the sample ids of each batch validated

    def configure_model(self) -> None:
        if self.model is None:
            self.model = sharded_model()
            self.initial = parameters_of(self.model)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=LR)

    def optimizer(self) -> Any:
        return self.optimizers(use_pl_optimizer=not self.raw_optimizer)

    def on_train_start(self) -> None:
        self.pipeline = self.make_pipeline(self.model, self.optimizer(), self.device)
        if self.evaluates_with_pipeline:
            self.eval_pipeline = EvalPipelineSparseDist(self.model, self.optimizers(), self.device)

    def on_train_epoch_start(self) -> None:
        start_epoch(self.pipeline)
        self.trained.append([])

    def training_step(self, dataloader_iter):
        batches = (batch for batch, _, _ in dataloader_iter)
        if self.pipeline_trains:
            output = self.pipeline.progress(batches)
        else:
            batch = self.pipeline.progress(batches)
            if batch is None:  # the staged pipeline is empty
                return None
            optimizer = self.optimizer()
            optimizer.zero_grad()
            loss, output = self.model(batch)
            self.manual_backward(loss)
            optimizer.step()
        self.trained[-1].append(trained_ids(output))
        return None if self.raw_optimizer else output[0]

    def on_validation_epoch_start(self) -> None:
        # TorchRec's own way to use the model outside its train pipeline: a sparse-dist pipeline has rewritten the
        # embedding modules' forward for pipelining, `detach()` restores it and `attach()` (at the run's end)
        # rewrites it again; TrainPipelineSparseDist's `progress()` would attach by itself, the prefetch one's not
        detach = getattr(self.pipeline, "detach", None)
        if detach is not None:
            detach()
        if self.eval_pipeline is not None:
            self.eval_pipeline.reset()  # TorchRec's way to start a run: stops the last run's loading thread
        self.evaluated_loader = 0
        self.validated.append([])
        self.validation_losses.append([])

    def on_validation_epoch_end(self) -> None:
        attach = getattr(self.pipeline, "attach", None)
        if attach is not None:
            attach()

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.eval_pipeline is not None and dataloader_idx != self.evaluated_loader:
            # the next validation dataloader: its loading thread is to pull from that dataloader's iterator
            self.eval_pipeline.reset()
            self.evaluated_loader = dataloader_idx

    def validation_step(self, dataloader_iter):
        batches = (batch for batch, _, _ in dataloader_iter)
        if self.eval_pipeline is not None:
            # the pipeline's loading thread keeps pulling from `batches` between and during the calls; it holds two
            # batches at the end of the data and returns their outputs in the calls after, then raises StopIteration
            output = self.eval_pipeline.progress(batches)
        else:
            _, output = self.model(next(batches))
        self.validated[-1].append(trained_ids(output))
        self.validation_losses[-1].append(output[0].item())
        return output


def plain_loop(pipeline: str, initial: dict[str, torch.Tensor], loader: DataLoader,
               eval_loaders: tuple[DataLoader, ...] = (), epochs: int = EPOCHS) -> tuple[list, dict, list]:
    """The same pipeline driven as TorchRec's own examples drive it: ``progress`` until StopIteration, per epoch.

    With ``eval_loaders``, after each epoch an ``EvalPipelineSparseDist`` over each in turn, ``reset()`` before
    each, ``progress`` until StopIteration. Returns the sample ids of each batch trained per epoch, the final
    parameters, and per validation run the ``(sample ids, loss)`` of each batch evaluated (all loaders in turn).
    """
    model = sharded_model(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    make_pipeline, pipeline_trains = PIPELINES[pipeline]
    pipe = make_pipeline(model, optimizer, torch.device("cpu"))
    evaluate = EvalPipelineSparseDist(model, optimizer, torch.device("cpu")) if eval_loaders else None
    trained: list[list[list[int]]] = []
    evaluated: list[list[tuple[list[int], float]]] = []
    for _ in range(epochs):
        start_epoch(pipe)
        trained.append([])
        batches = iter(loader)
        while True:
            if pipeline_trains:
                try:
                    output = pipe.progress(batches)
                except StopIteration:
                    break
            else:
                batch = pipe.progress(batches)
                if batch is None:
                    break
                optimizer.zero_grad()
                loss, output = model(batch)
                loss.backward()
                optimizer.step()
            trained[-1].append(trained_ids(output))
        if evaluate is None:
            continue
        pipe.detach()
        evaluated.append([])
        for eval_loader in eval_loaders:
            evaluate.reset()
            eval_batches = iter(eval_loader)
            while True:
                try:
                    output = evaluate.progress(eval_batches)
                except StopIteration:
                    break
                evaluated[-1].append((trained_ids(output), output[0].item()))
        pipe.attach()
    return trained, parameters_of(model), evaluated
