"""C14 Misuse gets a clear error naming the fix, never a hang or silent loss.

The stance the suite enforces, per case (the exception type is free; the message is checked for key words):

(a) ``dataloader_iter`` is one object for every step call over one dataloader (in training: the epoch; in
    evaluation: the run), as stock Lightning hands out, valid until the loop over that dataloader ends. A ``next()``
    between step calls (in ``on_train_batch_end``, or on a pipeline's own loading thread) hands out the next batch,
    counted toward the next step call. A ``next()`` after the loop over its dataloader ended (the iterator of an
    earlier epoch or evaluation run, or after ``fit``) is misuse: an error that says the iterator was used after its
    loop ended and where ``next()`` belongs. A batch taken then belongs to no step call: it would be counted,
    checkpointed and logged against the wrong epoch, or never trained on.
(b) A step that keeps consuming no batch while nothing else (limits, ``max_steps``, ...) would end training:
    the run ends with an error naming ``dataloader_iter``/``next()``, at the latest after ``SPIN_LIMIT``
    consecutive empty step calls (the suite's user code raises its own exception at that point, so a design that
    would spin forever fails fast instead of hanging). Legitimate empty steps (C3 uses up to five in a row) must
    not trigger it. Ending the epoch quietly after ``num_training_batches`` step calls is silent loss, not a stop.
(c) An empty loader is not an error (Lightning allows one, e.g. an empty shard on one rank): the step is never
    entered, ``fit`` returns, and the user hears at least what the regular flavour tells them about it.
(d) A loader yielding ``None`` batches is not misuse either: ``None`` is data, handed out as ``(None, batch_idx,
    dataloader_idx)`` like any batch (as the regular flavour passes it to ``training_step``) and never mistaken
    for the end of data, also by a step using the ``next(dataloader_iter, None)`` idiom.
(e) A step signature taking both ``dataloader_iter`` and ``batch`` (or the pre-2.1 ``batch_idx``): refused before
    any batch is consumed, with an error naming both parameters and saying to keep only ``dataloader_iter``.
(f) A ``StopIteration`` raised in the step that did not come from ``dataloader_iter`` (batches remain): an error,
    not an epoch silently cut short.
"""

from __future__ import annotations

import re
import warnings

import pytest
from torch.utils.data import DataLoader, default_collate

from tests.conformance.harness import (
    KINDS,
    IterStepModule,
    RegularStepModule,
    SizedItems,
    UnsizedItems,
    assert_names_the_fix,
    assert_same_batches,
    error_chain_text,
    ids,
    loader_sequence,
    make_loader,
    make_trainer,
    stock_trainer,
    warning_texts,
)

pytestmark = pytest.mark.clause("C14")

# (b): a design must stop a run of empty step calls no later than this; C3's patterns have at most 5 in a row.
SPIN_LIMIT = 200


# --------------------------------------------------------------------------------------------- (a) the iterator's life
class KeepsIterators(IterStepModule):
    """Takes one batch per step and keeps every ``dataloader_iter`` it receives, per epoch; with ``between``, takes
    one more batch in ``on_train_batch_end`` after step call 0 of each epoch (between two step calls)."""

    def __init__(self, between: bool = False) -> None:
        super().__init__((1,))
        self.between = between
        self.received_per_epoch: list[list] = []
        self.taken_between: list[tuple] = []

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.received_per_epoch.append([])

    def training_step(self, dataloader_iter):
        self.received_per_epoch[-1].append(dataloader_iter)
        return super().training_step(dataloader_iter)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.between and len(self.received_per_epoch[-1]) == 1:
            batch, batch_idx, _ = next(self.received_per_epoch[-1][0])
            self.taken_between.append((ids(batch), batch_idx))


