"""Megatron-core's real pipeline-parallel schedule on two ranks, as NeMo drives it (clause C19), launched by C16's
launcher (``ddp.launch``).

megatron-core 0.16.1's ``get_forward_backward_func()`` with a pipeline-parallel size of 2 returns
``forward_backward_pipelining_without_interleaving`` (1F1B): rank 0 is the first stage, rank 1 the last, and the
stages exchange activations and their gradients with megatron's own point-to-point communicator over gloo. Both
stages pull the same batches (``use_distributed_sampler=False``): the first uses the inputs, the last the targets,
as Megatron's ``forward_step`` reads data on both ends of the pipeline. The Lightning side is NeMo's: manual
optimisation, zero the grads, run the schedule over ``k`` micro-batches of the step's iterator, step; Lightning's DDP
strategy does not wrap the module (``NotWrappingDDPStrategy``), as NeMo's own strategy leaves data parallelism to
Megatron. The reference is the same schedule driven by a plain loop, as Megatron's training loop drives it: its
iteration count comes from the data, whole global batches only (``epoch_batches // k`` per epoch).

The stand-ins, on the CPU only, each for one CUDA-only line of megatron-core's CPU path: the schedule's token
counter (``device="cuda"``: ``megatron_client.cpu_token_counter``'s ``_TorchWithCpuTokenCounter``), and in the
point-to-point module the receive buffers' ``torch.cuda.current_device()`` and the ``torch.cuda.synchronize()``
after a batched exchange (``_TorchWithCpuDevice``). Everything else of megatron-core runs unmodified.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.strategies import DDPStrategy

from tests.conformance.ddp import PG_TIMEOUT_S, describe_error
from tests.conformance.harness import BATCH_SIZE, FEATURES, LR, QUIET, ids, make_loader
from tests.conformance.megatron_client import (
    HIDDEN,
    _TorchWithCpuTokenCounter,
    loss_func,
    mean_loss,
    megatron_schedules,
    parameters_of,
    with_globals,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Transformer Engine and Apex are not installed", UserWarning)
    from megatron.core import parallel_state
    from megatron.core.enums import ModelType
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import MegatronModule

MEGATRON_PIPELINE = "megatron-pipeline"
STAGES = 2
EPOCHS = 2
FIRST = 0


# --------------------------------------------------------------------------------------------------- the stand-ins
class _CpuCuda:
    """``torch.cuda`` as the point-to-point module's ``_communicate`` sees it on the CPU: its receive buffers are
    made on the current device, the CPU here, and the synchronize after a batched exchange has no device to wait for
    (gloo's requests were waited for already)."""

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize() -> None:
        """No device: nothing to wait for."""


class _TorchWithCpuDevice:
    """``torch`` as ``P2PCommunicator._communicate`` sees it: the same module, except ``torch.cuda``."""

    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class CpuP2PCommunicator(P2PCommunicator):
    """megatron's point-to-point communicator, its own ``_communicate`` run with ``_TorchWithCpuDevice``."""

    _communicate = with_globals(P2PCommunicator._communicate, torch=_TorchWithCpuDevice())


def cpu_pipeline_schedule(schedule: Any) -> Any:
    """megatron's ``forward_backward_pipelining_without_interleaving``, its own code, run with the token counter on
    the CPU and the communicator above (in that function's globals only)."""
    if schedule is not megatron_schedules.forward_backward_pipelining_without_interleaving:
        raise AssertionError(f"get_forward_backward_func() returned {schedule.__name__}; with a pipeline-parallel "
                             "size of 2 the client runs forward_backward_pipelining_without_interleaving")
    return with_globals(schedule, torch=_TorchWithCpuTokenCounter(), P2PCommunicator=CpuP2PCommunicator)


# --------------------------------------------------------------------------------------------------- parallel state
def pipeline_parallel_state(rank: int, timeout_s: float) -> None:
    """The rank's gloo process group (the launcher's, where it started one) and megatron's parallel state with a
    pipeline-parallel size of ``STAGES``, once per process: every fit of the process reuses them (Lightning's DDP
    strategy keeps a process group it finds)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=rank, world_size=STAGES, timeout=timedelta(seconds=timeout_s))
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(pipeline_model_parallel_size=STAGES)


class NotWrappingDDPStrategy(DDPStrategy):
    """Lightning's DDP strategy without the DistributedDataParallel wrapper: the stages hold different layers, so
    averaging their gradients would be wrong; Megatron keeps data parallelism in groups of its own (as NeMo's
    strategy does)."""

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


# --------------------------------------------------------------------------------------------------- model
class PipelinedMLP(MegatronModule):
    """Megatron's MLP pattern split over the two stages: the first runs the column-parallel layer and its ReLU and
    sends the activation (sequence length 1, ``HIDDEN`` wide); the last receives it and runs the row-parallel layer.
    Both ranks build both layers from one seed; each stage uses and trains its own."""

    def __init__(self, stage: int, initial: dict[str, torch.Tensor] | None = None) -> None:
        config = TransformerConfig(num_layers=STAGES, hidden_size=HIDDEN, num_attention_heads=1,
                                   use_cpu_initialization=True, pipeline_dtype=torch.float32)
        super().__init__(config)
        self.model_type = ModelType.encoder_or_decoder
        self.stage = stage
        init = torch.nn.init.xavier_uniform_
        torch.manual_seed(0)
        self.up = ColumnParallelLinear(FEATURES, HIDDEN, config=config, init_method=init, bias=True,
                                       gather_output=False)
        self.down = RowParallelLinear(HIDDEN, 1, config=config, init_method=init, bias=True, input_is_parallel=True,
                                      skip_bias_add=False)
        if initial is not None:
            with torch.no_grad():
                for name, parameter in self.named_parameters():
                    parameter.copy_(initial[name])
        self.input_tensor: torch.Tensor | None = None

    def own_parameters(self) -> list[torch.nn.Parameter]:
        return list((self.up if self.stage == FIRST else self.down).parameters())

    def set_input_tensor(self, input_tensor: list) -> None:
        """The schedule hands the last stage the activation it received (``[None]`` on the first stage)."""
        self.input_tensor = input_tensor[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage == FIRST:
            hidden, _ = self.up(x)
            return torch.relu(hidden).unsqueeze(0)  # (sequence, micro-batch, hidden): what the schedule sends
        output, _ = self.down(self.input_tensor.squeeze(0))
        return output


def forward_step_func(pulled: list[tuple[int, ...]], data_iterator: Any, model: PipelinedMLP) -> tuple:
    """Megatron's ``forward_step(data_iterator, model)`` on either stage: pull one micro-batch (the first stage uses
    its inputs, the last its targets) and return ``(output, loss_func)``."""
    batch = next(data_iterator)
    pulled.append(ids(batch))
    _, x, y = batch
    return model(x), partial(loss_func, y)


def run_pipeline_schedule(model: PipelinedMLP, batches: Any, micro_batches: int,
                          pulled: list[tuple[int, ...]]) -> list[dict[str, torch.Tensor]]:
    """One call of megatron's 1F1B schedule over ``micro_batches`` micro-batches; the last stage gets the reduced
    losses, the first an empty list."""
    schedule = cpu_pipeline_schedule(get_forward_backward_func())
    return schedule(forward_step_func=partial(forward_step_func, pulled), data_iterator=iter(batches), model=model,
                    num_microbatches=micro_batches, seq_length=1, micro_batch_size=BATCH_SIZE, forward_only=False)


# --------------------------------------------------------------------------------------------------- the two drivers
def can_start_a_whole_call(dataloader_iter: Any, micro_batches: int) -> bool:
    """How the step learns, before the schedule starts, whether the data holds a whole call (the public look-ahead
    of k); one function, so the test follows the specification's name for it."""
    return dataloader_iter.has_batches(micro_batches)


