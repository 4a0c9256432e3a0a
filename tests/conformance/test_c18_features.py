"""C18 Lightning's own features under the flavour: tuner, throughput, stepping estimates, accumulation schedules,
SWA and profilers, each compared with stock Lightning's regular flavour on the same batches.

"The same batches": a step taking two batches of 2 items computes the mean of two MSEs, which equals the MSE of one
4-item batch, so the regular flavour reads the same items in batches of 4 (the losses agree to float rounding).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import (
    BasePredictionWriter,
    GradientAccumulationScheduler,
    StochasticWeightAveraging,
    ThroughputMonitor,
)
from pytorch_lightning.loggers.logger import Logger
from pytorch_lightning.profilers import AdvancedProfiler, SimpleProfiler
from pytorch_lightning.tuner import Tuner

from prototypes import batches_per_call
from tests.conformance.harness import (
    BATCH_SIZE,
    CountingSGD,
    IterStepModule,
    RecordingModule,
    RegularStepModule,
    ids,
    make_loader,
    make_trainer,
    stock_trainer,
)

pytestmark = pytest.mark.clause("C18")


def _same_weights(module: pl.LightningModule, reference: pl.LightningModule) -> None:
    for name, value in module.layer.state_dict().items():
        torch.testing.assert_close(value, reference.layer.state_dict()[name], msg=lambda m, name=name: f"{name}: {m}")


def _fit_both(design, make_flavour, make_regular, *, per_step: int, n_items: int, **trainer_kwargs: Any):
    """Fit the flavour (steps of ``per_step`` batches) through ``design`` and the regular flavour through stock
    Lightning over the same items; ``flavour=`` and ``regular=`` hold each side's own Trainer arguments."""
    module, reference = make_flavour(), make_regular()
    flavour_kwargs, regular_kwargs = trainer_kwargs.pop("flavour", {}), trainer_kwargs.pop("regular", {})
    trainer = make_trainer(design, **flavour_kwargs, **trainer_kwargs)
    trainer.fit(module, make_loader(n_items=n_items))
    stock = stock_trainer(**regular_kwargs, **trainer_kwargs)
    stock.fit(reference, make_loader(n_items=n_items, batch_size=BATCH_SIZE * per_step))
    return module, trainer, reference, stock


# ------------------------------------------------------------------------------------------------ the LR finder
class _WithLr:
    """The attribute the LR finder tunes; the optimizer reads it."""

    lr = 0.01

    def configure_optimizers(self):
        return CountingSGD(self.parameters(), lr=self.lr)


class IterStepLrModule(_WithLr, IterStepModule):
    pass


class RegularLrModule(_WithLr, RegularStepModule):
    pass


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize("per_step", [1, 2])
def test_lr_find_matches_the_regular_flavour(design, per_step, accumulate, tmp_path):
    # one learning rate per optimizer step: an accumulation window of step calls, whatever each call consumed
    results, steps = {}, 14  # the fewest optimizer steps for which the finder suggests a rate
    n_items = steps * accumulate * per_step * BATCH_SIZE
    kwargs = dict(accumulate_grad_batches=accumulate, default_root_dir=tmp_path)
    for name, module, trainer, loader in (
        ("flavour", IterStepLrModule((per_step,)), make_trainer(design, **kwargs), make_loader(n_items=n_items)),
        ("regular", RegularLrModule(), stock_trainer(**kwargs),
         make_loader(n_items=n_items, batch_size=BATCH_SIZE * per_step)),
    ):
        finder = Tuner(trainer).lr_find(
            module, train_dataloaders=loader, min_lr=1e-3, max_lr=0.5, num_training=steps, early_stop_threshold=None
        )
        results[name] = (finder.results["lr"], finder.results["loss"], finder.suggestion(), module.lr)
    (lrs, losses, suggestion, lr), (stock_lrs, stock_losses, stock_suggestion, stock_lr) = results.values()
    assert lrs == pytest.approx(stock_lrs), "a learning rate recorded per optimizer step, as in the regular flavour"
    assert losses == pytest.approx(stock_losses, rel=1e-5)
    assert (suggestion, lr) == pytest.approx((stock_suggestion, stock_lr))


