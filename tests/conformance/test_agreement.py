"""The loop-changing designs agree: the same run observes the same batches, validation points, logged rows and
global steps under every selected design that changes how Lightning's loops run the flavour (it declares
``Design.changes_lightning_loops``).

Each clause's tests compare one design with a stated expectation. Where a clause leaves a case open, two designs
can each look plausible and still differ, and a user switching between them would see other validation points or
other logger rows. This module runs one set of configurations (limits, validation intervals, logging,
accumulation, steps with work in flight) under each of those designs and fails on any difference. It belongs to no
clause: a difference it finds is a case some clause must pin.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
from pytorch_lightning.loggers import CSVLogger
from torch.utils.data import DataLoader

from prototypes.common import Design
from tests.conformance.harness import IterStepModule, ids_or_none, make_loader, make_trainer, uneven_loader
from tests.conformance.pipelining import AsyncHandleModule, PipeliningModule, TrainPipelineModule
from tests.conformance.plugin import selected_designs

pytestmark = pytest.mark.timeout(300)  # one configuration under every selected loop-changing design


class Observer(pl.Callback):
    """What a callback sees of a run, in order: the batch hooks' batches and indices, validations and epoch ends,
    each with the global step at that moment."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.events.append(("batch start", ids_or_none(batch), batch_idx, trainer.global_step))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.events.append(("batch end", ids_or_none(batch), batch_idx, trainer.global_step))

    def on_validation_start(self, trainer, pl_module) -> None:
        self.events.append(("validation", trainer.current_epoch, trainer.global_step))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.events.append(("epoch end", trainer.current_epoch, trainer.global_step))


@dataclass(frozen=True)
class Run:
    """One configuration: the module, the training loader and the Trainer's arguments (two epochs unless set)."""

    module: Callable[[], pl.LightningModule]
    loader: Callable[[], DataLoader]
    trainer: dict[str, Any] = field(default_factory=dict)
    validates: bool = False  # with a validation loader of one batch


LOGGED = dict(log_metrics=True)
RUNS = {
    "limit-unsized": Run(lambda: IterStepModule((2,)), lambda: make_loader("unsized", 16), dict(limit_train_batches=3)),
    "limit-cut-short": Run(lambda: IterStepModule((3,)), lambda: make_loader("sized", 16), dict(limit_train_batches=5)),
    "max-steps": Run(lambda: IterStepModule((2,)), lambda: make_loader("sized", 16), dict(max_steps=5, max_epochs=3)),
    "interval-across-epochs": Run(
        lambda: IterStepModule((2,)), lambda: make_loader("unsized", 16),
        dict(val_check_interval=3, check_val_every_n_epoch=None), validates=True,
    ),
    "interval-cut-short": Run(
        lambda: IterStepModule((3,)), lambda: make_loader("sized", 16), dict(val_check_interval=4), validates=True
    ),
    "interval-uneven": Run(
        lambda: IterStepModule((1, 2)), lambda: make_loader("unsized", 14), dict(val_check_interval=2), validates=True
    ),
    "logging": Run(lambda: IterStepModule((1,), **LOGGED), lambda: make_loader("sized", 16), dict(log_every_n_steps=2)),
    "logging-uneven-batches": Run(
        lambda: IterStepModule((1, 2), **LOGGED), lambda: uneven_loader("unsized", (1, 3, 2, 4, 1, 2, 3)),
        dict(log_every_n_steps=1),
    ),
    "accumulation": Run(
        lambda: IterStepModule((1, 2), **LOGGED), lambda: make_loader("sized", 14),
        dict(accumulate_grad_batches=2, log_every_n_steps=1),
    ),
    "async-handle": Run(
        lambda: AsyncHandleModule(**LOGGED), lambda: make_loader("unsized", 10),
        dict(log_every_n_steps=1, val_check_interval=2, check_val_every_n_epoch=None), validates=True,
    ),
    "train-pipeline-manual": Run(
        lambda: TrainPipelineModule(automatic=False, **LOGGED), lambda: make_loader("sized", 10),
        dict(log_every_n_steps=1, val_check_interval=3), validates=True,
    ),
}


def logged_rows(log_dir: Path) -> list[dict[str, str]]:
    """Every row the CSV logger wrote, without its empty cells."""
    (metrics_file,) = log_dir.glob("**/metrics.csv")
    with metrics_file.open() as rows:
        return [{key: value for key, value in row.items() if value} for row in csv.DictReader(rows)]


def observe(design: Design, run: Run, log_dir: Path) -> dict[str, Any]:
    module, observer = run.module(), Observer()
    trainer = make_trainer(design, **{"max_epochs": 2, **run.trainer}, logger=CSVLogger(log_dir), callbacks=[observer])
    trainer.fit(module, run.loader(), make_loader("sized", 2) if run.validates else None)
    received = module.trained if isinstance(module, PipeliningModule) else module.record.steps
    return {
        "batches each step call received (trained, for a pipelining step)": received,
        "batch hooks, validations and epoch ends, with the global step": observer.events,
        "rows the CSV logger wrote": logged_rows(log_dir) if run.trainer.get("log_every_n_steps") else [],
        "global step": trainer.global_step,
        "final weights": {name: value.tolist() for name, value in module.layer.state_dict().items()},
    }


def first_difference(expected: Any, observed: Any) -> str:
    if isinstance(expected, list) and isinstance(observed, list):
        for position, (one, other) in enumerate(zip(expected, observed, strict=False)):
            if one != other:
                return f"first at position {position}: {one!r} / {other!r}"
        return f"{len(expected)} / {len(observed)} entries"
    return f"{expected!r} / {observed!r}"


@pytest.mark.parametrize("name", list(RUNS))
# On purpose: the runs are a few batches long, shorter than the default logging interval of the runs that keep it.
@pytest.mark.filterwarnings("ignore:The number of training batches .* is smaller than the logging interval")
def test_loop_changing_designs_observe_the_same_run(request, name, tmp_path):
    designs = [design for design in selected_designs(request.config) if design.changes_lightning_loops]
    if len(designs) < 2:
        pytest.skip(f"{len(designs)} selected design(s) change Lightning's loops; select two or more to compare")
    reference, *others = designs
    expected = observe(reference, RUNS[name], tmp_path / "0")
    differences = []
    for number, design in enumerate(others, start=1):
        observed = observe(design, RUNS[name], tmp_path / str(number))
        differences += [
            f"{what}, {first_difference(expected[what], observed[what])}:\n  {reference.id}: {expected[what]}\n"
            f"  {design.id}: {observed[what]}"
            for what in expected
            if observed[what] != expected[what]
        ]
    assert not differences, f"the designs that change Lightning's loops disagree on run {name!r}:\n" + "\n".join(
        differences
    )
