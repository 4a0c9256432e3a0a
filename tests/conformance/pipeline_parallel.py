"""A Megatron-style pipeline-parallel step over two ranks (clause C19), run by C16's launcher (``ddp.py``).

Megatron-LM's ``forward_step(data_iterator, model)`` reads data on the first pipeline stage only; a later stage
receives activations from the stage before it instead of pulling a batch. Here rank 0 is stage 0 and rank 1 is
stage 1 of a two-layer model; each step call is one global batch of ``MICRO_BATCHES`` micro-batches, and the
pipeline is flushed within the call, as Megatron's schedules do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tests.conformance.harness import BATCH_SIZE, FEATURES, LR, RecordingModule, collate_items, ids, item

MICRO_BATCHES = 2  # per step call: one global batch
PIPELINE_ITEMS = 16  # 8 micro-batches of 2: 4 step calls per epoch
FIRST, LAST = 0, 1  # the stages' ranks


class PipelineStageModule(RecordingModule):
    """One stage of the pipeline, by rank.

    Stage 0 pulls each micro-batch with ``next()``, runs ``first`` and sends a header (1: an activation follows;
    0: the global batch is complete), then the activation and the target, to stage 1. Stage 1 never calls
    ``next()``: it receives headers and activations until header 0, runs ``layer`` and the loss on each, then
    backpropagates them in order and sends each activation's gradient back, which stage 0 backpropagates (all
    forwards, then all backwards: GPipe's schedule). Each stage steps the SGD of its own layer once per call
    (``self.optimizers()``, manual optimisation). The stages hold different layers, so Lightning's DDP wrapper must
    not average gradients across them (Megatron keeps data parallelism in groups of its own).

    A call of stage 0 with no batch left (a drain call) sends header 0 and ends with the StopIteration of its
    ``next()``; stage 1 then returns None, which ends its drain too (C17).
    """

    def __init__(self, rank: int) -> None:
        super().__init__(automatic=False)
        torch.manual_seed(0)
        self.first = torch.nn.Linear(FEATURES, FEATURES)
        self.stage = rank
        self.initial_weights = self.weights()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        own = self.first if self.stage == FIRST else self.layer
        return torch.optim.SGD(own.parameters(), lr=LR)

    def training_step(self, dataloader_iter):
        # no data-parallel averaging across stages; Lightning turns the sync back on after every step call
        self.trainer.strategy.model.require_backward_grad_sync = False
        self.step_calls += 1
        received: list[tuple] = []
        self.record.steps.append(received)
        optimizer = self.optimizers()
        optimizer.zero_grad()
        trained = self._first_stage(dataloader_iter, received) if self.stage == FIRST else self._last_stage()
        if not trained:
            return None
        optimizer.step()
        return torch.tensor(float(trained))

    def _first_stage(self, dataloader_iter, received: list[tuple]) -> int:
        activations = []
        for _ in range(MICRO_BATCHES):
            if dataloader_iter.done:
                dist.send(torch.zeros(1), LAST)
                if not activations:
                    next(dataloader_iter)  # the data ended: its StopIteration ends this call (and the drain)
                break
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            received.append((ids(batch), batch_idx, dataloader_idx))
            _, x, y = batch
            activation = self.first(x)
            dist.send(torch.ones(1), LAST)
            dist.send(torch.cat([activation.detach(), y], dim=1).contiguous(), LAST)
            activations.append(activation)
        else:
            dist.send(torch.zeros(1), LAST)  # the global batch is complete
        for activation in activations:
            gradient = torch.empty_like(activation)
            dist.recv(gradient, LAST)
            activation.backward(gradient)
        return len(activations)

    def _last_stage(self) -> int:
        activations, losses = [], []
        while True:
            header = torch.empty(1)
            dist.recv(header, FIRST)
            if not header.item():
                break
            received = torch.empty(BATCH_SIZE, FEATURES + 1)
            dist.recv(received, FIRST)
            activation = received[:, :FEATURES].clone().requires_grad_()
            activations.append(activation)
            losses.append(torch.nn.functional.mse_loss(self.layer(activation), received[:, FEATURES:]) / MICRO_BATCHES)
        for activation, loss in zip(activations, losses, strict=True):
            self.manual_backward(loss)
            dist.send(activation.grad.contiguous(), FIRST)
        return len(activations)

    def weights(self) -> dict[str, Any]:
        """Both stages' parameters by name (``first.*``, ``layer.*``), as lists: what a rank reports."""
        return {name: value.tolist() for name, value in self.state_dict().items()}


def reference_pipeline_weights(initial: dict[str, Any], batches: list[tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The same two-layer model trained serially: per global batch, the mean loss of its micro-batches, one SGD step."""
    model = torch.nn.ModuleDict(dict(first=torch.nn.Linear(FEATURES, FEATURES), layer=torch.nn.Linear(FEATURES, 1)))
    model.load_state_dict({name: torch.tensor(value) for name, value in initial.items()})
    first, last = model["first"], model["layer"]
    optimizer = torch.optim.SGD([*first.parameters(), *last.parameters()], lr=LR)
    for start in range(0, len(batches), MICRO_BATCHES):
        optimizer.zero_grad()
        for batch in batches[start : start + MICRO_BATCHES]:
            _, x, y = collate_items([item(i) for i in batch])
            (torch.nn.functional.mse_loss(last(first(x)), y) / MICRO_BATCHES).backward()
        optimizer.step()
    return model.state_dict()
