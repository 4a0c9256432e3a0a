"""What the conformance suite cannot see of ``batch_processor``: the look-ahead, the step iterator, misuse errors.

The first part drives :class:`LookAhead` and :class:`LookAheadStepIterator` with plain callables (no Trainer) so each
edge case is visible; the second runs a real Trainer and DataLoader and observes from inside the user's code.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prototypes import DESIGNS
from prototypes.batch_processor.evaluation import IteratorEvaluationLoop, IteratorPredictionLoop
from prototypes.batch_processor.lookahead import LookAhead, LookAheadStepIterator
from prototypes.batch_processor.training import IteratorFitLoop, IteratorTrainingEpochLoop
from tests.conformance.harness import (
    QUIET,
    IterStepModule,
    RegularStepModule,
    SizedItems,
    ids,
    loader_sequence,
    make_loader,
    reference_weights,
    split_by_pattern,
)

DESIGN = DESIGNS["batch_processor"]


def trainer(**overrides):
    return DESIGN.trainer(**{**QUIET, **overrides})


# ------------------------------------------------------------------------------------- look-ahead, no Trainer
class Source:
    """``fetch``/``transfer`` callables over ``n`` items that log every call, as the loop would drive them."""

    def __init__(self, n: int, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at
        self.fetched: list[int] = []
        self.stop_iterations = 0
        self.transferred: list[int] = []

    def fetch(self):
        index = len(self.fetched)
        if index == self.n:
            self.stop_iterations += 1
            raise StopIteration
        self.fetched.append(index)
        if index == self.fail_at:
            raise KeyError(f"item {index} is corrupt")
        return f"raw{index}", index, 0

    def transfer(self, batch: str, dataloader_idx: int) -> str:
        self.transferred.append(int(batch.removeprefix("raw")))
        return batch.replace("raw", "dev")

    def look_ahead(self) -> LookAhead:
        return LookAhead(self.fetch, self.transfer)


def test_look_ahead_holds_exactly_one_batch_and_stops_fetching_once_exhausted():
    source = Source(3)
    batches = source.look_ahead()
    assert source.fetched == [0] and not batches.exhausted
    taken = []
    for expected_fetched in ([0, 1], [0, 1, 2], [0, 1, 2]):
        taken.append(batches.take())
        assert source.fetched == expected_fetched
    assert taken == [("dev0", 0, 0), ("dev1", 1, 0), ("dev2", 2, 0)]
    assert batches.exhausted
    for _ in range(3):  # asking again never calls fetch again: an exhausted loader may hang on next()
        with pytest.raises(StopIteration):
            batches.take()
    assert source.stop_iterations == 1


def test_exhausted_is_exact_right_after_the_last_batch_is_taken():
    source = Source(2)
    batches = source.look_ahead()
    batches.take()
    assert not batches.exhausted
    batches.take()
    assert batches.exhausted


def test_an_empty_source_is_exhausted_before_anything_is_taken():
    source = Source(0)
    batches = source.look_ahead()
    assert batches.exhausted
    with pytest.raises(StopIteration):
        batches.peek()
    assert source.transferred == []


def test_transfer_runs_once_per_batch_and_only_when_the_batch_is_needed():
    source = Source(3)
    batches = source.look_ahead()
    assert source.transferred == [], "fetching ahead must not transfer ahead"
    assert batches.peek() == batches.peek() == ("dev0", 0, 0)
    assert source.transferred == [0], "peeking twice transfers once"
    assert batches.take() == ("dev0", 0, 0)
    assert source.transferred == [0], "a peeked batch is not transferred again when taken"
    batches.take()
    assert source.transferred == [0, 1]
    assert source.fetched == [0, 1, 2], "batch 2 was fetched ahead but not transferred"


def test_a_fetch_error_surfaces_at_the_batch_it_belongs_to_with_its_type():
    source = Source(5, fail_at=2)
    batches = source.look_ahead()
    assert batches.take()[1] == 0
    assert batches.take()[1] == 1, "fetching batch 2 failed, but batch 1 was fetched fine and is handed out"
    with pytest.raises(KeyError, match="item 2 is corrupt") as raised:
        batches.peek()
    assert any(frame.name == "fetch" for frame in raised.traceback), "the original traceback is kept"
    assert not batches.exhausted, "a failed fetch is not the end of the data"


def test_step_iterator_hands_out_through_the_loop_and_refuses_use_after_close():
    source = Source(3)
    batches = source.look_ahead()
    step_iter = LookAheadStepIterator(batches, lambda item: item)
    assert next(step_iter) == ("dev0", 0, 0)
    assert list(itertools.islice(step_iter, 1)) == [("dev1", 1, 0)]
    assert not step_iter.done
    step_iter.close()
    with pytest.raises(RuntimeError, match=r"only inside the step that received it.*keep the batch, not the iterator"):
        next(step_iter)
    assert source.fetched == [0, 1, 2] and len(source.transferred) == 2, "a refused next() takes nothing"


def test_step_iterator_done_and_stop_iteration_at_the_end():
    source = Source(1)
    batches = source.look_ahead()
    step_iter = LookAheadStepIterator(batches, lambda item: item)
    assert [b for b, _, _ in step_iter] == ["dev0"], "a for loop over the iterator ends cleanly"
    assert step_iter.done
    with pytest.raises(StopIteration):
        next(step_iter)


def test_consumed_state_excludes_the_batch_held_back_and_marks_the_end():
    source = Source(2)
    # the state is "items fetched so far"; after the end, the loader says so
    state = lambda: "ended" if source.stop_iterations else len(source.fetched)  # noqa: E731
    batches = LookAhead(source.fetch, source.transfer, state)
    assert source.fetched == [0] and batches.consumed_loader_states == 0, "batch 0 is held back, not consumed"
    batches.take()
    assert source.fetched == [0, 1] and batches.consumed_loader_states == 1
    batches.take()
    assert batches.exhausted and batches.consumed_loader_states == "ended", "nothing held back: the state after the end"


def test_consumed_state_is_none_without_a_snapshot():
    batches = Source(2).look_ahead()
    batches.take()
    assert batches.consumed_loader_states is None


def test_step_iterator_over_one_dataloader_stops_where_the_next_begins():
    items = iter([("a0", 0, 0), ("a1", 1, 0), ("b0", 0, 1)])
    batches = LookAhead(lambda: next(items), lambda batch, dataloader_idx: batch)
    first = LookAheadStepIterator(batches, lambda item: item, dataloader_idx=0, step="validation_step")
    assert [b for b, _, _ in first] == ["a0", "a1"], "the iterator of loader 0 ends at its last batch"
    assert first.done and not batches.exhausted
    second = LookAheadStepIterator(batches, lambda item: item, dataloader_idx=1, step="validation_step")
    assert not second.done
    assert next(second) == ("b0", 0, 1) and second.done and batches.exhausted
    second.close()
    with pytest.raises(RuntimeError, match="used after the validation_step that received it returned"):
        next(second)


# ------------------------------------------------------------------------------------- with a real Trainer
def test_trainer_carries_the_design_loops():
    fitted = trainer()
    assert isinstance(fitted.fit_loop, IteratorFitLoop)
    assert isinstance(fitted.fit_loop.epoch_loop, IteratorTrainingEpochLoop)
    for loop in (fitted.fit_loop.epoch_loop.val_loop, fitted.validate_loop, fitted.test_loop):
        assert isinstance(loop, IteratorEvaluationLoop)
    assert isinstance(fitted.predict_loop, IteratorPredictionLoop)
    assert fitted.validate_loop.inference_mode and not fitted.fit_loop.epoch_loop.val_loop.inference_mode


class SavesEveryStep(IterStepModule):
    """Notes, at each checkpoint, the loader state the checkpoint holds and the batches consumed so far."""

    def __init__(self, pattern) -> None:
        super().__init__(pattern)
        self.saved: list[tuple[int, dict]] = []

    def on_save_checkpoint(self, checkpoint):
        [state] = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        epoch_loop = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]
        self.saved.append((len(self.record.received), state, epoch_loop["step_calls"]))


def _batches_yielded(state: dict) -> int:
    # StatefulDataLoader's own count; with workers it sits in the main process's snapshot
    return state["_snapshot"]["_snapshot_step"] if "_snapshot" in state else state["_num_yielded"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_records_the_loader_state_of_the_consumed_batches(tmp_path, workers):
    # 7 batches, 2 per call: calls [0,1] [2,3] [4,5] [6]; the look-ahead holds one more batch at every save
    module = SavesEveryStep((2,))
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    loader = StatefulDataLoader(SizedItems(14), batch_size=2, num_workers=workers)
    trainer(enable_checkpointing=True, callbacks=[every]).fit(module, loader)
    consumed = [(received, _batches_yielded(state), calls) for received, state, calls in module.saved]
    assert consumed == [(2, 2, 1), (4, 4, 2), (6, 6, 3)], "the held-back batch is not in the recorded state"
    # the last call cut short by StopIteration takes no optimizer step, so no checkpoint: check the end state
    assert not module.saved[-1][1]["_iterator_finished"]


def test_a_checkpoint_at_the_epoch_end_records_the_loader_as_ended(tmp_path):
    # 8 batches, 2 per call: the last save is at the epoch's last batch; resuming from it must start a new epoch
    module = SavesEveryStep((2,))
    every = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    loader = StatefulDataLoader(SizedItems(16), batch_size=2)
    trainer(enable_checkpointing=True, callbacks=[every]).fit(module, loader)
    received, state, _ = module.saved[-1]
    assert received == 8 and _batches_yielded(state) == 8 and state["_iterator_finished"]


class CountsLoaderNexts(StatefulDataLoader):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.items_loaded = 0

    def __iter__(self):
        for batch in super().__iter__():
            self.items_loaded += len(batch[0])
            yield batch


def test_a_limited_epoch_does_not_load_past_its_limit():
    module = IterStepModule((1,))
    loader = CountsLoaderNexts(SizedItems(14), batch_size=2)
    trainer(limit_train_batches=3).fit(module, loader)
    assert len(module.record.received) == 3 and loader.items_loaded == 6


class EvaluationHookProbe(IterStepModule):
    """Validation takes 2 batches per call; notes what on_validation_batch_start/end and the step see."""

    def __init__(self) -> None:
        super().__init__((1,))
        self.seen: list[tuple] = []

    def validation_step(self, dataloader_iter):
        for _ in range(2):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            self.seen.append(("next", ids(batch), batch_idx, dataloader_idx))

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("start", ids(batch), batch_idx, dataloader_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("end", ids(batch), batch_idx, dataloader_idx))


def test_evaluation_hooks_see_the_first_and_last_batch_of_each_call():
    module = EvaluationHookProbe()
    trainer().validate(module, [make_loader("sized", n_items=8), make_loader("sized", n_items=4)], verbose=False)
    assert module.seen == [
        ("start", (0, 1), 0, 0), ("next", (0, 1), 0, 0), ("next", (2, 3), 1, 0), ("end", (2, 3), 1, 0),
        ("start", (4, 5), 2, 0), ("next", (4, 5), 2, 0), ("next", (6, 7), 3, 0), ("end", (6, 7), 3, 0),
        ("start", (0, 1), 0, 1), ("next", (0, 1), 0, 1), ("next", (2, 3), 1, 1), ("end", (2, 3), 1, 1),
    ]


class IdleValidation(IterStepModule):
    def validation_step(self, dataloader_iter):
        return None


@pytest.mark.timeout(30)
def test_an_evaluation_step_that_never_consumes_ends_with_an_error():
    with pytest.raises(RuntimeError, match=r"without consuming a batch"):
        trainer().validate(IdleValidation((1,)), make_loader("sized"), verbose=False)


class RegularEvaluation(IterStepModule):
    def validation_step(self, batch, batch_idx):
        self.record.events.append(("validation_step", ids(batch), batch_idx))


def test_a_regular_validation_step_runs_lightnings_loop():
    module = RegularEvaluation((1,))
    trainer().validate(module, make_loader("sized", n_items=6), verbose=False)
    assert module.record.events == [("validation_step", (0, 1), 0), ("validation_step", (2, 3), 1),
                                    ("validation_step", (4, 5), 2)]


class FetchLoggingItems(SizedItems):
    """Sized items that log when the DataLoader (``num_workers=0``) fetches them."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.fetched: list[int] = []

    def __getitem__(self, i: int):
        self.fetched.append(i)
        return super().__getitem__(i)


