"""What the conformance suite cannot see in the prefetcher design: the queue itself, the bound, the thread's life,
the loader state recorded for the consumed batches, and that loading overlaps the step."""

from __future__ import annotations

import gc
import signal
import threading
import time
import traceback
from typing import NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from prototypes import DESIGNS
from prototypes.prefetcher import prefetch_thread
from prototypes.prefetcher.prefetch_thread import AUTO, PrefetchThread
from tests.conformance.harness import (
    Crash,
    CrashingModule,
    IterStepModule,
    SizedItems,
    ids,
    item,
    make_loader,
    make_trainer,
)

PREFETCHER = DESIGNS["prefetcher"]
DEPTHS = [0, 1, 2, 4, AUTO]


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("prefetcher")]


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


class Counting:
    """``produce`` for the queue: yields 0, 1, 2, ... up to ``n`` and records how many it produced."""

    def __init__(self, n: int, fail_at: int | None = None, delay: float = 0.0) -> None:
        self.n, self.fail_at, self.delay = n, fail_at, delay
        self.produced = 0
        self.entered = threading.Event()  # set once the first produce call has begun

    def __call__(self) -> int:
        self.entered.set()
        if self.produced == self.fail_at:
            raise OddError(self.produced, "broken item")
        if self.produced >= self.n:
            raise StopIteration
        time.sleep(self.delay)
        self.produced += 1
        return self.produced - 1


class OddError(Exception):
    """An exception whose constructor takes two arguments: re-creating it (as ExceptionWrapper does) would fail."""

    def __init__(self, index: int, what: str) -> None:
        super().__init__(f"{what} at {index}")
        self.index = index


def drain(thread: PrefetchThread, turn_s: float = 0.0) -> list:
    """Every result until the end, released one by one; the consumer works ``turn_s`` seconds per result."""
    out = []
    while True:
        try:
            out.append(thread.get())
        except StopIteration:
            return out
        thread.release()
        if turn_s:
            time.sleep(turn_s)


# ------------------------------------------------------------------------------------------------ the queue
@pytest.mark.timeout(20)
@pytest.mark.parametrize("depth", DEPTHS)
def test_queue_hands_out_everything_in_order_then_keeps_raising_stop_iteration(depth):
    thread = PrefetchThread(Counting(50), depth)
    assert drain(thread) == list(range(50))
    with pytest.raises(StopIteration):
        thread.get()
    thread.shutdown()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_queue_never_runs_more_than_depth_ahead_of_releases(depth):
    released = 0
    ahead_at_each_call: list[int] = []  # items produced and not yet released, whenever another is about to be made

    class Watched(Counting):
        def __call__(self) -> int:
            ahead_at_each_call.append(self.produced - released)
            return super().__call__()

    source = Watched(30)
    thread = PrefetchThread(source, depth)
    thread.start()
    assert wait_until(lambda: source.produced == depth), f"produced {source.produced} before any release"
    while True:
        try:
            thread.get()
        except StopIteration:
            break
        released += 1  # counted before the release, so the producer never sees a release the count lacks
        thread.release()
    thread.shutdown()
    assert source.produced == 30
    # a bounded producer starts item k + depth only after k releases; an unbounded one would run far ahead
    assert max(ahead_at_each_call) < depth, ahead_at_each_call


def test_depth_zero_starts_no_thread_and_produces_on_demand():
    source = Counting(3)
    thread = PrefetchThread(source, 0)
    assert source.produced == 0 and not prefetch_threads()
    assert thread.get() == 0 and source.produced == 1
    assert not prefetch_threads()


@pytest.mark.timeout(20)
@pytest.mark.parametrize("depth", DEPTHS)
def test_an_error_reaches_the_consumer_as_the_same_object_with_its_traceback(depth):
    thread = PrefetchThread(Counting(10, fail_at=3), depth)
    got = []
    with pytest.raises(OddError) as raised:
        while True:
            got.append(thread.get())
            thread.release()
    assert got == [0, 1, 2], "items before the failure arrive first"
    assert raised.value.index == 3
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "__call__" in frames, f"the producer's frame is missing from the traceback: {frames}"
    with pytest.raises(StopIteration):  # afterwards the queue is finished, not hanging
        thread.get()
    assert wait_until(lambda: not prefetch_threads())