# ------------------------------------------------------------------------------------------------ the batch-size finder
OUT_OF_MEMORY_FROM = 8  # items per batch


def _fits_in_memory(batch: Any) -> None:
    size = len(batch[0])
    if size >= OUT_OF_MEMORY_FROM:
        # the message Lightning's `is_out_of_cpu_memory` recognises, so the finder halves the size
        raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: a batch of {size} items (simulated)")


class _TunedBatchSize:
    """Loaders from the module's hooks at ``self.batch_size`` (the finder's requirement); records the sizes the
    steps saw and runs out of memory from :data:`OUT_OF_MEMORY_FROM` items per batch."""

    batch_size = 2

    def sizes_seen(self) -> list[int]:
        if not hasattr(self, "_sizes_seen"):
            self._sizes_seen: list[int] = []
        return self._sizes_seen

    def _loader(self):
        return make_loader(n_items=48, batch_size=self.batch_size)

    train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

    def see(self, batch: Any) -> None:
        self.sizes_seen().append(len(batch[0]))
        _fits_in_memory(batch)


class IterStepTunedModule(_TunedBatchSize, IterStepModule):
    def receive(self, batch: Any) -> Any:
        batch = super().receive(batch)
        self.see(batch)
        return batch

    def _evaluation_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        self.see(batch)

    validation_step = test_step = predict_step = _evaluation_step


class RegularTunedModule(_TunedBatchSize, RegularStepModule):
    def receive(self, batch: Any) -> Any:
        batch = super().receive(batch)
        self.see(batch)
        return batch

    def _evaluation_step(self, batch, batch_idx):
        self.see(batch)

    validation_step = test_step = predict_step = _evaluation_step


def _scaled(module: _TunedBatchSize, trainer: pl.Trainer, method: str) -> tuple[int, int, list[int]]:
    """The size the finder found, the module's batch_size after it, and the sizes the steps saw (the trials, then the
    run at the size found)."""
    size = Tuner(trainer).scale_batch_size(module, method=method, init_val=2, steps_per_trial=2)
    return size, module.batch_size, sorted(set(module.sizes_seen()))


@pytest.fixture(scope="module")
def regular_scaled(tmp_path_factory) -> Callable[[str], tuple[int, int, list[int]]]:
    """The regular flavour's finder per method, under stock Lightning: the same for every design, so run once."""
    found: dict[str, tuple[int, int, list[int]]] = {}

    def scaled(method: str) -> tuple[int, int, list[int]]:
        if method not in found:
            trainer = stock_trainer(default_root_dir=tmp_path_factory.mktemp(f"regular-{method}"))
            found[method] = _scaled(RegularTunedModule(), trainer, method)
        return found[method]

    return scaled


@pytest.mark.parametrize("method", ["fit", "validate", "test", "predict"])
@pytest.mark.filterwarnings("ignore:predict returned None")  # on purpose: the tuned modules' steps return nothing
def test_scale_batch_size_finds_the_regular_flavours_size(design, method, tmp_path, regular_scaled):
    flavour = _scaled(IterStepTunedModule(), make_trainer(design, default_root_dir=tmp_path), method)
    assert flavour == regular_scaled(method), "(size found, module's batch_size, sizes the steps saw)"