class AheadProbe(IterStepModule):
    """Notes, at every ``next()``, how far fetching and transferring ran ahead of what the step received."""

    def __init__(self, dataset: FetchLoggingItems) -> None:
        super().__init__((2,))
        self.dataset = dataset
        self.transfers = self.received = 0
        self.ahead: list[tuple[int, int]] = []  # (batches fetched, batches transferred) minus batches received

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.transfers += 1
        return batch

    def training_step(self, dataloader_iter):
        batches = []
        for _ in range(2):
            batches.append(next(dataloader_iter)[0])
            self.received += 1
            self.ahead.append((len(self.dataset.fetched) // 2 - self.received, self.transfers - self.received))
        return self.loss_of(batches)


def test_fetching_runs_one_batch_ahead_and_transfer_none():
    dataset = FetchLoggingItems(16)
    module = AheadProbe(dataset)
    trainer().fit(module, DataLoader(dataset, batch_size=2))
    assert len(module.ahead) == 8
    # one fetched ahead while batches remain, none after the last; never transferred ahead of the step
    assert module.ahead == [(1, 0)] * 7 + [(0, 0)]
    assert dataset.fetched == list(range(16)), "every item fetched exactly once"


class Keeper(IterStepModule):
    """Keeps the first step's iterator and calls ``next()`` on it in the second step."""

    def training_step(self, dataloader_iter):
        if self.step_calls == 1:
            next(self.kept)
        self.kept = dataloader_iter
        return super().training_step(dataloader_iter)


@pytest.mark.timeout(30)
def test_iterator_used_after_its_step_returned_is_a_clear_error():
    module = Keeper((1,))
    with pytest.raises(RuntimeError, match="used after the training_step that received it returned"):
        trainer().fit(module, make_loader("sized", n_items=8))
    assert module.record.received == [(0, 1)], "the refused next() took no batch"


class ForeignStop(IterStepModule):
    def training_step(self, dataloader_iter):
        if self.step_calls == 1:
            next(iter([]))  # the user's own exhausted iterator, not dataloader_iter
        return super().training_step(dataloader_iter)


@pytest.mark.timeout(30)
def test_stop_iteration_not_from_dataloader_iter_is_an_error_not_a_silent_epoch_end():
    with pytest.raises(RuntimeError, match="did not come from dataloader_iter"):
        trainer().fit(ForeignStop((1,)), make_loader("sized", n_items=8))


class LBFGSModule(IterStepModule):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=3)


@pytest.mark.timeout(30)
def test_an_optimizer_that_reevaluates_its_closure_is_a_clear_error():
    with pytest.raises(RuntimeError, match="evaluated its closure more than once.*manual optimisation"):
        trainer().fit(LBFGSModule((1,)), make_loader("sized", n_items=8))


class FailingItems(SizedItems):
    def __getitem__(self, i: int):
        if i == 10:
            raise ValueError("item 10 is unreadable")
        return super().__getitem__(i)


@pytest.mark.timeout(30)
def test_a_loader_error_surfaces_after_the_batches_before_it_were_received():
    module = IterStepModule((2,))
    with pytest.raises(ValueError, match="item 10 is unreadable"):
        trainer().fit(module, DataLoader(FailingItems(16), batch_size=2))
    assert module.record.received == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    assert "log" not in vars(module), "a failed fit restores the module's log too"


def test_accumulation_window_cut_short_at_epoch_end_still_steps_its_earlier_calls():
    # 7 batches, 2 per call, accumulate 2: calls [0,1] [2,3] | [4,5] [6]+StopIteration -> 2 optimizer steps,
    # the second on call 2's gradients alone, as a plain loop stepping at the epoch's last completed call
    module = IterStepModule((2,))
    fitted = trainer(accumulate_grad_batches=2)
    fitted.fit(module, make_loader("sized", n_items=14))
    assert module.optimizer_steps_taken() == fitted.global_step == 2
    groups = split_by_pattern(loader_sequence(make_loader("sized", n_items=14)), (2,))
    expected = reference_weights(module, groups, complete=[True, True, True, False], accumulate=2)
    for name, value in module.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name])