UNMODIFIED = "unmodified"  # a run's fourth field: the step as NeMo writes it today, without the check
OPTS_IN = "opts in"  # after it: the module asks for drain calls (`drain_dataloader_iter`)


class NeMoPipelineStage(pl.LightningModule):
    """One stage, as NeMo writes its step (manual optimisation, megatron's schedule over ``micro_batches``
    micro-batches of the step's iterator), with the one check the pipeline needs: no call the data would cut short
    (``checks_ahead=False``: without it, the step NeMo runs today). Records the micro-batches pulled and
    ``global_step`` per epoch."""

    def __init__(self, stage: int, micro_batches: int, checks_ahead: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.micro_batches, self.checks_ahead = micro_batches, checks_ahead
        self.model = PipelinedMLP(stage)
        self.initial = parameters_of(self.model)
        self.trained: list[list[tuple[int, ...]]] = []
        self.global_steps: list[int] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.model.own_parameters(), lr=LR)

    def on_train_epoch_start(self) -> None:
        self.trained.append([])

    def training_step(self, dataloader_iter):
        # Why: a stage that ran out inside the schedule would stop while its peer waits for its activation
        if self.checks_ahead and not can_start_a_whole_call(dataloader_iter, self.micro_batches):
            return None
        optimizer = self.optimizers()
        optimizer.zero_grad()
        reduced = run_pipeline_schedule(self.model, (batch for batch, _, _ in dataloader_iter), self.micro_batches,
                                        self.trained[-1])
        optimizer.step()
        return mean_loss(reduced) if reduced else None

    def on_train_epoch_end(self) -> None:
        self.global_steps.append(self.trainer.global_step)