@pytest.mark.timeout(20)
def test_shutdown_of_a_blocked_producer_returns_and_is_idempotent():
    thread = PrefetchThread(Counting(1000), 2)
    assert thread.get() == 0  # the consumer stops early: the producer is blocked on a full queue
    started = time.monotonic()
    thread.shutdown()
    thread.shutdown()
    assert time.monotonic() - started < 2.0
    assert not prefetch_threads()


@pytest.mark.timeout(20)
def test_shutdown_waits_for_a_produce_call_in_progress():
    source = Counting(1000, delay=0.3)
    thread = PrefetchThread(source, 2)
    thread.start()
    assert source.entered.wait(timeout=10), "the producer never started"  # it is inside the first (slow) call
    thread.shutdown()
    assert not prefetch_threads(), "shutdown returned while the thread was still running"
    assert source.produced == 1




@pytest.mark.timeout(20)
def test_auto_drops_the_thread_when_loading_is_too_cheap_to_hide_and_loses_nothing():
    thread = PrefetchThread(Counting(40), AUTO)
    assert drain(thread, 0.002) == list(range(40))  # every item once, in order, across the switch
    assert not thread.threaded and not prefetch_threads()


@pytest.mark.timeout(20)
def test_auto_drops_the_thread_when_the_consumer_is_too_quick_for_an_overlap_to_pay():
    thread = PrefetchThread(Counting(30, delay=0.003), AUTO)
    assert drain(thread, 0.0) == list(range(30))
    assert not thread.threaded


@pytest.mark.timeout(20)
def test_auto_keeps_the_thread_when_loading_and_consuming_both_take_time():
    source = Counting(20, delay=0.003)
    thread = PrefetchThread(source, AUTO)
    assert drain(thread, 0.003) == list(range(20))
    assert thread.threaded
    thread.shutdown()
    assert not prefetch_threads()


@pytest.mark.timeout(20)
def test_auto_switching_keeps_an_error_of_a_later_item_for_its_turn():
    thread = PrefetchThread(Counting(40, fail_at=prefetch_thread.AUTO_PROBE_BATCHES + 2), AUTO)
    with pytest.raises(OddError) as raised:
        drain(thread, 0.0)
    assert raised.value.index == prefetch_thread.AUTO_PROBE_BATCHES + 2
    assert wait_until(lambda: not prefetch_threads())


def test_bad_depth_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="'auto'"):
        PrefetchThread(Counting(1), "fast")
    with pytest.raises(ValueError, match="int >= 0"):
        PrefetchThread(Counting(1), -1)
    with pytest.raises(ValueError, match="depth"):
        PREFETCHER.variant(depth=-2).trainer()


# ------------------------------------------------------------------------------------------------ in a Trainer
def quiet_trainer(depth: int, **kwargs):
    return make_trainer(PREFETCHER.variant(depth=depth), **kwargs)


class DatasetError(Exception):
    """A plain one-argument exception: DataLoader workers can re-create it in the main process."""


class FailingSizedItems(SizedItems):
    def __init__(self, n: int, fail_at: int) -> None:
        super().__init__(n)
        self.fail_at = fail_at

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise DatasetError(f"dataset failed at item {i}")
        return super().__getitem__(i)