def test_manual_optimisation_step_cut_short_ends_the_epoch_cleanly():
    # Lightning's manual loop swallows the StopIteration itself; the exhausted look-ahead still ends the epoch
    module = IterStepModule((2,), automatic=False)
    fitted = trainer(max_epochs=2)
    fitted.fit(module, make_loader("sized", n_items=14))
    assert [end["completed"] for end in module.record.epoch_ends] == [7, 7]
    assert module.optimizer_steps_taken() == fitted.global_step == 6


class EmptyItems(IterableDataset):
    def __iter__(self):
        return iter(())


def test_an_empty_unsized_loader_never_enters_the_step():
    module = IterStepModule((1,))
    fitted = trainer(max_epochs=2)
    fitted.fit(module, DataLoader(EmptyItems(), batch_size=2))
    assert module.step_calls == 0
    assert module.record.hook_names().count("on_train_epoch_end") == 2


# ------------------------------------------------------------------------------------- self.log's batch size
class ValidationLogger(IterStepModule):
    """Logs in validation too: its weights must come from the validation batches, not the training step."""

    def validation_step(self, batch, batch_idx):
        self.log("val_ids_mean", batch[0].float().mean(), on_epoch=True)


def test_validation_logging_during_fit_keeps_its_own_batch_size():
    # validation batches of 2, 2, 1 items; training steps take 3 batches: a training batch size would skew it
    module = ValidationLogger((3,), log_metrics=True)
    fitted = trainer()
    fitted.fit(module, make_loader("sized", n_items=12), make_loader("sized", n_items=5))
    sequence = loader_sequence(make_loader("sized", n_items=5))
    expected = sum(sum(b) for b in sequence) / sum(len(b) for b in sequence)
    assert float(fitted.callback_metrics["val_ids_mean"]) == pytest.approx(expected)