def test_iterator_is_one_object_per_epoch(design):
    module = KeepsIterators()
    make_trainer(design, max_epochs=2).fit(module, make_loader("sized"))
    identities = [{id(handed) for handed in epoch} for epoch in module.received_per_epoch]
    assert [len(epoch) for epoch in identities] == [1, 1], (
        f"distinct dataloader_iter objects per epoch: {[len(epoch) for epoch in identities]}; every step call of an"
        " epoch must receive the same object, as stock Lightning hands out (a pipeline binds to the first it gets)"
    )
    assert module.received_per_epoch[0][0] is not module.received_per_epoch[1][0], (
        "the second epoch received the first epoch's dataloader_iter, whose loop has ended"
    )


def test_next_between_step_calls_hands_out_the_next_batch(design):
    module = KeepsIterators(between=True)
    make_trainer(design).fit(module, make_loader("sized", n_items=16))
    sequence = [(batch, batch_idx) for batch_idx, batch in enumerate(loader_sequence(make_loader("sized", n_items=16)))]
    in_steps = [(ids, batch_idx) for step in module.record.steps for ids, batch_idx, _ in step]
    assert module.taken_between == [sequence[1]], (
        f"next() in on_train_batch_end after step call 0 handed out {module.taken_between}; expected {sequence[1]}"
    )
    assert in_steps == sequence[:1] + sequence[2:], (
        f"the steps received {in_steps}: with batch 1 taken between the calls, they must receive every other batch"
        " once, in order"
    )
    completed = module.trainer.fit_loop.epoch_loop.batch_progress.total.completed
    assert completed == len(sequence), (
        f"{completed} batches counted; the batch taken between the calls counts toward the next call: {len(sequence)}"
    )


class UsesAnEndedIterator(KeepsIterators):
    """Calls ``next()`` on an iterator whose loop has ended: ``where`` the test says."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where
        self.validation_iterator = None
        self.taken_outside: list[tuple] = []

    def training_step(self, dataloader_iter):
        ended = None
        if self.where == "next_epoch" and len(self.received_per_epoch) == 2 and not self.received_per_epoch[-1]:
            ended = self.received_per_epoch[0][0]
        if self.where == "after_validation" and self.validation_iterator is not None:
            ended, self.validation_iterator = self.validation_iterator, None
        if ended is not None:
            batch, batch_idx, _ = next(ended)
            self.taken_outside.append((ids(batch), batch_idx))
        return super().training_step(dataloader_iter)

    def validation_step(self, dataloader_iter):
        self.validation_iterator = dataloader_iter
        next(dataloader_iter)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("where", ["next_epoch", "after_validation", "after_fit"])
def test_iterator_used_after_its_loop_ended(design, where):
    module = UsesAnEndedIterator(where)
    loaders = (make_loader("sized"), make_loader("sized")) if where == "after_validation" else (make_loader("sized"),)
    try:
        make_trainer(design, max_epochs=2, val_check_interval=2).fit(module, *loaders)
        if where == "after_fit":
            batch, batch_idx, _ = next(module.received_per_epoch[-1][0])
            module.taken_outside.append((ids(batch), batch_idx))
    except Exception as error:
        assert_names_the_fix(error_chain_text(error), r"dataloader_iter", r"after", r"only while|inside|only in",
                             what=f"next() on an iterator whose loop ended ({where})")
        return
    raise AssertionError(
        f"next() on a dataloader_iter whose loop had ended ({where}) raised nothing: it handed out (ids, batch_idx)"
        f" {module.taken_outside} (the batch belongs to no step call of that loop: never trained on, or counted and"
        " checkpointed against a loop that did not receive it)"
    )


# --------------------------------------------------------------------------------------------- (b) no progress
class _SpinGuard(Exception):
    """Raised by the suite's own step: the design let SPIN_LIMIT empty step calls in a row run without stopping."""


