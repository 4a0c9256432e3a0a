"""C1 Selection, the Trainer as an object: every design's Trainer pickles, spawns and checkpoints as stock Lightning's.

Lightning and its users handle a Trainer as an object: ``strategy="ddp_spawn"`` pickles it into each rank, callbacks
and tuners deep-copy its loops, tools diff and validate the checkpoints it writes. For a regular module nothing of
that may differ from stock Lightning; for a module taking ``dataloader_iter`` the checkpoint may add only the loop
state the specification names (C1). Both kinds of module, every design and variant.
"""

from __future__ import annotations

import copy
import functools
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler
from torch.profiler import ProfilerAction
from torchdata.stateful_dataloader import StatefulDataLoader

from prototypes import DESIGNS
from tests.conformance.ddp import (
    SHARED_ITEMS,
    received_batches,
    reference_ddp_weights,
    require_all_reported,
    sampler_shard_batches,
    summary,
)
from tests.conformance.ddp_spawn import SPAWN_TEST_TIMEOUT_S, spawn_fit
from tests.conformance.harness import (
    BATCH_SIZE,
    Crash,
    CrashingModule,
    IterStepModule,
    RegularStepModule,
    SizedItems,
    assert_same_batches,
    make_loader,
    make_trainer,
    reference_weights,
    stock_trainer,
)

pytestmark = [
    pytest.mark.clause("C1"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),  # torchdata's StatefulDataLoader, on its own API
]

# the flavour module takes two batches per step call, so a design's own bookkeeping (step calls, batches per call)
# is exercised; where stock Lightning's flavour must give the same answer (resume), it takes one
FLAVOURS = {"regular": RegularStepModule, "dataloader_iter": lambda: IterStepModule((2,))}


def record_every_step(step: int) -> ProfilerAction:
    """A PyTorchProfiler schedule that pickles. Why: its default (``torch.profiler.schedule``) is a local function,
    so stock Lightning cannot pickle a Trainer that uses it either."""
    return ProfilerAction.RECORD


# each made for a directory of its own: PyTorchProfiler writes its traces there (the working directory otherwise)
PROFILERS = {
    "no_profiler": lambda directory: None,
    "simple": lambda directory: SimpleProfiler(dirpath=directory),
    "advanced": lambda directory: AdvancedProfiler(dirpath=directory),
    "pytorch": lambda directory: PyTorchProfiler(dirpath=directory, schedule=record_every_step),
}


# --------------------------------------------------------------------------------------------------- pickle, deepcopy
def _fit(trainer, flavour: str) -> dict[str, Any]:
    """Fit a new module; what it observed, comparable with ``==``."""
    module = FLAVOURS[flavour]()
    trainer.fit(module, train_dataloaders=make_loader(n_items=4), val_dataloaders=make_loader(n_items=2))
    return dict(
        events=module.record.events,
        global_step=trainer.global_step,
        weights={k: v.tolist() for k, v in module.layer.state_dict().items()},
        profiler_attributes=sorted(vars(trainer.profiler)),
        module_attributes=sorted(vars(module)),
    )


def _pickled(trainer, when: str) -> bytes:
    """``pickle.dumps(trainer)``, after ``copy.deepcopy`` of its fit loop; either failing fails the test."""
    try:
        copy.deepcopy(trainer.fit_loop)
        return pickle.dumps(trainer)
    except Exception as error:  # noqa: BLE001 - the failure is the finding
        pytest.fail(f"copying the Trainer {when} fit raised {type(error).__name__}: {error} (stock Lightning's Trainer"
                    " pickles and deep-copies; strategy='ddp_spawn' pickles it into every rank)", pytrace=False)


@functools.cache
def _stock_attributes(flavour: str, profiler: str) -> tuple[list[str], list[str]]:
    with tempfile.TemporaryDirectory(prefix="c01-stock-profiler-") as directory:
        observed = _fit(stock_trainer(profiler=PROFILERS[profiler](directory)), flavour)
    return observed["profiler_attributes"], observed["module_attributes"]


@pytest.mark.parametrize("profiler", list(PROFILERS))
@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_trainer_pickles_and_copies_before_and_after_fit(design, flavour, profiler, tmp_path):
    trainer = make_trainer(design, profiler=PROFILERS[profiler](tmp_path))
    before = _pickled(trainer, "before")
    original = _fit(trainer, flavour)
    after = _pickled(trainer, "after")

    # nothing of the design's stays on the user's objects once fit returned (no closure, no lock, no wrapper)
    profiler_attributes, module_attributes = _stock_attributes(flavour, profiler)
    assert original["profiler_attributes"] == profiler_attributes, "the fit left attributes on the user's profiler"
    assert original["module_attributes"] == module_attributes, "the fit left attributes on the user's module"
    # a copy made before fit trains as the original did; copies made after fit train on, for one more epoch, alike
    # (two copies: stock Lightning's PyTorchProfiler cannot record a second fit of the same Trainer)
    assert _fit(pickle.loads(before), flavour) == original, "the Trainer unpickled before fit trains differently"
    continuing = [pickle.loads(after) for _ in range(2)]
    for copied in continuing:
        copied.fit_loop.max_epochs = 2
    first, second = (_fit(copied, flavour) for copied in continuing)
    assert first["global_step"] == 2 * original["global_step"] and first == second, (
        "the Trainers unpickled after fit do not train one more epoch alike"
    )