# ------------------------------------------------------------------------------------------------ stepping estimates
def test_estimated_stepping_batches_divided_by_batches_per_step_ends_the_schedule(design):
    # C18's stance: the estimate counts batches as in the regular flavour (one batch per step call); a step that
    # takes k batches per call divides it by k. Then a OneCycleLR built from it ends exactly with the run.
    per_step = 2

    class OneCycle(IterStepModule):
        def configure_optimizers(self):
            optimizer = CountingSGD(self.parameters(), lr=0.1)
            total = self.trainer.estimated_stepping_batches // per_step
            schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    module = OneCycle((per_step,))
    trainer = make_trainer(design, max_epochs=2, accumulate_grad_batches=2)
    trainer.fit(module, make_loader(n_items=32))
    regular = stock_trainer(max_epochs=2, accumulate_grad_batches=2)
    regular.fit(RegularStepModule(), make_loader(n_items=32))
    assert trainer.estimated_stepping_batches == regular.estimated_stepping_batches == 16
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert module.optimizer_steps_taken() == trainer.global_step == schedule.total_steps == 8
    assert schedule.last_epoch == schedule.total_steps, "the schedule ends with the last optimizer step"


class TrainsItsLastCall(RecordingModule):
    """Takes ``per_call`` batches per call, and in the epoch's last call those left (``has_batches``), so every
    batch is trained; a OneCycleLR over the run, sized by ``estimated_optimizer_steps``."""

    def __init__(self, per_call: int) -> None:
        super().__init__()
        self.per_call = per_call

    def training_step(self, dataloader_iter):
        taking = max((k for k in range(1, self.per_call + 1) if dataloader_iter.has_batches(k)), default=0)
        batches = [self.receive(next(dataloader_iter)[0]) for _ in range(taking)]
        return self.finish_step(batches) if batches else None  # None: a drain call, nothing held

    def configure_optimizers(self):
        optimizer = CountingSGD(self.parameters(), lr=0.1)
        # through the module: the defect catalogue replaces it there, after this module is imported
        total = batches_per_call.estimated_optimizer_steps(self.trainer, self.per_call)
        schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=total)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def test_estimated_optimizer_steps_sizes_a_schedule_when_calls_do_not_divide_the_epoch(design):
    # 10 batches, 3 per call, the last call trains the one left: 4 steps per epoch, 12 over 3 epochs, where
    # estimated_stepping_batches // 3 gives 10 and OneCycleLR would raise at the 12th step
    module = TrainsItsLastCall(3)
    trainer = make_trainer(design, max_epochs=3)
    trainer.fit(module, make_loader(n_items=20))
    schedule = trainer.lr_scheduler_configs[0].scheduler
    assert trainer.estimated_stepping_batches // 3 == 10
    assert module.optimizer_steps_taken() == trainer.global_step == schedule.total_steps == 12
    assert schedule.last_epoch == schedule.total_steps, "the schedule ends with the last optimizer step"


