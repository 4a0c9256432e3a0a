"""A TorchRec client, written as a TorchRec user writes it (clause C19).

An ``EmbeddingBagCollection`` plus a linear head, sharded by TorchRec's ``DistributedModelParallel`` in a
single-process gloo group on the CPU, trained by one of TorchRec's train pipelines, unmodified: under a Lightning
``training_step(self, dataloader_iter)`` and, as the reference, under a plain loop over the same batches.

Two kinds of pipeline: ``TrainPipelineBase`` and ``TrainPipelineSparseDist`` run forward, backward and the
optimizer step inside ``progress()`` and raise StopIteration once empty; ``StagedTrainPipeline`` only runs the
stages before the forward (here a copy and a post-processing stage, two batches in flight) and returns the next
batch, or None once empty; the caller trains it.
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
from torchrec.distributed.train_pipeline import (
    EvalPipelineSparseDist,
    StagedTrainPipeline,
    TrainPipelineBase,
    TrainPipelineSparseDist,
)
from torchrec.distributed.train_pipeline.pipeline_stage import PipelineStage
from torchrec.streamable import Pipelineable

N_ITEMS = 16  # 8 batches per epoch
BATCH_SIZE = 2
EPOCHS = 3
TABLE_ROWS = 8
LR = 0.1


def staged_pipeline(model: nn.Module, optimizer: Any, device: torch.device) -> StagedTrainPipeline:
    """TorchRec's ``StagedTrainPipeline`` with the stages of its own example: a copy to the device, then a
    post-processing stage (the identity here), each on a stream of its own (the CPU's stream objects)."""
    return StagedTrainPipeline(pipeline_stages=[
        PipelineStage(name="data_copy", runnable=lambda batch: batch.to(device, non_blocking=True),
                      stream=torch.Stream(device.type)),
        PipelineStage(name="postproc", runnable=lambda batch: batch, stream=torch.Stream(device.type)),
    ], compute_stream=torch.Stream(device.type))


# name -> (the pipeline given model, optimizer and device; whether progress() trains the batch itself)
PIPELINES = {
    "TrainPipelineBase": (TrainPipelineBase, True),
    "TrainPipelineSparseDist": (TrainPipelineSparseDist, True),
    "StagedTrainPipeline": (staged_pipeline, False),
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
    """What the loader yields: the sample ids (what the tests follow), one sparse feature and a label."""

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
    # two feature values per sample, so every sample touches its own rows and a neighbour's
    values = torch.stack([ids_tensor % TABLE_ROWS, (ids_tensor + 1) % TABLE_ROWS], dim=1).flatten()
    features = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=values, lengths=torch.full((len(ids),), 2))
    return Batch(ids_tensor, features, (ids_tensor % 3).float())


class SizedIds(Dataset):
    def __len__(self) -> int:
        return N_ITEMS

    def __getitem__(self, i: int) -> int:
        return i


class UnsizedIds(IterableDataset):
    """Without ``__len__``; with workers, worker k yields ids k, k+W, k+2W, ..."""

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, N_ITEMS, step))


def make_loader(kind: str, num_workers: int) -> DataLoader:
    dataset = SizedIds() if kind == "sized" else UnsizedIds()
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
            tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=TABLE_ROWS, feature_names=["f"])],
            device=torch.device("meta"),
        )
        self.head = nn.Linear(4, 1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = self.ebc(batch.features).values()
        loss = nn.functional.mse_loss(self.head(pooled).squeeze(-1), batch.label)
        return loss, torch.cat([loss.detach().view(1), batch.ids.float()])


def sharded_model(initial: dict[str, torch.Tensor] | None = None) -> DistributedModelParallel:
    """The model sharded by DistributedModelParallel; with ``initial``, its parameters copied from it."""
    torch.manual_seed(0)
    model = DistributedModelParallel(SparseModel(), device=torch.device("cpu"))
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

    The pipeline gets ``self.optimizers()`` (Lightning's wrapper of the SGD it configures), so each of the
    pipeline's ``optimizer.step()`` calls counts in ``trainer.global_step``; given the raw ``torch.optim.SGD``, as
    TorchRec's examples do, ``global_step`` would stay 0. The step strips the ``(batch, batch_idx,
    dataloader_idx)`` triples and hands the pipeline the batches; an epoch starts with TorchRec's own way to start
    one (``start_epoch``); validation runs, after TorchRec's ``detach()``, the model's own forward or
    (``eval_pipeline``) TorchRec's ``EvalPipelineSparseDist``, ``reset()`` at each run's start. Nothing else: the
    pipeline runs forward, backward and the optimizer step itself, or, after a staged pipeline, the step does, as
    TorchRec's example loop does, returning None once it is empty.

    ``raw_optimizer``: TorchRec's own example style instead: the pipeline (and, after a staged pipeline, the step) gets
    the raw optimizer, ``self.optimizers(use_pl_optimizer=False)``, and the step returns None.
    """

    def __init__(self, pipeline: str, eval_pipeline: bool = False, raw_optimizer: bool = False) -> None:
        super().__init__()
        self.raw_optimizer = raw_optimizer
        self.automatic_optimization = False  # the pipeline (or the step, after a staged pipeline) steps it
        self.model = sharded_model()
        self.initial = parameters_of(self.model)
        self.make_pipeline, self.pipeline_trains = PIPELINES[pipeline]
        self.pipeline: Any = None
        self.evaluates_with_pipeline = eval_pipeline  # validation through TorchRec's EvalPipelineSparseDist
        self.eval_pipeline: EvalPipelineSparseDist | None = None
        self.validation_losses: list[list[float]] = []  # per validation run, each batch's loss
        self.trained: list[list[list[int]]] = []  # per epoch, the sample ids of each batch trained, in order
        self.validated: list[list[list[int]]] = []  # per validation run, the sample ids of each batch validated

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
        # embedding modules' forward for pipelining, `detach()` restores it, and its next `progress()` attaches again
        detach = getattr(self.pipeline, "detach", None)
        if detach is not None:
            detach()
        if self.eval_pipeline is not None:
            self.eval_pipeline.reset()  # TorchRec's way to start a run: stops the last run's loading thread
        self.validated.append([])
        self.validation_losses.append([])

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
               eval_loader: DataLoader | None = None) -> tuple[list, dict, list]:
    """The same pipeline driven as TorchRec's own examples drive it: ``progress`` until StopIteration, per epoch.

    With ``eval_loader``, after each epoch an ``EvalPipelineSparseDist`` over it, ``progress`` until StopIteration.
    Returns the sample ids of each batch trained per epoch, the final parameters, and per validation run the
    ``(sample ids, loss)`` of each batch evaluated.
    """
    model = sharded_model(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    make_pipeline, pipeline_trains = PIPELINES[pipeline]
    pipe = make_pipeline(model, optimizer, torch.device("cpu"))
    evaluate = EvalPipelineSparseDist(model, optimizer, torch.device("cpu")) if eval_loader is not None else None
    trained: list[list[list[int]]] = []
    evaluated: list[list[tuple[list[int], float]]] = []
    for _ in range(EPOCHS):
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
        evaluate.reset()
        evaluated.append([])
        eval_batches = iter(eval_loader)
        while True:
            try:
                output = evaluate.progress(eval_batches)
            except StopIteration:
                break
            evaluated[-1].append((trained_ids(output), output[0].item()))
    return trained, parameters_of(model), evaluated
