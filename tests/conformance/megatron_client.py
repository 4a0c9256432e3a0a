"""A Megatron/NeMo micro-batching client, written as NeMo writes it (clause C19).

One optimizer step per step call over ``k`` micro-batches, each pulled by the user's
``forward_step_func(data_iterator, model)`` inside megatron-core 0.16.1's own schedule,
``get_forward_backward_func()`` with a pipeline-parallel size of 1 (``forward_backward_no_pipelining``): under a
Lightning ``training_step(self, dataloader_iter)`` with manual optimisation and, as the reference, under a plain
loop over the same batches. The model is Megatron's MLP pattern, a ``ColumnParallelLinear`` then a
``RowParallelLinear`` (tensor-parallel size 1), in megatron's parallel state over a single-process gloo group.

One stand-in, on the CPU only (``cpu_token_counter``): the schedule allocates its token counter with
``device="cuda"`` unconditionally. Everything else of megatron-core runs unmodified.
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from tests.conformance.harness import BATCH_SIZE, FEATURES, LR, ids

with warnings.catch_warnings():
    # megatron-core's notice on import that NVIDIA's Transformer Engine and Apex are missing, so it runs torch's own
    # implementations: the CPU path under test, not a finding
    warnings.filterwarnings("ignore", "Transformer Engine and Apex are not installed", UserWarning)
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel import schedules as megatron_schedules
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

EPOCHS = 2
TRAIN_ITEMS = 24  # 12 batches per epoch: whole global batches for every k in MICRO_BATCHES
VAL_ITEMS = 12  # 6 validation batches: whole global batches for every k too
MICRO_BATCHES = (1, 2, 3)
HIDDEN = 8


# --------------------------------------------------------------------------------------------------- the stand-in
class _TorchWithCpuTokenCounter:
    """``torch`` as ``forward_backward_no_pipelining`` sees it: the same module, except that ``zeros`` makes its
    tensor on the CPU. The schedule's body calls ``torch`` once, ``torch.zeros([], dtype=torch.int, device="cuda")``
    for its token counter; the functions it calls (forward_step, backward_step) keep the real ``torch``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*size: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*size, **{**kwargs, "device": "cpu"})


def cpu_token_counter(schedule: Any) -> Any:
    """The stand-in: megatron's ``forward_backward_no_pipelining``, its own code, run with the token counter on the
    CPU (``_TorchWithCpuTokenCounter`` in place of ``torch`` in that function's globals only)."""
    if schedule is not megatron_schedules.forward_backward_no_pipelining:
        raise AssertionError(f"get_forward_backward_func() returned {schedule.__name__}; the client runs megatron's "
                             "schedule for a pipeline-parallel size of 1, forward_backward_no_pipelining")
    return with_globals(schedule, torch=_TorchWithCpuTokenCounter())


def with_globals(function: Any, **replaced: Any) -> Any:
    """``function``'s own code with some of the names it reads from its module replaced, for it alone."""
    changed = types.FunctionType(function.__code__, {**function.__globals__, **replaced}, function.__name__,
                                 function.__defaults__, function.__closure__)
    changed.__kwdefaults__ = function.__kwdefaults__
    return changed


# --------------------------------------------------------------------------------------------------- parallel state
class MegatronParallelState:
    """Megatron's parallel state for a world of one: a gloo process group, then megatron's own
    ``initialize_model_parallel`` (every parallel size 1); torn down by ``close``."""

    def __init__(self) -> None:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        parallel_state.initialize_model_parallel()

    def close(self) -> None:
        parallel_state.destroy_model_parallel()
        # Why: megatron-core 0.16.1's destroy_model_parallel leaves these two set to the groups it destroys; the next
        # initialize_model_parallel in this process, or in a rank forked from it (C19's two-stage runs), would take
        # them for live groups and hang or crash
        parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP = None
        parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO = None
        dist.destroy_process_group()


# --------------------------------------------------------------------------------------------------- model
class MegatronMLP(MegatronModule):
    """Megatron's MLP pattern over the harness's 4 features: a column-parallel then a row-parallel linear layer."""

    def __init__(self) -> None:
        config = TransformerConfig(num_layers=1, hidden_size=FEATURES, num_attention_heads=1,
                                   use_cpu_initialization=True)
        super().__init__(config)
        self.model_type = ModelType.encoder_or_decoder  # what the schedule asks every model for
        init = torch.nn.init.xavier_uniform_
        self.up = ColumnParallelLinear(FEATURES, HIDDEN, config=config, init_method=init, bias=True,
                                       gather_output=False)
        self.down = RowParallelLinear(HIDDEN, 1, config=config, init_method=init, bias=True,
                                      input_is_parallel=True, skip_bias_add=False)

    def set_input_tensor(self, input_tensor: list) -> None:
        """The schedule hands a first pipeline stage ``[None]``: its input comes from the data iterator."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.up(x)
        output, _ = self.down(torch.relu(hidden))
        return output


def megatron_mlp(initial: dict[str, torch.Tensor] | None = None) -> MegatronMLP:
    """The model; with ``initial``, its parameters copied from it."""
    torch.manual_seed(0)
    model = MegatronMLP()
    if initial is not None:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                parameter.copy_(initial[name])
    return model


def parameters_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: parameter.detach().clone() for name, parameter in model.named_parameters()}


# --------------------------------------------------------------------------------------------------- the schedule
def loss_func(target: torch.Tensor, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Megatron's loss contract, the two-element form: the schedule divides the loss by the micro-batch count."""
    loss = torch.nn.functional.mse_loss(output, target)
    return loss, {"loss": loss.detach()}