# ------------------------------------------------------------------------------------------------ throughput
class _LoggedMetrics(Logger):
    """A logger that keeps what was logged, so a callback's metrics can be read back."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "kept"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append(dict(metrics))

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def last(self, key: str) -> float:
        return [m[key] for m in self.metrics if key in m][-1]


@pytest.mark.parametrize("per_step", [1, 2])
def test_throughput_monitor_counts_every_batch_and_sample(design, per_step):
    # the same loader: the regular flavour reads each of its batches in a step call of its own
    counted = {}
    for name, module in (("flavour", IterStepModule((per_step,))), ("regular", RegularStepModule())):
        logger = _LoggedMetrics()
        kwargs = dict(logger=logger, log_every_n_steps=1,
                      callbacks=[ThroughputMonitor(batch_size_fn=lambda batch: len(batch[0]))])
        trainer = make_trainer(design, **kwargs) if name == "flavour" else stock_trainer(**kwargs)
        with pytest.warns(UserWarning, match="flops_per_batch"):
            trainer.fit(module, make_loader(n_items=16))
        counted[name] = dict(batches=logger.last("train/batches"), samples=logger.last("train/samples"))
    assert counted["flavour"] == counted["regular"] == dict(batches=8, samples=16)


# ------------------------------------------------------------------------------------------------ schedules, SWA
def test_gradient_accumulation_scheduler_matches_the_regular_flavour(design):
    module, trainer, reference, stock = _fit_both(
        design, lambda: IterStepModule((2,)), RegularStepModule, per_step=2, n_items=32, max_epochs=3,
        flavour=dict(callbacks=[GradientAccumulationScheduler({0: 1, 1: 2, 2: 4})]),
        regular=dict(callbacks=[GradientAccumulationScheduler({0: 1, 1: 2, 2: 4})]),
    )
    assert trainer.global_step == stock.global_step == 8 + 4 + 2
    _same_weights(module, reference)


def test_stochastic_weight_averaging_matches_the_regular_flavour(design):
    module, trainer, reference, stock = _fit_both(
        design, lambda: IterStepModule((2,)), RegularStepModule, per_step=2, n_items=16, max_epochs=3,
        flavour=dict(callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)]),
        regular=dict(callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)]),
    )
    assert trainer.global_step == stock.global_step
    _same_weights(module, reference)


# ------------------------------------------------------------------------------------------------ profilers
TRAINING_BATCH_ACTIONS = (
    "[LightningModule]{module}.on_before_batch_transfer",
    "[LightningModule]{module}.transfer_batch_to_device",
    "[LightningModule]{module}.on_after_batch_transfer",
    "[Strategy]SingleDeviceStrategy.batch_to_device",
    "[Strategy]SingleDeviceStrategy.training_step",
    "run_training_batch",
    "[_TrainingEpochLoop].train_dataloader_next",
)


def _profiled_counts(profiler: Any, module: pl.LightningModule, report: str) -> dict[str, int | None]:
    """Per action: how often it was recorded (None: never). The counting profiler tells every action it recorded,
    so that a drain call can be seen to add none beyond the step's own (C17). The advanced profiler keeps no counts
    and forgets its actions at teardown: its written report says which training-batch actions it profiled (1)."""
    names = [action.format(module=type(module).__name__) for action in TRAINING_BATCH_ACTIONS]
    if isinstance(profiler, SimpleProfiler):
        recorded = {name: len(durations) for name, durations in profiler.recorded_durations.items() if durations}
        return {**dict.fromkeys(names), **recorded}
    return {name: 1 if f"Profile stats for: {name}\n" in report else None for name in names}


@pytest.mark.parametrize("profiler_class", [SimpleProfiler, AdvancedProfiler], ids=lambda c: c.__name__)
def test_profiler_records_the_training_batches_actions(design, profiler_class, tmp_path):
    # one batch per step call: the regular flavour's actions, each as often. With the counting profiler, validation
    # (a regular step, the same transfer actions) runs every two batches, so a design transferring training batches
    # ahead does so while validation batches are transferred; the advanced profiler only tells which actions ran,
    # so there training runs alone.
    counts = {}
    validation = dict(val_dataloaders=make_loader(n_items=4)) if profiler_class is SimpleProfiler else {}
    flavour = IterStepModule((1,))
    for name, module in (("flavour", flavour), ("regular", RegularStepModule())):
        profiler = profiler_class(dirpath=tmp_path, filename=name)
        kwargs = dict(profiler=profiler, max_epochs=1, val_check_interval=2 if validation else 1.0)
        trainer = make_trainer(design, **kwargs) if name == "flavour" else stock_trainer(**kwargs)
        trainer.fit(module, make_loader(n_items=12), **validation)
        counts[name] = _profiled_counts(profiler, module, (tmp_path / f"fit-{name}.txt").read_text())
    expected = {action.replace("RegularStepModule", "IterStepModule"): n for action, n in counts["regular"].items()}
    if profiler_class is SimpleProfiler:  # a drain call (C17) is a step call: the step runs, and is profiled
        for per_call in ("[Strategy]SingleDeviceStrategy.training_step", "run_training_batch"):
            expected[per_call] += flavour.record.drain_calls
    # the regular flavour's actions, each as often; one only the flavour records (a design's own callback) is its own
    assert {action: counts["flavour"].get(action) for action in expected} == expected


# ------------------------------------------------------------------------------------------------ the prediction writer
class KeptPredictions(BasePredictionWriter):
    """A prediction writer that keeps what it is given: per call of ``write_on_batch_end`` the prediction, the batch
    indices, the batch's item ids and ``batch_idx``; from ``write_on_epoch_end`` the predictions and indices."""

    def __init__(self, write_interval: str) -> None:
        super().__init__(write_interval)
        self.batches: list[tuple] = []
        self.epoch: tuple | None = None

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append((prediction, list(batch_indices), ids(batch), batch_idx, dataloader_idx))

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch = (predictions, batch_indices)