class StepFails(IterStepModule):
    def training_step(self, dataloader_iter):
        if self.step_calls == 2:
            raise OddError(2, "step failed")
        return super().training_step(dataloader_iter)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize(
    "stop",
    ["end", "max_steps", "minus_one", "step_raises", "dataset_raises", "loader_worker_raises", "keyboard_interrupt"],
)
def test_no_prefetch_thread_outlives_the_run(depth, stop, monkeypatch):
    # Why: torch 2.13 joins each worker of an iterator whose worker raised for its whole status-check interval (5 s)
    # before it terminates it, with or without Lightning; the check here is about threads, so the join is shortened
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)
    before = set(threading.enumerate())
    module, loader, kwargs = IterStepModule((1,)), make_loader(n_items=16), {}
    if stop == "max_steps":
        kwargs = {"max_steps": 2}
    elif stop == "minus_one":
        module = IterStepModule((1,), stop_epoch_at_step=2)
    elif stop == "step_raises":
        module = StepFails((1,))
    elif stop in ("dataset_raises", "loader_worker_raises"):
        workers = 2 if stop == "loader_worker_raises" else 0
        loader = DataLoader(FailingSizedItems(16, fail_at=9), batch_size=2, num_workers=workers)
    elif stop == "keyboard_interrupt":
        module = Interrupting((1,))
    trainer = quiet_trainer(depth, max_epochs=2, **kwargs)
    expected = {"step_raises": OddError, "dataset_raises": DatasetError, "loader_worker_raises": DatasetError,
                "keyboard_interrupt": SystemExit}.get(stop)  # Lightning's interrupt path tears down, then exits
    handler = signal.getsignal(signal.SIGINT)  # Lightning ignores SIGINT after a KeyboardInterrupt
    try:
        trainer.fit(module, loader)
    except BaseException as error:
        if expected is None or not isinstance(error, expected):
            raise
    else:
        assert expected is None, f"fit returned although the run should raise {expected.__name__}"
        assert module.record.received, "the run consumed nothing: the check below would prove nothing"
    finally:
        signal.signal(signal.SIGINT, handler)
    # Why collect: the exception's traceback holds the DataLoader iterator (and its worker queues) until freed.
    gc.collect()
    assert wait_until(lambda: set(threading.enumerate()) <= before), (
        f"left running: {set(threading.enumerate()) - before}"
    )


class Interrupting(IterStepModule):
    def training_step(self, dataloader_iter):
        if self.step_calls == 3:
            raise KeyboardInterrupt
        return super().training_step(dataloader_iter)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [0, 2])
def test_a_dataset_error_keeps_its_type_and_traceback_and_the_trainer_can_run_again(depth):
    module = IterStepModule((1,))
    trainer = quiet_trainer(depth)
    with pytest.raises(DatasetError) as raised:
        trainer.fit(module, DataLoader(FailingSizedItems(16, fail_at=9), batch_size=2))
    frames = [frame.name for frame in traceback.extract_tb(raised.value.__traceback__)]
    assert "__getitem__" in frames, frames
    assert [b for b in module.record.received] == [(0, 1), (2, 3), (4, 5), (6, 7)], "batches before the failure"
    again = IterStepModule((1,))
    quiet_trainer(depth).fit(again, make_loader(n_items=16))
    assert len(again.record.received) == 8


# ------------------------------------------------------------------------------------------------ loader state
class RecordsState(IterStepModule):
    """Records, after each next(), the loader state a checkpoint would record and the loader's live state.

    With ``wait_for_look_ahead`` each step first waits until the loader has yielded a batch the step has not
    consumed yet (while batches remain), so the recorded state is taken while the producer is ahead.
    """

    def __init__(self, pattern, n_batches: int, wait_for_look_ahead: bool) -> None:
        super().__init__(pattern)
        self.n_batches, self.wait_for_look_ahead = n_batches, wait_for_look_ahead
        self.recorded: list[int] = []
        self.live: list[int] = []

    def training_step(self, dataloader_iter):
        out = super().training_step(dataloader_iter)
        fit_loop = self.trainer.fit_loop

        def live() -> int:
            return fit_loop._combined_loader.flattened[0].state_dict()["_num_yielded"]

        consumed = len(self.record.received)
        if self.wait_for_look_ahead and consumed < self.n_batches:
            assert wait_until(lambda: live() > consumed), f"the loader never ran ahead of batch {consumed}"
        self.recorded.append(fit_loop.on_save_checkpoint()["combined_loader"][0]["_num_yielded"])
        self.live.append(live())
        return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", DEPTHS)
def test_checkpointed_loader_state_matches_the_consumed_batches(depth):
    runs_ahead = depth not in (0, AUTO)  # "auto" may drop its thread once it has timed a few batches
    module = RecordsState((1, 2), n_batches=10, wait_for_look_ahead=runs_ahead)
    quiet_trainer(depth).fit(module, StatefulDataLoader(SizedItems(20), batch_size=2))
    consumed = [sum(len(s) for s in module.record.steps[: k + 1]) for k in range(len(module.record.steps))]
    assert module.recorded == consumed
    if runs_ahead:
        # the loader itself ran ahead: without the per-batch snapshot the checkpoint would skip batches
        assert any(live > done for live, done in zip(module.live, consumed, strict=True)), (module.live, consumed)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [1, 4])
