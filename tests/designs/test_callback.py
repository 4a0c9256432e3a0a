"""What the conformance suite cannot see of ``callback``: the public-API rule, the wrapping, other callbacks, resume.

Every run uses a real Trainer and real DataLoaders; observations come from inside user code (the module's step and
hooks, a user's own callback), never from the design's internals.
"""

from __future__ import annotations

import ast
import inspect
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import prototypes.callback
from prototypes.callback import DESIGN, DataloaderIterCallback
from prototypes.common import StepIterator
from prototypes.coupling import private_uses_in_source
from tests.conformance.harness import (
    BATCH_SIZE,
    QUIET,
    Crash,
    CrashingModule,
    IterStepModule,
    RegularStepModule,
    SizedItems,
    UnsizedItems,
    ids,
    loader_sequence,
    make_loader,
)


def trainer(**overrides) -> pl.Trainer:
    return DESIGN.trainer(**{**QUIET, **overrides})


# ------------------------------------------------------------------------------------------ the public-API rule
# Reachable through attributes without a leading underscore, but instances of private classes (_FitLoop,
# _TrainingEpochLoop, _BatchProgress, ...): Lightning 2.x made the loops private.
LOOP_ATTRIBUTES = {"fit_loop", "validate_loop", "test_loop", "predict_loop", "epoch_loop", "val_loop",
                   "batch_progress", "epoch_progress"}
# The one kind of write the design makes to an object it does not own: the user's own steps on the user's own
# instance, as ``pl_module.<step> = ...`` or ``setattr``/``delattr`` on ``pl_module`` (the hook name is a variable
# there, so test_only_the_users_steps_are_shadowed checks at run time that nothing but the steps is replaced).
STEP_HOOKS = ("training_step", "validation_step", "test_step", "predict_step")
ALLOWED_FOREIGN_WRITES = {("pl_module", hook) for hook in STEP_HOOKS}


def public_api_violations(source: str) -> list[str]:
    """Private Lightning names (``prototypes.coupling``'s scanner: the one definition of Lightning's private API),
    loop objects, patching and writes to objects other than ``self``, by line."""
    found = [f"line {use.line}: private Lightning name {use.name} ({use.kind})"
             for use in private_uses_in_source(source)]
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            found += [violation for alias in node.names for violation in _mock_import(line, alias.name, [])]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += _mock_import(line, node.module, [alias.name for alias in node.names])
        elif isinstance(node, ast.Attribute):
            if node.attr in LOOP_ATTRIBUTES:
                found.append(f"line {line}: loop internals .{node.attr}")
            if node.attr in {"__setattr__", "__delattr__"}:  # object.__setattr__(obj, ...) patches like setattr()
                found.append(f"line {line}: .{node.attr}() can patch any object")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"setattr", "delattr"}:
            on_module = bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "pl_module"
            if not on_module:
                found.append(f"line {line}: {node.func.id}() can patch any object")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            found += [f"line {line}: writes {write}" for write in _foreign_writes(targets)]
    return found


def _mock_import(line, module: str, names: list[str]) -> list[str]:
    parts = module.split(".")
    if parts[0] == "unittest" and ("mock" in parts or "mock" in names):
        return [f"line {line}: imports unittest.mock (patching)"]
    return []


def _foreign_writes(targets) -> list[str]:
    writes = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)):
            writes += _foreign_writes(target.elts)
        elif isinstance(target, ast.Attribute):
            root = target.value
            while isinstance(root, ast.Attribute):
                root = root.value
            owner = root.id if isinstance(root, ast.Name) else ast.unparse(root)
            direct = isinstance(target.value, ast.Name) and (owner, target.attr) in ALLOWED_FOREIGN_WRITES
            if owner != "self" and not direct:
                writes.append(ast.unparse(target))
    return writes


def test_callback_module_uses_public_lightning_api_only():
    source = Path(inspect.getsourcefile(prototypes.callback)).read_text()
    assert public_api_violations(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher",
        "import pytorch_lightning.trainer.connectors._x",
        "from lightning_fabric.utilities.data import _auto_add_worker_init_fn",
        "batch = trainer.fit_loop._data_fetcher._batch",
        "trainer._logger_connector.on_batch_start(batch)",
        "trainer.fit_loop.epoch_loop.batch_progress.increment_completed()",
        "pl.Trainer.fit = my_fit",
        "trainer.limit_train_batches = 10",
        "pl_module.log = my_log",
        "setattr(pl.LightningModule, 'log', my_log)",
        "object.__setattr__(trainer, 'x', 1)",
        "setattr(trainer, name, value)",
        "delattr(pl.LightningModule, 'log')",
        "from unittest import mock",
        "from unittest.mock import patch",
    ],
)
def test_public_api_scan_catches(source):
    assert public_api_violations(source), f"the scan let through: {source}"


