"""C7 Limits: limits count batches, ``max_steps`` counts optimizer steps, validation intervals count batches."""

import pytest
from torch.utils.data import DataLoader

from tests.conformance.harness import (
    BATCH_SIZE,
    KINDS,
    IterStepModule,
    SizedItems,
    UnsizedItems,
    assert_same_batches,
    loader_sequence,
    make_loader,
    make_trainer,
    split_by_pattern,
)
from tests.conformance.pipelining import AsyncHandleModule, TrainPipelineModule

pytestmark = pytest.mark.clause("C7")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("limit", [1, 3])
@pytest.mark.parametrize("pattern", [(2,), (3,)], ids=str)
def test_limit_train_batches_delivers_exactly_n_batches(design, kind, limit, pattern):
    module = IterStepModule(pattern)
    make_trainer(design, limit_train_batches=limit, max_epochs=2).fit(module, make_loader(kind))
    expected = loader_sequence(make_loader(kind))[:limit]
    epochs = module.record.received_in_epochs()
    assert len(epochs) == 2
    for epoch in epochs:
        assert_same_batches([batch for batch, _ in epoch], expected)


@pytest.mark.parametrize("pattern", [(1,), (3,)], ids=str)
def test_limit_train_batches_fraction(design, pattern):
    module = IterStepModule(pattern)
    make_trainer(design, limit_train_batches=0.5).fit(module, make_loader("sized", n_items=16))
    assert_same_batches(module.record.received, loader_sequence(make_loader("sized", n_items=16))[:4])


@pytest.mark.parametrize("pattern", [(2,), (1, 2)], ids=str)
def test_max_steps_counts_optimizer_steps(design, pattern):
    module = IterStepModule(pattern)
    trainer = make_trainer(design, max_steps=3, max_epochs=5)
    trainer.fit(module, make_loader("sized", n_items=16))
    assert trainer.global_step == module.optimizer_steps_taken() == 3
    groups = split_by_pattern(loader_sequence(make_loader("sized", n_items=16)), pattern)
    expected = [b for group in groups[:3] for b in group]
    assert_same_batches(module.record.received, expected)


@pytest.mark.parametrize("kind", KINDS)
def test_max_epochs_restarts_the_iterator(design, kind):
    module = IterStepModule((2,))
    make_trainer(design, max_epochs=3).fit(module, make_loader(kind))
    expected = [(batch, index) for index, batch in enumerate(loader_sequence(make_loader(kind)))]
    assert module.record.received_in_epochs() == [expected] * 3


def expected_validations(pattern, n_batches, interval, epochs, across_epochs=False):
    """(epoch, batches consumed in the epoch) at each step boundary where the batches counted reach a multiple of
    ``interval``: the epoch's batches, or with ``across_epochs`` (``check_val_every_n_epoch=None``) the run's."""
    points, counted = [], 0
    for epoch in range(epochs):
        boundary = 0
        if not across_epochs:
            counted = 0
        for group in split_by_pattern(range(n_batches), pattern):
            previous, counted, boundary = counted, counted + len(group), boundary + len(group)
            if counted // interval > previous // interval:
                points.append((epoch, boundary))
    return points


@pytest.mark.parametrize("interval", [2, 3])
@pytest.mark.parametrize("pattern", [(1,), (2,), (3,), (1, 2)], ids=str)
def test_val_check_interval_counts_batches(design, interval, pattern):
    module = IterStepModule(pattern)
    trainer = make_trainer(design, val_check_interval=interval, limit_val_batches=1, max_epochs=2)
    trainer.fit(module, make_loader("sized", n_items=16), make_loader("sized", n_items=2))
    assert module.record.validations == expected_validations(pattern, 8, interval, epochs=2)


EVERY_N_EPOCHS = [pytest.param(1, id="in-epoch"), pytest.param(None, id="across-epochs")]