class StopsConsuming(IterStepModule):
    """Takes one batch in each of its first ``consuming`` step calls, then none, ever."""

    def __init__(self, consuming: int) -> None:
        super().__init__((1,))
        self.consuming = consuming
        self.empty_in_a_row = 0

    def training_step(self, dataloader_iter):
        if self.step_calls < self.consuming:
            return super().training_step(dataloader_iter)
        self.step_calls += 1
        self.empty_in_a_row += 1
        if self.empty_in_a_row > SPIN_LIMIT:
            raise _SpinGuard(
                f"step call {self.step_calls}: {SPIN_LIMIT} consecutive step calls consumed no batch and the design"
                f" neither stopped nor raised; without this guard the run would spin forever"
            )
        return None


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("consuming", [0, 2], ids=["never-consumes", "stops-after-2"])
def test_step_that_keeps_consuming_nothing_ends_with_an_error(design, kind, consuming):
    module = StopsConsuming(consuming)
    n = len(loader_sequence(make_loader(kind)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            make_trainer(design).fit(module, make_loader(kind))
        except _SpinGuard:
            raise
        except Exception as error:
            assert_names_the_fix(error_chain_text(error), r"dataloader_iter|next\(", r"consum|no batch|progress",
                          what=f"after {module.empty_in_a_row} empty step calls")
            return
    # a warning about this run's unconsumed batches (not Lightning's generic advice on the flavour)
    said = [str(w.message) for w in caught if re.search(r"no batch|not trained|at least one batch", str(w.message))]
    raise AssertionError(
        f"fit returned normally after {module.step_calls} step calls, the last {module.empty_in_a_row} consuming no"
        f" batch: {n - consuming} of the epoch's {n} batches were never trained on, with no error"
        + (f" (only a warning: {said[0]!r})" if said else " and nothing said so")
    )


# --------------------------------------------------------------------------------------------- (c) empty loader
def _about_empty(texts: list[str]) -> set[str]:
    return {t for t in texts if re.search(r"zero|empty|no (training )?batch", t, re.IGNORECASE)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_empty_loader_never_enters_the_step_and_says_so(design, kind):
    module = IterStepModule((1,))
    trainer = make_trainer(design, max_epochs=2)
    texts = warning_texts(lambda: trainer.fit(module, make_loader(kind, n_items=0)))
    assert module.step_calls == 0, (
        f"the step was entered {module.step_calls} times on an empty loader; its next() raised StopIteration"
    )
    regular = warning_texts(lambda: stock_trainer(max_epochs=2).fit(RegularStepModule(), make_loader(kind, n_items=0)))
    quieter = _about_empty(regular) - _about_empty(texts)
    assert not quieter, f"the regular flavour warns about the empty loader and this one does not: {sorted(quieter)}"


# --------------------------------------------------------------------------------------------- (d) None batches
NONE_AT = (0, 2, 4)  # batch positions the collate function turns into None: first, middle and last of 5


def _none_collate(items):
    batch = default_collate(items)
    return None if int(batch[0][0]) // 2 in NONE_AT else batch


def _none_loader(kind: str) -> DataLoader:
    dataset = {"sized": SizedItems, "unsized": UnsizedItems}[kind](10)
    return DataLoader(dataset, batch_size=2, collate_fn=_none_collate)


def _expected_with_nones() -> list[tuple]:
    return [(None if k in NONE_AT else (2 * k, 2 * k + 1), k, 0) for k in range(5)]


class TakesNoneBatches(IterStepModule):
    """Records ``(ids or None, batch_idx, dataloader_idx)``; trains on the batches that are not None."""

    def __init__(self, pattern=(1,), *, use_default: bool = False) -> None:
        super().__init__(pattern)
        self.use_default = use_default

    def training_step(self, dataloader_iter):
        call = self.step_calls
        self.step_calls += 1
        received: list[tuple] = []
        self.record.steps.append(received)
        batches = []
        takes = self.pattern[call % len(self.pattern)]
        while self.use_default or len(received) < takes:
            item = next(dataloader_iter, None) if self.use_default else next(dataloader_iter)
            if item is None:  # the end of data, as the TorchRec idiom spells it
                break
            batch, batch_idx, dataloader_idx = item
            received.append((None if batch is None else ids(batch), batch_idx, dataloader_idx))
            if batch is not None:
                batches.append(self.receive(batch))
        return self.finish_step(batches)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,)], ids=str)