def plain_pipeline_loop(stage: int, micro_batches: int, epoch_batches: int, kind: str,
                        initial: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The same schedule driven as Megatron's training loop drives it: per epoch ``epoch_batches // micro_batches``
    iterations (whole global batches), each zeroing the grads, running the schedule and stepping."""
    model = PipelinedMLP(stage, initial)
    optimizer = torch.optim.SGD(model.own_parameters(), lr=LR)
    trained, steps = [], []
    for _ in range(EPOCHS):
        trained.append([])
        batches = iter(make_loader(kind, epoch_batches * BATCH_SIZE))
        for _ in range(epoch_batches // micro_batches):
            optimizer.zero_grad()
            run_pipeline_schedule(model, batches, micro_batches, trained[-1])
            optimizer.step()
        steps.append(epoch_batches // micro_batches)
    return dict(trained=trained, steps=steps, weights=own_weights(model))


def own_weights(model: PipelinedMLP) -> dict[str, list]:
    own = {id(p) for p in model.own_parameters()}
    return {name: p.detach().tolist() for name, p in model.named_parameters() if id(p) in own}


def fit_stage(design, rank: int, kind: str, run: tuple[int, ...]) -> dict[str, Any]:
    """One rank's run (``ddp.launch``'s ``fit``): the plain loop, then the design's fit, on one process
    group; ``run`` is ``(micro_batches, epoch_batches, sized)``, and ``UNMODIFIED`` fourth for the step without its
    check. Reports what the stage trained, its weights, the plain loop's, the warnings and the error it raised."""
    micro_batches, epoch_batches, sized, *step = run
    loader_kind = "sized" if sized else "unsized"
    outcome: dict[str, Any] = dict(error=None)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            pipeline_parallel_state(rank, PG_TIMEOUT_S)
            module = NeMoPipelineStage(rank, micro_batches, checks_ahead=UNMODIFIED not in step)
            module.drain_dataloader_iter = OPTS_IN in step
            outcome.update(trained=module.trained, global_steps=module.global_steps)
            outcome.update(reference=plain_pipeline_loop(rank, micro_batches, epoch_batches, loader_kind,
                                                         module.initial))
            strategy = NotWrappingDDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
            trainer = design.trainer(**{**QUIET, "accelerator": "cpu", "devices": STAGES, "strategy": strategy,
                                        "use_distributed_sampler": False, "max_epochs": EPOCHS})
            trainer.fit(module, train_dataloaders=make_loader(loader_kind, epoch_batches * BATCH_SIZE))
            outcome.update(weights=own_weights(module.model))
        except BaseException as raised:  # noqa: BLE001 - every outcome is reported to the test process
            outcome.update(error=describe_error(raised))
    outcome.update(warnings=[str(w.message) for w in warned])
    return outcome