def test_public_api_scan_allows_own_state_and_public_lightning_api():
    source = (
        "from pytorch_lightning.callbacks import Callback\n"
        "self._feed = feed\n"
        "self.feed.consumed, self.feed.steps = 0, 0\n"
        "pl_module.training_step = wrapper\n"
        "del pl_module.training_step\n"
        "setattr(pl_module, name, wrapper)\n"
        "delattr(pl_module, name)\n"
        "total = trainer.num_training_batches\n"
    )
    assert public_api_violations(source) == []


# ------------------------------------------------------------------------------------------------ the wrapping
class Probe(IterStepModule):
    """Records, from inside the step, what it was handed and how the module looked."""

    def __init__(self, pattern=(1,), **kwargs) -> None:
        super().__init__(pattern, **kwargs)
        self.handed: list[object] = []
        self.step_shadowed: list[bool] = []

    def training_step(self, dataloader_iter):
        self.handed.append(dataloader_iter)
        self.step_shadowed.append("training_step" in vars(self))
        return super().training_step(dataloader_iter)


def test_step_is_wrapped_during_fit_and_unwrapped_after():
    module = Probe((2,))
    trainer().fit(module, make_loader())
    assert module.step_shadowed and all(module.step_shadowed)
    assert all(isinstance(handed, StepIterator) for handed in module.handed)
    assert len({id(handed) for handed in module.handed}) == len(module.handed), "each step gets its own iterator"
    assert "training_step" not in vars(module), "the class's own training_step must show through after fit"


class EvaluatesToo(IterStepModule):
    """All four steps take ``dataloader_iter``; each records which of the module's attributes are shadowed."""

    def __init__(self) -> None:
        super().__init__((1,))
        self.shadowed: dict[str, set[frozenset[str]]] = {}

    def _note(self, hook: str, dataloader_iter):
        self.shadowed.setdefault(hook, set()).add(frozenset(vars(self)) & set(STEP_HOOKS))
        batch, _, _ = next(dataloader_iter)
        return self.layer(batch[1]).sum()

    def training_step(self, dataloader_iter):
        self.shadowed.setdefault("training_step", set()).add(frozenset(vars(self)) & set(STEP_HOOKS))
        return super().training_step(dataloader_iter)

    def validation_step(self, dataloader_iter):
        return self._note("validation_step", dataloader_iter)

    def test_step(self, dataloader_iter):
        return self._note("test_step", dataloader_iter)

    def predict_step(self, dataloader_iter):
        return self._note("predict_step", dataloader_iter)


def test_only_the_users_steps_are_shadowed_and_only_during_their_run():
    module = EvaluatesToo()
    trainer().fit(module, make_loader(), make_loader())
    trainer().validate(module, make_loader(), verbose=False)
    trainer().test(module, make_loader(), verbose=False)
    trainer().predict(module, make_loader())
    alone = {hook: frozenset({hook}) for hook in STEP_HOOKS}
    fit_steps = alone["training_step"] | alone["validation_step"]
    assert module.shadowed == {
        "training_step": {fit_steps},
        "validation_step": {fit_steps, alone["validation_step"]},  # during fit, then in validate
        "test_step": {alone["test_step"]},
        "predict_step": {alone["predict_step"]},
    }
    assert not set(vars(module)) & set(STEP_HOOKS), "a wrapper was left on the module"


class FailsOnce(IterStepModule):
    def __init__(self) -> None:
        super().__init__((1,))
        self.failed = False

    def training_step(self, dataloader_iter):
        if not self.failed:
            self.failed = True
            raise ValueError("boom")
        return super().training_step(dataloader_iter)


def test_unwrapped_after_a_failing_fit_so_the_module_can_fit_again():
    module = FailsOnce()
    with pytest.raises(ValueError, match="boom"):
        trainer().fit(module, make_loader())
    assert "training_step" not in vars(module)
    trainer().fit(module, make_loader())
    assert module.record.received == loader_sequence(make_loader())