def test_resumed_run_redelivers_prefetched_but_unconsumed_batches(depth, tmp_path):
    from pytorch_lightning.callbacks import ModelCheckpoint

    def trainer():
        checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_last=True, save_top_k=-1)
        return quiet_trainer(depth, enable_checkpointing=True, callbacks=[checkpoint])

    def loader():
        return StatefulDataLoader(SizedItems(24), batch_size=2)

    # checkpoint after step call 2 (4 batches), crash before consuming in call 3
    first = CrashingModule((2,), crash_at=3)
    with pytest.raises(Crash):
        trainer().fit(first, loader())
    assert first.record.received == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11)]
    resumed = CrashingModule((2,), crash_at=None)
    trainer().fit(resumed, loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    # batches 4..5 were consumed after the checkpoint and 6.. were prefetched: all are owed again, in order
    assert resumed.record.received == [tuple(range(i, i + 2)) for i in range(8, 24, 2)]
    assert [index for _, index, _ in (b for s in resumed.record.steps for b in s)] == list(range(4, 12))


class CountingItems(SizedItems):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.read: list[int] = []

    def __getitem__(self, i: int):
        self.read.append(i)
        return super().__getitem__(i)


@pytest.mark.parametrize("depth", DEPTHS)
def test_a_limit_stops_the_producer_at_it(depth):
    dataset = CountingItems(40)
    module = IterStepModule((1,))
    quiet_trainer(depth, limit_train_batches=3).fit(module, DataLoader(dataset, batch_size=2))
    assert module.record.received == [(0, 1), (2, 3), (4, 5)]
    # a producer blind to the limit reads up to depth batches past it; a limit must bound what is read (C7)
    assert sorted(dataset.read) == list(range(6))


# ------------------------------------------------------------------------------------------------ threads and hooks
class RecordsThreads(IterStepModule):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.transfer_threads: set[str] = set()

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.transfer_threads.add(threading.current_thread().name)
        return batch


@pytest.mark.parametrize(
    "options,where",
    [({"depth": 0}, "MainThread"), ({"depth": 2}, "prefetcher-training_step"),
     ({"depth": 2, "transfer_ahead": False}, "MainThread")],
    ids=["depth0", "ahead", "transfer-on-main"],
)
def test_transfer_hooks_run_where_the_options_say(options, where):
    module = RecordsThreads((1,))
    make_trainer(PREFETCHER.variant(**options)).fit(module, make_loader(n_items=8))
    assert module.transfer_threads == {where}


def test_regular_flavour_keeps_lightnings_own_fetcher():
    from pytorch_lightning.loops.fetchers import _PrefetchDataFetcher

    from tests.conformance.harness import RegularStepModule

    seen = []

    class Regular(RegularStepModule):
        def on_train_batch_start(self, batch, batch_idx):
            seen.append(type(self.trainer.fit_loop._data_fetcher))
            return super().on_train_batch_start(batch, batch_idx)

    make_trainer(PREFETCHER).fit(Regular(), make_loader(n_items=4))
    assert seen and all(kind is _PrefetchDataFetcher for kind in seen)


# ------------------------------------------------------------------------------------------------ overlap
# A batch is handed out once the one after it is loaded (to know whether it is the last: ``done``), so a loader
# that only ever loads inside ``next()`` still loads one batch ahead; overlap means loading further than that.
AHEAD = 2


class LoadsNeedARunningStep(Dataset):
    """Item ``i`` (``i >= AHEAD``) can only be loaded while step ``i - AHEAD`` runs (after its ``next()``): a loader
    that does not run alongside the step cannot produce it, and its load is recorded as waited in vain."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.step_running = [threading.Event() for _ in range(n)]
        self.loaded = [threading.Event() for _ in range(n)]
        self.waited_in_vain: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i >= AHEAD and not self.step_running[i - AHEAD].wait(timeout=10):
            self.waited_in_vain.append(i)
        self.loaded[i].set()
        return item(i)


class WaitsForALoadAhead(IterStepModule):
    """Step ``k`` takes batch ``k``, says it is running, then waits for batch ``k + AHEAD`` to be loaded."""

    def __init__(self, dataset: LoadsNeedARunningStep) -> None:
        super().__init__((1,))
        self.dataset = dataset
        self.loaded_while_running: list[bool] = []

    def training_step(self, dataloader_iter):
        out = super().training_step(dataloader_iter)
        k = len(self.record.received) - 1
        self.dataset.step_running[k].set()
        if k + AHEAD < self.dataset.n:
            self.loaded_while_running.append(self.dataset.loaded[k + AHEAD].wait(timeout=10))
        return out


@pytest.mark.timeout(60)
def test_loading_overlaps_the_step():
    # No clock: each batch from the third on can only be loaded while the step two batches earlier runs, and each
    # step waits for that load. Only a loader running alongside the step satisfies both without timing out.
    n = 6
    dataset = LoadsNeedARunningStep(n)
    module = WaitsForALoadAhead(dataset)
    quiet_trainer(2).fit(module, DataLoader(dataset, batch_size=1))
    assert module.record.received == [(i,) for i in range(n)]
    assert not dataset.waited_in_vain, f"items {dataset.waited_in_vain} were loaded only after their step had ended"
    assert module.loaded_while_running == [True] * (n - AHEAD), module.loaded_while_running


class Copy(NamedTuple):
    """One batch's copy to the device, as ``transfer_batch_to_device`` saw it."""

    thread: str
    stream: torch.cuda.Stream | None  # the CUDA stream current on that thread: the copy is issued on it
    pinned: bool  # the host batch was in pinned memory (without it a CUDA copy is synchronous)


class RecordsCopyStreams(IterStepModule):
    """Records where each batch is copied to the device and which CUDA stream each step call computes on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.copies: list[Copy] = []
        self.step_streams: list[torch.cuda.Stream] = []

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        # Lightning's copy below is non_blocking: it is only enqueued, on the stream current here
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.copies.append(Copy(threading.current_thread().name, stream, batch[1].is_pinned()))
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, dataloader_iter):
        if self.device.type == "cuda":
            self.step_streams.append(torch.cuda.current_stream(self.device))
        return super().training_step(dataloader_iter)


def test_off_cuda_the_prefetch_thread_copies_without_pinning():
    # Why: pinning (and the side stream it goes with) serves CUDA copies only; on the CPU it would cost page-locked
    # memory, and without an accelerator it fails
    module = RecordsCopyStreams((2,))
    make_trainer(PREFETCHER.variant(depth=2), max_epochs=2).fit(module, make_loader(n_items=8, num_workers=2))
    assert [(copy.thread, copy.pinned) for copy in module.copies] == [("prefetcher-training_step", False)] * 8
    assert module.record.received == [tuple(range(i, i + 2)) for i in range(0, 8, 2)] * 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side-stream path needs CUDA")
@pytest.mark.parametrize(
    "options,side_stream",
    [({"depth": 2}, True), ({"depth": AUTO}, True), ({"depth": 0}, False),
     ({"depth": 2, "transfer_ahead": False}, False)],
    ids=["ahead", "auto", "depth0", "transfer-on-main"],
)
def test_cuda_copies_run_on_one_side_stream_when_transferred_ahead(options, side_stream):
    module = RecordsCopyStreams((2,))
    trainer = make_trainer(PREFETCHER.variant(**options), accelerator="cuda", max_epochs=2)
    trainer.fit(module, make_loader(n_items=32, num_workers=2))
    assert module.record.received == [tuple(range(i, i + 2)) for i in range(0, 32, 2)] * 2
    assert module.record.placements and all(device.type == "cuda" for device, _ in module.record.placements)
    assert len(module.copies) == 32, module.copies  # 16 batches per epoch, each copied once
    copy_streams, step_streams = {copy.stream for copy in module.copies}, set(module.step_streams)
    if side_stream:
        # one stream for the whole fit (a stream per epoch strands the allocator's blocks), copies from pinned memory
        assert len(copy_streams) == 1, copy_streams
        (stream,) = copy_streams
        assert stream != torch.cuda.default_stream(trainer.strategy.root_device), "the copies ran on the default stream"
        assert stream not in step_streams, f"the copies ran on the step's stream {stream}"
        assert all(copy.pinned for copy in module.copies), module.copies
    else:
        assert copy_streams == step_streams and len(step_streams) == 1, (copy_streams, step_streams)


# ------------------------------------------------------------------------------------------------ evaluation
class EvalThreads(RecordsThreads):
    """Evaluation steps take one batch per call; records the prefetch threads alive after each evaluation run."""

    def __init__(self) -> None:
        super().__init__((1,))
        self.alive_after_run: list[tuple[str, list[str], bool]] = []  # (loop, prefetch threads, producer stopped)
        self.predictions_per_call: list[list[int]] = []

    def _eval_step(self, dataloader_iter):
        batch, _, _ = next(dataloader_iter)
        return batch[0]

    validation_step = test_step = _eval_step

    def predict_step(self, dataloader_iter):
        ids_ = []
        for _ in range(3):
            ids_ += ids(next(dataloader_iter)[0])
        self.predictions_per_call.append(ids_)  # the cut-short last call appends nothing: next() raised first
        return ids_


def recording_runs(module: EvalThreads, trainer) -> None:
    """Wrap each evaluation loop's ``run`` to record the prefetch threads still alive when it returns, and whether
    its fetcher stopped producing (deterministic: a producer that reached the data's end exits by itself soon)."""
    for name, loop in [("validate", trainer.validate_loop), ("test", trainer.test_loop),
                       ("predict", trainer.predict_loop), ("fit", trainer.fit_loop.epoch_loop.val_loop)]:
        def run(loop=loop, run=loop.run, name=name):
            try:
                return run()
            finally:
                stopped = loop._data_fetcher is None or loop._data_fetcher.prefetch_thread is None
                module.alive_after_run.append((name, [t.name for t in prefetch_threads()], stopped))
        loop.run = run


@pytest.mark.timeout(60)
@pytest.mark.parametrize("depth", [1, 4])
def test_no_evaluation_prefetch_thread_outlives_its_run(depth):
    module = EvalThreads()
    trainer = quiet_trainer(depth, max_epochs=2, num_sanity_val_steps=2)
    recording_runs(module, trainer)
    trainer.fit(module, make_loader(n_items=8), [make_loader(n_items=8), make_loader(n_items=6)])
    for stage in ("validate", "test"):
        getattr(trainer, stage)(module, make_loader(n_items=8), verbose=False)
    trainer.predict(module, make_loader(n_items=8))
    # the sanity check and two epochs' validation during fit, then validate, test and predict
    assert [name for name, *_ in module.alive_after_run] == ["fit"] * 3 + ["validate", "test", "predict"]
    for name, alive, stopped in module.alive_after_run:
        assert not [t for t in alive if not t.endswith("training_step")], f"{name}: left running after it: {alive}"
        assert stopped, f"{name}: the evaluation run returned without stopping its prefetcher"
    assert {"prefetcher-validation_step", "prefetcher-test_step", "prefetcher-predict_step"} <= module.transfer_threads
    assert wait_until(lambda: not prefetch_threads())


def test_a_predict_call_cut_short_by_stop_iteration_stores_no_prediction():
    module = EvalThreads()
    predictions = make_trainer(PREFETCHER).predict(module, make_loader(n_items=14))  # 7 batches, 3 per call
    assert predictions == module.predictions_per_call == [list(range(6)), list(range(6, 12))]


class StrayStopInValidation(EvalThreads):
    def validation_step(self, dataloader_iter):
        next(dataloader_iter)
        next(iter(()))


class IteratorKeptPastValidationRun(EvalThreads):
    def validation_step(self, dataloader_iter):
        self.kept = dataloader_iter
        return next(dataloader_iter)[0][0]

    def on_validation_end(self):
        next(self.kept)  # the run's loop over its dataloader has ended (C14 a)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("stage", ["validate", "fit"])
@pytest.mark.parametrize(
    "module_class,message",
    [
        (StrayStopInValidation, "validation_step raised StopIteration"),
        (IteratorKeptPastValidationRun, "after the loop over its dataloader ended"),
    ],
)
def test_evaluation_misuse_is_an_error_and_leaves_no_thread(module_class, message, stage):
    trainer, module, loader = quiet_trainer(4), module_class(), make_loader(n_items=32)  # the thread is blocked
    with pytest.raises(RuntimeError, match=message):
        if stage == "fit":
            trainer.fit(module, make_loader(n_items=4), loader)
        else:
            trainer.validate(module, loader, verbose=False)
    assert wait_until(lambda: not prefetch_threads())


class SlowTransfer(EvalThreads):
    def on_before_batch_transfer(self, batch, dataloader_idx):
        time.sleep(0.01)  # long enough for the training and the validation thread to be in this hook at once
        return super().on_before_batch_transfer(batch, dataloader_idx)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("profiler_name", ["simple", "advanced"])
def test_transfer_hooks_are_profiled_on_two_prefetch_threads_at_once(profiler_name, tmp_path):
    # the training epoch's thread keeps transferring ahead while each validation run's thread transfers its batches;
    # a profiler started twice for one action raises (SimpleProfiler), so the design serialises the transfer actions
    from pytorch_lightning.profilers import AdvancedProfiler, SimpleProfiler

    profiler = {"simple": SimpleProfiler, "advanced": AdvancedProfiler}[profiler_name](dirpath=tmp_path, filename="p")
    module = SlowTransfer()
    trainer = make_trainer(PREFETCHER.variant(depth=4), profiler=profiler, val_check_interval=2)
    trainer.fit(module, make_loader(n_items=16), make_loader(n_items=6))
    assert module.transfer_threads == {"prefetcher-training_step", "prefetcher-validation_step"}
    if profiler_name == "simple":
        # 8 training batches, and 4 validation runs of 3 batches
        transfers = profiler.recorded_durations["[LightningModule]SlowTransfer.on_before_batch_transfer"]
        assert len(transfers) == 8 + 4 * 3


# ------------------------------------------------------------------------------------------ the DDP end-of-data vote
def _record_votes(directory):
    """Wraps ``torch.distributed.all_reduce`` (the real one still runs) so each call made from the designs' code is
    recorded with the function that asked for it (``gradients`` for DDP's gradient all-reduce a vote rides in), one
    line per call, in a file per rank process: the forked ranks inherit the wrapper."""
    import os
    import sys

    real = torch.distributed.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        frame = sys._getframe(1)
        if frame.f_globals.get("__name__", "").startswith("prototypes"):
            asker = "gradients" if frame.f_code.co_name == "hook" else None  # `VoteInGradients.hook`, in a backward
            while frame.f_globals["__name__"] == "prototypes.ranks":
                frame = frame.f_back  # the caller of the vote (`vote`, `start_vote`, `every_rank_has_a_batch`)
            with open(directory / f"all-reduce-{os.getpid()}.txt", "a") as calls:
                calls.write(f"{asker or frame.f_code.co_name}\n")
        return real(tensor, *args, **kwargs)

    return all_reduce


def _votes(directory) -> list[list[str]]:
    """Per rank process: who asked for each vote, in order."""
    return [path.read_text().splitlines() for path in sorted(directory.glob("all-reduce-*.txt"))]


@pytest.mark.timeout(120)
def test_ranks_vote_before_every_step_call_whatever_their_loaders(tmp_path, monkeypatch):
    """Under 2-rank gloo DDP every rank votes once at the epoch's start and once after each step call (between the
    calls, C16: flags saying whether the data goes on and whether to drain, riding in DDP's gradient all-reduce of
    the call's backward), loaders behind a DistributedSampler included: equal shards end the ranks together only if
    their calls take equal numbers of batches, which no rank can see. A simple step pulls nothing ahead, so no drain
    call follows (C17)."""
    from tests.conformance import ddp

    monkeypatch.setattr(torch.distributed, "all_reduce", _record_votes(tmp_path))
    fits = [("injected", (1,)), ("explicit", (2,)), ("uneven", (1,))]
    runs = ddp.launch(PREFETCHER, [fits])
    calls = []
    for run in runs.values():
        outcomes = ddp.require_all_reported(run)
        assert all(outcome["error"] is None for outcome in outcomes), ddp.summary(run)
        assert outcomes[0]["step_calls"] == outcomes[1]["step_calls"], ddp.summary(run)
        calls.append(outcomes[0]["step_calls"])
    per_fit = [["start_vote"] + ["gradients"] * n for n in calls]  # at the epoch's start, then in each backward
    assert _votes(tmp_path) == [sum(per_fit, [])] * ddp.WORLD, _votes(tmp_path)