class KeptPredictionsPastTheGuard(KeptPredictions):
    """The same writer with a ``setup`` of its own that does not call ``BasePredictionWriter.setup``, whose only
    work is to refuse any module whose ``predict_step`` takes ``dataloader_iter``: Lightning's guard, which no
    design can lift (``test_prediction_writer_accepts_the_flavour``). This writer checks the rest."""

    def setup(self, trainer, pl_module, stage) -> None:
        pass


class IterStepPredictions(IterStepModule):
    """``predict_step(self, dataloader_iter)`` taking ``pattern[0]`` batches per call, predicting their item ids."""

    def __init__(self, pattern) -> None:
        super().__init__(pattern)
        self.last_received: list[tuple] = []  # (ids, batch_idx) of each call's last batch

    def predict_step(self, dataloader_iter):
        prediction = []
        for _ in range(self.pattern[0]):
            batch, batch_idx, _ = next(dataloader_iter)
            prediction += ids(batch)
        self.last_received.append((ids(batch), batch_idx))
        return prediction


class RegularPredictions(RegularStepModule):
    def predict_step(self, batch, batch_idx):
        return list(ids(batch))


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("write_interval", ["batch", "batch_and_epoch"])
@pytest.mark.parametrize("per_step", [1, 2])
# On purpose: an unsized loader has no sample indices to give, in either flavour (the test compares them).
@pytest.mark.filterwarnings("ignore:Couldn't infer the batch indices fetched from your dataloader")
def test_prediction_writer_gets_each_step_calls_predictions_and_indices(design, per_step, write_interval, kind):
    # A step call is the unit a batch is in the regular flavour: its prediction and the indices of every sample it
    # consumed (an unsized loader has none to give, in either flavour), and on epoch end all of them, as the regular
    # flavour gives them over batches of per_step times the size; batch and batch_idx are the end hook's (C15).
    writer, regular_writer = KeptPredictionsPastTheGuard(write_interval), KeptPredictions(write_interval)
    module = IterStepPredictions((per_step,))
    make_trainer(design, callbacks=[writer]).predict(module, make_loader(kind, n_items=12), return_predictions=False)
    stock_trainer(callbacks=[regular_writer]).predict(
        RegularPredictions(), make_loader(kind, n_items=12, batch_size=BATCH_SIZE * per_step), return_predictions=False
    )
    got = [(prediction, indices) for prediction, indices, _, _, _ in writer.batches]
    assert got == [(prediction, indices) for prediction, indices, _, _, _ in regular_writer.batches], (
        "(prediction, batch_indices) of each write_on_batch_end"
    )
    assert [(batch, batch_idx) for _, _, batch, batch_idx, _ in writer.batches] == module.last_received, (
        "write_on_batch_end's batch and batch_idx: the last batch its step call received (C15)"
    )
    assert writer.epoch == regular_writer.epoch, "write_on_epoch_end's predictions and batch_indices"


def test_prediction_writer_accepts_the_flavour(design):
    writer = KeptPredictions("batch")
    make_trainer(design, callbacks=[writer]).predict(IterStepPredictions((1,)), make_loader("sized", n_items=4))
    assert [prediction for prediction, *_ in writer.batches] == [[0, 1], [2, 3]]