def test_regular_flavour_is_left_alone():
    shadowed = []

    class Regular(RegularStepModule):
        def training_step(self, batch, batch_idx):
            shadowed.append("training_step" in vars(self))
            return super().training_step(batch, batch_idx)

    trainer().fit(Regular(), make_loader())
    assert shadowed and not any(shadowed)


def test_empty_unsized_loader_never_enters_the_step():
    module = IterStepModule()
    trainer(max_epochs=2).fit(module, make_loader("unsized", n_items=0))
    assert module.record.steps == []
    assert module.record.hook_names().count("on_train_epoch_end") == 2


def test_iterator_used_after_its_step_returned_raises_naming_the_fix():
    class KeepsIterator(IterStepModule):
        kept = None

        def training_step(self, dataloader_iter):
            if self.kept is not None:
                next(self.kept)
            self.kept = dataloader_iter
            return super().training_step(dataloader_iter)

    with pytest.raises(RuntimeError, match="used after the training_step that received it returned"):
        trainer().fit(KeepsIterator(), make_loader())


def test_stray_stop_iteration_is_an_error_not_a_shorter_epoch():
    class StopsEarly(IterStepModule):
        def training_step(self, dataloader_iter):
            if self.step_calls == 1:
                raise StopIteration  # not from next(): 6 batches remain
            return super().training_step(dataloader_iter)

    with pytest.raises(RuntimeError, match="raised StopIteration although dataloader_iter still has batches"):
        trainer().fit(StopsEarly(), make_loader())


def test_registry_adds_one_callback_next_to_the_users_own():
    mine, theirs = DataloaderIterCallback(), UserCallback()
    configured = trainer(callbacks=[theirs, mine])
    assert [c for c in configured.callbacks if isinstance(c, DataloaderIterCallback)] == [mine]
    assert theirs in configured.callbacks
    added = trainer(callbacks=theirs)
    assert theirs in added.callbacks
    assert sum(isinstance(c, DataloaderIterCallback) for c in added.callbacks) == 1


def test_a_step_already_replaced_on_the_instance_is_a_clear_error():
    module = IterStepModule()
    module.training_step = lambda dataloader_iter: None  # someone else's wrapper
    with pytest.raises(RuntimeError, match="already replaced on this instance"):
        trainer().fit(module, make_loader())