def test_none_batches_are_handed_out_like_any_batch(design, kind, pattern):
    module = TakesNoneBatches(pattern)
    make_trainer(design).fit(module, _none_loader(kind))
    assert_same_batches([b for step in module.record.steps for b in step], _expected_with_nones(),
                        "(ids or None, batch_idx, dataloader_idx) received")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_next_with_a_default_tells_a_none_batch_from_the_end(design, kind):
    module = TakesNoneBatches(use_default=True)  # one step takes every batch: next(it, None) until None
    make_trainer(design).fit(module, _none_loader(kind))
    assert module.record.steps, "the step was never entered"
    assert_same_batches(module.record.steps[0], _expected_with_nones(), "what the first step call took")


# --------------------------------------------------------------------------------------------- (e) batch and iterator
class BatchThenIter(IterStepModule):
    def training_step(self, batch, dataloader_iter):
        return IterStepModule.training_step(self, dataloader_iter)


class IterThenBatch(IterStepModule):
    def training_step(self, dataloader_iter, batch):
        return IterStepModule.training_step(self, dataloader_iter)


class IterAndBatchIdx(IterStepModule):
    def training_step(self, dataloader_iter, batch_idx):
        return IterStepModule.training_step(self, dataloader_iter)


class ValidationBatchThenIter(IterStepModule):
    def validation_step(self, batch, dataloader_iter):
        self.step_calls += 1
        next(dataloader_iter)


SIGNATURES = [
    pytest.param(BatchThenIter, "training_step", "batch", id="training_step(batch, dataloader_iter)"),
    pytest.param(IterThenBatch, "training_step", "batch", id="training_step(dataloader_iter, batch)"),
    pytest.param(IterAndBatchIdx, "training_step", "batch_idx", id="training_step(dataloader_iter, batch_idx)"),
    pytest.param(ValidationBatchThenIter, "validation_step", "batch", id="validation_step(batch, dataloader_iter)"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("module_class,hook,other", SIGNATURES)
def test_step_taking_a_batch_and_dataloader_iter_is_refused(design, module_class, hook, other):
    module = module_class((1,))
    trainer = make_trainer(design)
    with pytest.raises(Exception) as caught:
        if hook == "training_step":
            trainer.fit(module, make_loader("sized"))
        else:
            trainer.validate(module, make_loader("sized"), verbose=False)
    assert module.step_calls == 0 and not module.record.received, (
        f"{hook} ran {module.step_calls} times and consumed {module.record.received} before the error"
    )
    assert_names_the_fix(error_chain_text(caught.value), r"dataloader_iter", rf"\b{other}\b",
                  r"\bonly\b|\beither\b|\bremove\b|\bdrop\b|not both|instead",
                  what=f"{hook} taking {other!r} and dataloader_iter")


# --------------------------------------------------------------------------------------------- (f) stray StopIteration
class StrayStopIteration(IterStepModule):
    """Step call 2 exhausts an iterator of its own (not dataloader_iter) and lets the StopIteration escape."""

    def training_step(self, dataloader_iter):
        if self.step_calls == 2:
            self.step_calls += 1
            next(iter(()))
        return super().training_step(dataloader_iter)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_not_from_the_iterator_is_an_error(design, kind):
    _check_stray_stop_iteration_is_an_error(design, StrayStopIteration((1,)), kind)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_not_from_the_iterator_is_an_error_under_manual_optimisation(design, kind):
    # Lightning's manual-optimisation loop suppresses a StopIteration from the step: a design must still see it
    _check_stray_stop_iteration_is_an_error(design, StrayStopIteration((1,), automatic=False), kind)


def _check_stray_stop_iteration_is_an_error(design, module, kind):
    try:
        make_trainer(design).fit(module, make_loader(kind))
    except Exception as error:
        assert_names_the_fix(error_chain_text(error), r"StopIteration", r"catch|only from|\bdone\b",
                      what="a StopIteration from the step's own iterator at step call 2")
        return
    sequence = loader_sequence(make_loader(kind))
    raise AssertionError(
        f"a StopIteration from the step's own iterator at step call 2 raised no error: the step received"
        f" {module.record.received}; batches {sequence[len(module.record.received):]} were never trained on"
    )