# --------------------------------------------------------------------------------------------------- ddp_spawn
def _spawned_flavours(design) -> list[str]:
    """Both modules for a design with its default options; the flavour module alone for its other variants. Why: a
    launch costs 5-10 s, and a regular module's path does not read the design's options (it is stock Lightning's)."""
    base = DESIGNS.get(design.name)
    return list(FLAVOURS) if base is None or dict(base.options) == dict(design.options) else ["dataloader_iter"]


@pytest.mark.timeout(2 * SPAWN_TEST_TIMEOUT_S)
def test_ddp_spawn_trains_each_rank_on_its_shard_once(design, monkeypatch):
    # the injected sampler's seed is PL_GLOBAL_SEED (0 when unset), which the spawned ranks inherit: a
    # seed_everything() elsewhere in this pytest process must not change the shards the test expects
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    for flavour in _spawned_flavours(design):
        module = FLAVOURS[flavour]()
        batches_per_step = getattr(module, "pattern", (1,))
        run = spawn_fit(design, module, make_loader(n_items=SHARED_ITEMS))
        outcomes = require_all_reported(run)
        failed = [rank for rank, outcome in enumerate(outcomes) if outcome["error"] is not None]
        assert not failed, f"{flavour}: fit raised on rank(s) {failed}:\n" + summary(run)
        steps = len(sampler_shard_batches("injected", 0)) // batches_per_step[0]
        for rank, outcome in enumerate(outcomes):
            expected = sampler_shard_batches("injected", rank)
            assert_same_batches(received_batches(outcome), expected, what=f"{flavour}, rank {rank}: batches received")
            indices = [batch_idx for _, batch_idx, _ in outcome["steps"]]
            assert indices == list(range(len(expected))), f"{flavour}, rank {rank}: batch_idx {indices}"
            assert outcome["global_step"] == steps == outcome["optimizer_steps"], f"{flavour}:\n" + summary(run)
        expected_weights = reference_ddp_weights(outcomes, [batches_per_step[0]] * len(outcomes))
        for rank, outcome in enumerate(outcomes):
            for name, value in outcome["weights"].items():
                torch.testing.assert_close(
                    torch.tensor(value),
                    expected_weights[name],
                    msg=lambda m, f=flavour, r=rank, n=name: (
                        f"{f}, rank {r}: {n} differs from DDP's averaged-gradient SGD:\n{m}"
                    ),
                )


# --------------------------------------------------------------------------------------------------- checkpoints
class SavesCheckpoints(Callback):
    """Saves ``mid.ckpt`` after the second optimizer step (mid-epoch, a validation run behind it); no state of its
    own."""

    def __init__(self, directory: Path) -> None:
        self.directory, self.saved = directory, False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= 2 and not self.saved:
            self.saved = True
            trainer.save_checkpoint(self.directory / "mid.ckpt")


def _checkpoints(trainer, module, directory: Path) -> dict[str, dict]:
    """Fit over a resumable loader with validation, two epochs; the checkpoints saved mid-epoch and after fit."""
    directory.mkdir()
    trainer.callbacks.append(SavesCheckpoints(directory))
    loader = StatefulDataLoader(SizedItems(12), batch_size=BATCH_SIZE)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=make_loader(n_items=4))
    trainer.save_checkpoint(directory / "end.ckpt")
    return {name: torch.load(directory / f"{name}.ckpt", weights_only=False) for name in ("mid", "end")}


def _leaves(value: Any, path: tuple = ()) -> dict[tuple, Any]:
    """Every leaf of a checkpoint by its path of keys (and list positions)."""
    if isinstance(value, dict):
        return {p: v for key, item in value.items() for p, v in _leaves(item, (*path, key)).items()}
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], (dict, list, tuple)):
        return {p: v for position, item in enumerate(value) for p, v in _leaves(item, (*path, position)).items()}
    return {path: value}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return type(a) is type(b) and a == b


def _path(path: tuple) -> str:
    return "/".join(map(str, path))


# Where a design may keep state of its own for a module taking `dataloader_iter`, and nowhere else (C1, C11): plain
# values in the training epoch loop's `state_dict` (the part of a loop's checkpoint Lightning leaves to the loop), or
# the state of a callback the design adds to the Trainer.
FLAVOUR_LOOP_STATE = ("loops", "fit_loop", "epoch_loop.state_dict")