class ZeroThenLog(IterStepModule):
    """Logs a constant per step, including steps that took no batch."""

    def training_step(self, dataloader_iter):
        out = super().training_step(dataloader_iter)
        self.log("calls", 1.0, on_step=False, on_epoch=True, reduce_fx="sum")
        return out


def test_a_step_that_consumed_nothing_can_still_log():
    module = ZeroThenLog((0, 2))
    fitted = trainer()
    fitted.fit(module, make_loader("sized", n_items=16))
    assert module.step_calls == 8
    assert float(fitted.callback_metrics["calls"]) == 8.0


class IntBatches(Dataset):
    """Batches that are plain Python lists of ints: no tensor to infer a batch size from."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


class LogsUninferable(IterStepModule):
    def training_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        self.log("value", float(len(batch)), on_epoch=True)
        return None


@pytest.mark.timeout(30)
def test_a_batch_size_that_cannot_be_inferred_asks_for_batch_size():
    loader = DataLoader(IntBatches(), batch_size=2, collate_fn=list)
    with pytest.raises(MisconfigurationException, match=r"batch_size="):
        trainer().fit(LogsUninferable((1,)), loader)


def test_log_is_restored_after_fit_and_the_regular_flavour_is_left_alone():
    module = IterStepModule((2,), log_metrics=True)
    trainer().fit(module, make_loader("sized"))
    assert "log" not in vars(module), "the batch-size-supplying log must not outlive fit"
    regular = RegularStepModule(log_metrics=True)
    trainer().fit(regular, make_loader("sized"))
    assert "log" not in vars(regular)



@pytest.mark.parametrize("kind", ["sized", "unsized"])
def test_an_epoch_cut_short_by_stop_iteration_still_validates_at_its_end(kind):
    # 7 batches, 3 per call: the third call receives batch 6, then next() raises StopIteration (compare #19624)
    module = IterStepModule((3,))
    trainer(max_epochs=2, limit_val_batches=1).fit(module, make_loader(kind, n_items=14), make_loader("sized", 2))
    assert module.record.validations == [(0, 7), (1, 7)]