@pytest.mark.parametrize("interval", [3, 5])
@pytest.mark.parametrize("pattern", [(1,), (2,), (3,), (1, 2)], ids=str)
@pytest.mark.parametrize("every_n_epochs", EVERY_N_EPOCHS)
@pytest.mark.parametrize("kind", KINDS)
def test_val_check_interval_counts_batches_of_any_loader(design, kind, every_n_epochs, pattern, interval):
    # 8 batches per epoch: (3,) ends each epoch with a call cut short at the end of the data, the others with a call
    # that takes the last batch (no drain call follows: these steps pull nothing ahead, C17); the last boundary of an
    # epoch (8) is a validation point in some cases (interval 3 across epochs: 15 is reached at 16)
    module = IterStepModule(pattern)
    trainer = make_trainer(
        design, val_check_interval=interval, check_val_every_n_epoch=every_n_epochs, limit_val_batches=1, max_epochs=2
    )
    trainer.fit(module, make_loader(kind, n_items=16), make_loader("sized", n_items=2))
    expected = expected_validations(pattern, 8, interval, epochs=2, across_epochs=every_n_epochs is None)
    assert module.record.validations == expected, "(epoch, batches consumed in the epoch) at each validation"


def _counting_consumed(pipeline):
    class CountingConsumed(pipeline):
        """Notes (epoch, batches consumed in the epoch, batches trained in the epoch) at each validation."""

        def on_train_epoch_start(self) -> None:
            super().on_train_epoch_start()
            self.consumed_in_epoch = 0

        def receive(self, batch):
            self.consumed_in_epoch += 1
            return super().receive(batch)

        def on_validation_start(self) -> None:
            self.record.validations.append((self.current_epoch, self.consumed_in_epoch, len(self.trained[-1])))

    return CountingConsumed


@pytest.mark.parametrize("interval", [2, 5])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pipeline", [AsyncHandleModule, TrainPipelineModule], ids=["async-handle", "train-pipeline"])
def test_val_check_interval_with_held_batches(design, pipeline, kind, interval):
    # A pipelining step consumes 2, 1, 1, 1 of an epoch's 5 batches and trains one call late: a validation at a
    # boundary inside the epoch finds one batch held; one at the epoch's last boundary runs after the drain call
    # that trained the held batch (C17), so it finds every consumed batch trained.
    module = _counting_consumed(pipeline)()
    trainer = make_trainer(
        design, val_check_interval=interval, check_val_every_n_epoch=None, limit_val_batches=1, max_epochs=2
    )
    trainer.fit(module, make_loader(kind, n_items=10), make_loader("sized", n_items=2))
    points = expected_validations((2, 1, 1, 1), 5, interval, epochs=2, across_epochs=True)
    expected = [(epoch, consumed, consumed if consumed == 5 else consumed - 1) for epoch, consumed in points]
    assert module.record.validations == expected, "(epoch, batches consumed, batches trained) at each validation"


@pytest.mark.parametrize("kind", KINDS)
def test_check_val_every_n_epoch_validates_at_epoch_end(design, kind):
    module = IterStepModule((2,))
    trainer = make_trainer(design, check_val_every_n_epoch=2, limit_val_batches=1, max_epochs=4)
    trainer.fit(module, make_loader(kind, n_items=16), make_loader("sized", n_items=2))
    assert module.record.validations == [(1, 8), (3, 8)]


class _ReadLog:
    """Records every item index a dataset is asked for, sized (``__getitem__``) or unsized (``__iter__``)."""

    def __init__(self) -> None:
        self.read: list[int] = []


class _LoggedSized(SizedItems):
    def __init__(self, n: int, log: _ReadLog) -> None:
        super().__init__(n)
        self.log = log

    def __getitem__(self, i: int):
        self.log.read.append(i)
        return super().__getitem__(i)


class _LoggedUnsized(UnsizedItems):
    def __init__(self, n: int, log: _ReadLog) -> None:
        super().__init__(n)
        self.log = log

    def __iter__(self):
        for entry in super().__iter__():
            self.log.read.append(entry[0])
            yield entry


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("limit", [1, 2, 5])
def test_limit_bounds_what_is_read_not_only_what_is_trained(design, kind, limit):
    # A streaming source consumes what is read: an item past the limit must not even be asked for (no workers
    # here: a DataLoader's own worker prefetching reads ahead whatever the design does).
    log = _ReadLog()
    dataset = {"sized": _LoggedSized, "unsized": _LoggedUnsized}[kind](14, log)
    make_trainer(design, limit_train_batches=limit).fit(
        IterStepModule((1,)), DataLoader(dataset, batch_size=BATCH_SIZE)
    )
    past = sorted({i for i in log.read if i >= limit * BATCH_SIZE})
    assert not past, f"limit_train_batches={limit} ({limit * BATCH_SIZE} items), yet items {past} were read"