def _design_callbacks(trainer) -> set[str]:
    """The state keys of the callbacks a design's Trainer has beyond stock Lightning's for the same arguments."""
    return {c.state_key for c in trainer.callbacks} - {c.state_key for c in stock_trainer(**TRAINER).callbacks}


TRAINER = dict(max_epochs=2, val_check_interval=2)


def test_regular_module_checkpoint_is_stock_lightnings(design, tmp_path):
    ours = _checkpoints(make_trainer(design, **TRAINER), RegularStepModule(), tmp_path / "design")
    stock = _checkpoints(stock_trainer(**TRAINER), RegularStepModule(), tmp_path / "stock")
    for name in stock:
        mine, theirs = _leaves(ours[name]), _leaves(stock[name])
        assert sorted(map(_path, mine)) == sorted(map(_path, theirs)), (
            f"{name}.ckpt: entries only this design writes {sorted(map(_path, mine.keys() - theirs.keys()))},"
            f" only stock Lightning writes {sorted(map(_path, theirs.keys() - mine.keys()))}"
        )
        differing = [_path(p) for p in theirs if not _same(mine[p], theirs[p])]
        assert not differing, f"{name}.ckpt: values differ from stock Lightning's at {differing}"


def test_flavour_module_checkpoint_adds_only_named_state(design, tmp_path):
    trainer = make_trainer(design, **TRAINER)
    own_callbacks = _design_callbacks(trainer)
    ours = _checkpoints(trainer, IterStepModule((2,)), tmp_path / "design")
    stock = _checkpoints(stock_trainer(**TRAINER), IterStepModule((2,)), tmp_path / "stock")

    def named(path: tuple) -> bool:
        return path[:-1] == FLAVOUR_LOOP_STATE or (path[0] == "callbacks" and path[1] in own_callbacks)

    for name in stock:
        mine, theirs = _leaves(ours[name]), _leaves(stock[name])
        missing = sorted(map(_path, theirs.keys() - mine.keys()))
        assert not missing, f"{name}.ckpt: entries stock Lightning writes are missing: {missing}"
        extra = sorted(_path(p) for p in mine.keys() - theirs.keys() if not named(p))
        assert not extra, (
            f"{name}.ckpt: entries stock Lightning does not write, neither plain values in"
            f" {_path(FLAVOUR_LOOP_STATE)} nor the state of a callback the design adds: {extra}"
        )
        retyped = [_path(p) for p in theirs if type(mine[p]) is not type(theirs[p])]
        assert not retyped, f"{name}.ckpt: entries of another type than stock Lightning's: {retyped}"


# --------------------------------------------------------------------------------------------------- resume
class CrashingRegularModule(RegularStepModule):
    """The regular flavour raising :class:`Crash` at the start of step call ``crash_at``."""

    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        self.crash_at = crash_at

    def training_step(self, batch, batch_idx):
        if self.step_calls == self.crash_at:
            raise Crash(f"crash at step call {self.crash_at}")
        return super().training_step(batch, batch_idx)


RESUMING = {"regular": CrashingRegularModule, "dataloader_iter": lambda crash_at=None: CrashingModule((1,), crash_at)}


@pytest.mark.parametrize("direction", ["stock-to-design", "design-to-stock"])
@pytest.mark.parametrize("flavour", list(RESUMING))
# On purpose: the resumed run checkpoints into the directory it resumes from, with the callbacks of the other side.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`, callbacks used to create the checkpoint")
def test_resume_across_designs_delivers_the_rest_exactly_once(design, tmp_path, flavour, direction):
    # 6 batches, one per step call, a checkpoint every 2 optimizer steps, a crash at step call 3: the resumed run owes
    # batches 2-5 (C11). One batch per call, so that stock Lightning's flavour counts the same as a design's.
    checkpoints = tmp_path / "checkpoints"

    def trainer(built_by):
        every = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=2, save_last=True, save_top_k=-1)
        return built_by(enable_checkpointing=True, callbacks=[every])

    ours, stock = functools.partial(make_trainer, design), stock_trainer
    first, then = (stock, ours) if direction == "stock-to-design" else (ours, stock)
    loader = functools.partial(StatefulDataLoader, SizedItems(12), batch_size=BATCH_SIZE)
    with pytest.raises(Crash):
        trainer(first).fit(RESUMING[flavour](crash_at=3), loader())
    resumed, resumed_trainer = RESUMING[flavour](), trainer(then)
    resumed_trainer.fit(resumed, loader(), ckpt_path=str(checkpoints / "last.ckpt"))

    batches = [tuple(range(i, i + BATCH_SIZE)) for i in range(0, 12, BATCH_SIZE)]
    assert_same_batches(resumed.record.received, batches[2:], what=f"{direction}: batches after the resume")
    assert resumed_trainer.global_step == len(batches)
    expected = reference_weights(resumed, [[b] for b in batches], complete=[True] * len(batches))
    for name, value in resumed.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name], msg=lambda m, name=name: f"{direction}: {name}:\n{m}")