def forward_step_func(pulled: list[tuple[int, ...]], data_iterator: Iterator, model: MegatronMLP) -> tuple:
    """Megatron's ``forward_step(data_iterator, model)``: pull one micro-batch, return ``(output, loss_func)``;
    ``pulled`` records the ids of each micro-batch it pulled."""
    batch = next(data_iterator)
    pulled.append(ids(batch))
    _, x, y = batch
    return model(x), partial(loss_func, y)


def run_schedule(model: MegatronMLP, batches: Iterable, micro_batches: int, forward_only: bool,
                 pulled: list[tuple[int, ...]]) -> list[dict[str, torch.Tensor]]:
    """One call of megatron's schedule over ``micro_batches`` micro-batches of ``batches``; returns what it
    returns, each micro-batch's reduced loss."""
    forward_backward = cpu_token_counter(get_forward_backward_func())
    return forward_backward(forward_step_func=partial(forward_step_func, pulled), data_iterator=iter(batches),
                            model=model, num_microbatches=micro_batches, seq_length=FEATURES,
                            micro_batch_size=BATCH_SIZE, forward_only=forward_only)


def mean_loss(reduced: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    return torch.stack([r["loss"] for r in reduced]).mean()


# --------------------------------------------------------------------------------------------------- the two drivers
class NeMoStyleModule(pl.LightningModule):
    """The Lightning side, as NeMo writes it: manual optimisation, one optimizer step per step call over
    ``micro_batches`` micro-batches that megatron's schedule pulls from the step's iterator (its triples' batches).

    Records, per epoch, the ids of each micro-batch trained and ``global_step`` at the epoch's end and, per
    validation run, the ids of each micro-batch validated and its loss.
    """

    def __init__(self, micro_batches: int, zero_grad_first: bool = True, look_ahead: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.micro_batches = micro_batches
        self.zero_grad_first = zero_grad_first  # NeMo's order; False: step, then zero_grad (the gradients of a call
        # cut short stay on the parameters unless the loop discards them)
        self.look_ahead = look_ahead  # the last call takes only the micro-batches left (`dataloader_iter.has_batches`)
        self.model = megatron_mlp()
        self.initial = parameters_of(self.model)
        self.trained: list[list[tuple[int, ...]]] = []
        self.global_steps: list[int] = []
        self.validated: list[list[tuple[int, ...]]] = []
        self.validation_losses: list[list[float]] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.parameters(), lr=LR)

    def on_train_epoch_start(self) -> None:
        self.trained.append([])

    def training_step(self, dataloader_iter):
        micro_batches = self.micro_batches
        if self.look_ahead:
            micro_batches = max((k for k in range(1, micro_batches + 1) if dataloader_iter.has_batches(k)), default=0)
            if not micro_batches:
                return None  # a drain call: nothing held, nothing to do
        optimizer = self.optimizers()
        if self.zero_grad_first:
            optimizer.zero_grad()
        reduced = run_schedule(self.model, (batch for batch, _, _ in dataloader_iter), micro_batches,
                               forward_only=False, pulled=self.trained[-1])
        optimizer.step()
        if not self.zero_grad_first:
            optimizer.zero_grad()
        return mean_loss(reduced)

    def on_train_epoch_end(self) -> None:
        self.global_steps.append(self.trainer.global_step)

    def on_validation_epoch_start(self) -> None:
        self.validated.append([])
        self.validation_losses.append([])

    def validation_step(self, dataloader_iter):
        reduced = run_schedule(self.model, (batch for batch, _, _ in dataloader_iter), self.micro_batches,
                               forward_only=True, pulled=self.validated[-1])
        self.validation_losses[-1].extend(r["loss"].item() for r in reduced)
        return mean_loss(reduced)


@dataclass
class PlainLoopRun:
    """What the plain loop observed: per epoch the micro-batch ids trained, optimizer steps per epoch, per
    validation run the ids validated and each micro-batch's loss, and the final weights."""

    trained: list[list[tuple[int, ...]]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    validated: list[list[tuple[int, ...]]] = field(default_factory=list)
    validation_losses: list[list[float]] = field(default_factory=list)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


def plain_loop(micro_batches: int, initial: dict[str, torch.Tensor], loader: DataLoader,
               val_loader: DataLoader | None, train_partial: bool = False) -> PlainLoopRun:
    """The same schedule driven by a plain loop, as Megatron's own training loop drives it: per epoch, one schedule
    call and one optimizer step per global batch until the data runs out (StopIteration from ``next()`` inside the
    schedule: that call's gradients are zeroed by the next call's ``zero_grad``, never stepped), then a validation run
    over ``val_loader`` (if any) the same way with ``forward_only=True``. ``train_partial``: the epoch's last global
    batch is whatever micro-batches are left, stepped like the others."""
    model = megatron_mlp(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    run = PlainLoopRun()
    for _ in range(EPOCHS):
        run.trained.append([])
        run.steps.append(0)
        epoch = list(loader)
        batches = iter(epoch)
        left = len(epoch)
        while True:
            optimizer.zero_grad()
            taken = min(micro_batches, left) if train_partial else micro_batches
            try:
                run_schedule(model, batches, taken, forward_only=False, pulled=run.trained[-1])
            except StopIteration:
                break
            left -= taken
            optimizer.step()
            run.steps[-1] += 1
            if not left:
                break
        if val_loader is None:
            continue
        run.validated.append([])
        run.validation_losses.append([])
        val_batches = iter(val_loader)
        with torch.no_grad():
            while True:
                try:
                    reduced = run_schedule(model, val_batches, micro_batches, forward_only=True,
                                           pulled=run.validated[-1])
                except StopIteration:
                    break
                run.validation_losses[-1].extend(r["loss"].item() for r in reduced)
    run.weights = parameters_of(model)
    return run