# ------------------------------------------------------------------------------------------ a user's own callbacks
class UserCallback(Callback):
    """What a user's own callback observes of the batch hooks."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.calls.append(("start", _ids(batch), batch_idx, trainer.global_step, pl_module))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.calls.append(("end", _ids(batch), batch_idx, trainer.global_step, pl_module))


def _ids(batch):
    return None if batch is None else ids(batch)


def test_user_callbacks_see_loader_batches_their_indices_and_optimizer_steps():
    # Sized loader, 2 batches per step: the end hook gets the last batch the step received (as the loader made it,
    # before the transfer hooks) and its index; the start hook gets what Lightning cached, the previous step's last
    # batch ((None, 0) on the first step). The module's own hooks see the same arguments.
    user, module = UserCallback(), IterStepModule((2,))
    trainer(callbacks=[user]).fit(module, make_loader(n_items=16))
    steps = module.record.steps
    assert len(steps) == 4
    ends = [(b, i, gs) for kind, b, i, gs, _ in user.calls if kind == "end"]
    assert ends == [(step[-1][0], step[-1][1], k + 1) for k, step in enumerate(steps)]
    starts = [(b, i) for kind, b, i, _, _ in user.calls if kind == "start"]
    assert starts == [(None, 0)] + [(step[-1][0], step[-1][1]) for step in steps[:-1]]
    assert all(call[4] is module for call in user.calls)
    module_view = [(e[0].replace("on_train_batch_", ""), e[1], e[2]) for e in module.record.events
                   if e[0] in ("on_train_batch_start", "on_train_batch_end")]
    assert module_view == [(kind, b, i) for kind, b, i, _, _ in user.calls]


def test_user_callbacks_with_an_unsized_loader_get_the_look_ahead_batch_at_step_end():
    # Unsized: the look-ahead that makes ``done`` exact is fetched before Lightning reads its cache, so the end hook
    # reports the next step's first batch (the last step, with nothing left to fetch, reports its own).
    user, module = UserCallback(), IterStepModule((2,))
    trainer(callbacks=[user]).fit(module, make_loader("unsized", n_items=16))
    steps = module.record.steps
    ends = [(b, i) for kind, b, i, _, _ in user.calls if kind == "end"]
    following = [(step[0][0], step[0][1]) for step in steps[1:]] + [(steps[-1][-1][0], steps[-1][-1][1])]
    assert ends == following


# -------------------------------------------------------------------------------------- steps that take no batch
def test_sized_epoch_that_ends_while_the_step_consumes_nothing_is_an_error():
    module = IterStepModule((0, 1))  # 7 batches: calls take 0, 1, 0, 1, 0, 1, 0; the epoch ends on an empty call
    with pytest.raises(RuntimeError, match=r"after 7 step calls with only 3 of 7 batches consumed.*last 1 step calls"):
        trainer().fit(module, make_loader(n_items=14))
    assert len(module.record.received) == 3, "Lightning no longer ends the epoch by step count: drop the error"


def test_sized_epoch_cut_short_after_a_consuming_call_warns():
    module = IterStepModule((0, 1, 2))  # 8 batches: 8 calls take 7, the last call took one
    with pytest.warns(UserWarning, match=r"after 8 step calls with only 7 of 8 batches consumed"):
        trainer().fit(module, make_loader(n_items=16))
    assert len(module.record.received) == 7


@pytest.mark.parametrize("overrides", [dict(), dict(max_steps=2)], ids=["all-consumed", "max_steps"])
def test_no_cut_error_or_warning_when_nothing_was_left_behind_by_the_step_count(overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(**overrides).fit(IterStepModule((1, 2)), make_loader(n_items=14))
    assert not [w for w in caught if "num_training_batches step calls" in str(w.message)]


def test_unsized_step_that_never_consumes_is_stopped_by_the_guard():
    module = IterStepModule((1, 0, 0))  # legitimate empty calls are fine ...
    trainer().fit(module, make_loader("unsized"))
    assert len(module.record.received) == 7

    class NeverConsumes(IterStepModule):  # ... a step that never consumes again is not
        def training_step(self, dataloader_iter):
            self.step_calls += 1
            if self.step_calls > 1000:
                raise AssertionError("the guard did not stop the run")

    with pytest.raises(RuntimeError, match="without consuming a batch"):
        trainer().fit(NeverConsumes(), make_loader("unsized"))


def test_evaluation_step_that_never_consumes_is_stopped_by_the_guard():
    class IdleValidation(IterStepModule):
        calls = 0

        def validation_step(self, dataloader_iter):
            self.calls += 1
            if self.calls > 1000:
                raise AssertionError("the guard did not stop the run")

    with pytest.raises(RuntimeError, match=r"`validation_step\(dataloader_iter\)` returned 100 times"):
        trainer().validate(IdleValidation(), make_loader(), verbose=False)


# ------------------------------------------------------------------------------- ModelCheckpoint and resume
@pytest.mark.parametrize("dataset", [SizedItems, UnsizedItems], ids=["sized", "unsized"])
def test_resume_from_model_checkpoint_continues_batches_and_their_indices(tmp_path, dataset):
    # 10 batches, 2 per step, a checkpoint every 2 step calls, a crash entering step call 3: the checkpoint holds
    # 4 consumed batches (for the unsized loader also the look-ahead batch 4, which the loader's saved state
    # already counts as delivered). The resumed run must receive batches 4..9 numbered 4..9.
    def run(module, **fit_kwargs):
        every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_last=True, save_top_k=-1)
        configured = trainer(enable_checkpointing=True, callbacks=[every])
        configured.fit(module, StatefulDataLoader(dataset(20), batch_size=BATCH_SIZE), **fit_kwargs)
        return configured

    with pytest.raises(Crash):
        run(CrashingModule((2,), crash_at=3))
    resumed = CrashingModule((2,), crash_at=None)
    resumed_trainer = run(resumed, ckpt_path=str(tmp_path / "last.ckpt"))
    sequence = loader_sequence(DataLoader(dataset(20), batch_size=BATCH_SIZE))
    received = [(b, i) for step in resumed.record.steps for b, i, _ in step]
    assert received == list(zip(sequence, range(10), strict=True))[4:]
    assert resumed_trainer.global_step == 5
    # Lightning's own ``done`` counts restored step calls as fetched batches, so it turns True late after a resume;
    # the callback's restored batch count keeps the step from being entered on the exhausted iterator.
    assert all(resumed.record.steps), "a resumed step was entered with no batch left"
