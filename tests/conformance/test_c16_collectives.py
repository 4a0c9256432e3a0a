"""C16 Distributed, what it costs: under DDP a step call communicates no more than stock Lightning's regular flavour
does per batch, and gradient accumulation keeps DDP's gradient all-reduce to once per window.

Two CPU ranks on gloo (``tests/conformance/ddp.py``), each fit counted in its rank's process
(``tests/conformance/collectives.py``). Stock Lightning's regular flavour is the reference, measured in the same
launch: before every batch it broadcasts rank 0's SIGTERM flag (one collective, one host read), and with
``accumulate_grad_batches=n`` its backward all-reduces the gradients only in the call that closes a window.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader

from prototypes import DESIGNS
from tests.conformance.collectives import CommunicationCount
from tests.conformance.ddp import PG_TIMEOUT_S, WORLD, describe_error, launch, received_batches, summary
from tests.conformance.harness import (
    BATCH_SIZE,
    FEATURES,
    LR,
    QUIET,
    IterStepModule,
    RegularStepModule,
    SizedItems,
    collate_items,
    item,
)
from tests.conformance.pipelining import AsyncHandleModule

pytestmark = pytest.mark.clause("C16")

ITEMS = 24  # Lightning's injected DistributedSampler gives each rank 12 items: 6 batches of 2
DEADLINE_S = 120  # a launch runs its fits one after another; a passing one takes a few seconds
TIMEOUT_S = DEADLINE_S + 30

# (per call, accumulate_grad_batches): the epoch's 6 batches in calls of 1 or 2, windows of 1, 2 and 4 calls; with 4
# the data ends a window early (6 calls: 4 + 2; 3 calls: one window of 3)
ACCUMULATION = [(per_call, accumulate) for per_call in (1, 2) for accumulate in (1, 2, 4)]
# a step taking 1, then 2, then 1... batches per call, in one window: its last call ends the data unforeseen (the
# look-ahead before it expected one batch), so the window's gradients are averaged once after it
UNFORESEEN_END = ((1, 2), 8)


class CountedAsyncHandleModule(AsyncHandleModule):
    """Lightning's async-handle pattern (it trains batch i while it holds i+1), counting its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = self.drain_calls = 0

    def training_step(self, dataloader_iter):
        self.calls += 1
        self.drain_calls += dataloader_iter.done  # a drain call finds the data ended on entry (C17)
        return super().training_step(dataloader_iter)


class LossWithoutParametersModule(IterStepModule):
    """Returns a loss no parameter contributes to: its backward runs, and DDP has no gradient to all-reduce."""

    def training_step(self, dataloader_iter):
        super().training_step(dataloader_iter)
        return torch.ones((), requires_grad=True)


def _module(kind: str, pattern: tuple[int, ...]):
    if kind.endswith("loss-without-parameters"):
        return LossWithoutParametersModule(pattern)
    if "regular" in kind:
        return RegularStepModule()
    if kind.endswith("async-handle"):
        return CountedAsyncHandleModule()
    return IterStepModule(pattern[:-1] if kind.endswith("accumulate") else pattern)


def _fit_counted(design, rank: int, kind: str, pattern: tuple[int, ...]) -> dict[str, Any]:
    """One fit, counted: ``kind`` names the step (``regular``, ``flavour``, ``async-handle``, ``accumulate``; a
    ``stock-`` prefix runs it on stock Lightning), ``pattern`` its batches per call and, last for ``accumulate``,
    ``accumulate_grad_batches`` (a regular step's batch then holds a call's batches: the same items, one batch)."""
    design = DESIGNS["upstream"] if kind.startswith("stock-") else design
    accumulating, regular = kind.endswith("accumulate"), "regular" in kind
    accumulate = pattern[-1] if accumulating else 1
    per_batch = BATCH_SIZE * (pattern[0] if accumulating and regular else 1)
    module, error, trainer = _module(kind, pattern), None, None
    counted = CommunicationCount(comm_hook=not kind.startswith("carried-"))
    with counted.installed():
        try:
            strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
            trainer = design.trainer(**{**QUIET, "accelerator": "cpu", "devices": WORLD, "strategy": strategy,
                                        "callbacks": [counted], "accumulate_grad_batches": accumulate})
            trainer.fit(module, train_dataloaders=DataLoader(SizedItems(ITEMS), batch_size=per_batch))
        except BaseException as raised:  # noqa: BLE001 - every outcome is reported to the test process
            error = describe_error(raised)
    drain_calls = getattr(module, "drain_calls", module.record.drain_calls)
    calls = getattr(module, "calls", module.step_calls + drain_calls)
    return dict(
        counted.as_dict(), error=error, calls=calls, drain_calls=drain_calls,
        batches=sum(map(len, module.record.steps)),
        steps=[[list(ids_), batch_idx, dl_idx] for step in module.record.steps for ids_, batch_idx, dl_idx in step],
        per_step=[len(step) for step in module.record.steps],
        optimizer_steps=sum(getattr(o, "steps_taken", 0) for o in (trainer.optimizers if trainer else [])),
        weights={k: v.tolist() for k, v in module.layer.state_dict().items()},
        initial={k: v.tolist() for k, v in module.initial_state.items()},
    )


COUNT_RUNS = [("regular", ()), ("flavour", (1,)), ("flavour", (2,)), ("async-handle", ())]
LOSS_WITHOUT_PARAMETERS_RUN = ("carried-loss-without-parameters", (1,))
ACCUMULATION_RUNS = [("accumulate", (per_call, accumulate)) for per_call, accumulate in ACCUMULATION]
UNFORESEEN_END_RUN = ("accumulate", (*UNFORESEEN_END[0], UNFORESEEN_END[1]))
STOCK_RUNS = [("stock-regular", ())] + [("stock-regular-accumulate", run) for _, run in ACCUMULATION_RUNS]
_LAUNCHES: dict[str, dict] = {}


def _outcome(design, kind: str, pattern: tuple[int, ...]) -> dict:
    """The ranks' outcomes of one counted fit: the design's fits in one launch per design, stock's in one launch."""
    key = "stock" if kind.startswith("stock-") else design.id
    if key not in _LAUNCHES:
        runs = STOCK_RUNS if key == "stock" else [*COUNT_RUNS, *ACCUMULATION_RUNS, UNFORESEEN_END_RUN,
                                                   LOSS_WITHOUT_PARAMETERS_RUN]
        _LAUNCHES[key] = launch(design, [runs], fit=_fit_counted, deadline_s=DEADLINE_S)
    run = _LAUNCHES[key][kind, pattern]
    if run["hung"] or any(outcome is None for outcome in run["ranks"]):
        pytest.fail("a rank did not finish its fit:\n" + summary(run), pytrace=False)
    failed = [rank for rank, outcome in enumerate(run["ranks"]) if outcome["error"] is not None]
    assert not failed, f"fit raised on rank(s) {failed}:\n" + summary(run)
    return run["ranks"]


def _stock_regular(rank: int) -> dict:
    stock = _outcome(None, "stock-regular", ())[rank]
    # the instrument sees stock's per-batch broadcast: one collective and one host read per batch
    assert stock["total"] == stock["host_reads"] == stock["batches"] == ITEMS // WORLD // BATCH_SIZE, stock
    return stock


@pytest.mark.timeout(TIMEOUT_S)
def test_the_regular_flavour_communicates_as_stock_does(design):
    for rank, outcome in enumerate(_outcome(design, "regular", ())):
        stock = _stock_regular(rank)
        counted = {key: outcome[key] for key in ("collectives", "host_reads", "gradient_buckets")}
        assert counted == {key: stock[key] for key in counted}, (
            f"rank {rank}: the regular flavour's epoch under DDP communicated {counted}; stock Lightning's,"
            f" over the same {stock['batches']} batches: { {key: stock[key] for key in counted} }"
        )


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("kind, pattern", COUNT_RUNS[1:], ids=["1-per-call", "2-per-call", "async-handle"])
def test_a_step_call_costs_no_collective_beyond_stocks_per_batch_one(design, kind, pattern, record_property):
    """Per step call, drain calls included, at most the one collective and host read stock Lightning makes before
    every batch, plus one per epoch: the vote after the last call, where the ranks agree that the data ended (stock's
    regular flavour needs none there: each rank knows its loader's end, and a rank whose shard is longer hangs). The
    counts, per rank, go to the results for the RFC (``rfc/rendering/collective_counts.py``)."""
    outcomes = _outcome(design, kind, pattern)
    stock = [_stock_regular(rank) for rank in range(len(outcomes))]
    for key in ("calls", "drain_calls", "total", "host_reads"):
        record_property(key, [outcome[key] for outcome in outcomes])
    for key in ("batches", "total", "host_reads"):
        record_property(f"stock_{key}", [counted[key] for counted in stock])
    for rank, outcome in enumerate(outcomes):
        allowed = outcome["calls"] + 1
        assert outcome["total"] <= allowed and outcome["host_reads"] <= allowed, (
            f"rank {rank}: {outcome['calls']} step calls ({outcome['drain_calls']} of them drain calls) over"
            f" {outcome['batches']} batches made {outcome['collectives']} collectives and {outcome['host_reads']} host"
            f" reads of their results; at most {allowed} of each: one per step call, as stock's one per batch"
            f" ({_stock_regular(rank)['collectives']} over its {_stock_regular(rank)['batches']} batches), and the"
            " vote that ends the data"
        )


@pytest.mark.timeout(TIMEOUT_S)
def test_a_loss_no_parameter_contributes_to_trains_on_as_stock_does(design):
    """A step returning a loss no parameter contributes to runs a backward in which DDP all-reduces nothing, on every
    rank alike; stock Lightning trains on through the epoch, so the step calls go on too (a vote that was to ride in
    that all-reduce travels on its own)."""
    for rank, outcome in enumerate(_outcome(design, *LOSS_WITHOUT_PARAMETERS_RUN)):
        assert outcome["calls"] == outcome["batches"] == ITEMS // WORLD // BATCH_SIZE, (
            f"rank {rank}: {outcome['calls']} step calls took {outcome['batches']} batches; one call per batch of"
            f" its {ITEMS // WORLD // BATCH_SIZE}"
        )


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("per_call, accumulate", ACCUMULATION, ids=lambda v: str(v))
def test_accumulation_all_reduces_gradients_once_per_window(design, per_call, accumulate):
    """With ``accumulate_grad_batches`` under DDP the gradients are all-reduced once per window, as stock's regular
    flavour does over the same items (a regular batch holding a call's batches), and the weights end alike."""
    for rank, outcome in enumerate(_outcome(design, "accumulate", (per_call, accumulate))):
        stock = _outcome(None, "stock-regular-accumulate", (per_call, accumulate))[rank]
        windows = outcome["optimizer_steps"]
        communicated = outcome["gradient_buckets"] + outcome["gradient_all_reduces"]
        assert windows == stock["optimizer_steps"] and communicated == stock["gradient_buckets"] == windows, (
            f"rank {rank}, {per_call} batch(es) per call, accumulate_grad_batches={accumulate}: {windows} windows,"
            f" gradients communicated {communicated} times ({outcome['gradient_buckets']} in DDP's backward,"
            f" {outcome['gradient_all_reduces']} after it); stock's regular flavour: {stock['optimizer_steps']}"
            f" windows, {stock['gradient_buckets']} all-reduces"
        )
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), torch.tensor(stock["weights"][name]),
                                       msg=lambda m, rank=rank, name=name: (
                                           f"rank {rank}: {name} differs from stock's:\n{m}"))


@pytest.mark.timeout(TIMEOUT_S)
def test_a_window_the_data_ends_unforeseen_is_synchronised_once(design):
    """A step taking 1, 2, 1, 2 batches: before its last call the look-ahead expected one batch, so that call skips
    DDP's all-reduce and still ends the data (and the window). Its gradients are averaged once after it, and the
    weights are those of averaged-gradient SGD over the calls."""
    pattern, accumulate = UNFORESEEN_END
    outcomes = _outcome(design, *UNFORESEEN_END_RUN)
    for rank, outcome in enumerate(outcomes):
        communicated = outcome["gradient_buckets"] + outcome["gradient_all_reduces"]
        assert outcome["optimizer_steps"] == 1 == communicated, (
            f"rank {rank}: {outcome['optimizer_steps']} windows, gradients communicated {communicated} times"
            f" ({outcome['gradient_buckets']} in DDP's backward, {outcome['gradient_all_reduces']} after it); one"
            " window of 4 calls, expected once"
        )
    expected = _accumulated_ddp_weights(outcomes, accumulate)
    for rank, outcome in enumerate(outcomes):
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), expected[name], msg=lambda m, rank=rank, name=name: (
                f"rank {rank}: {name} differs from averaged-gradient SGD over the window:\n{m}"
            ))


def _accumulated_ddp_weights(outcomes: list[dict], accumulate: int) -> dict[str, torch.Tensor]:
    """Plain PyTorch: each call's loss averaged over the ranks and divided by ``accumulate`` (as Lightning scales
    it), gradients summed over a window of ``accumulate`` calls or the epoch's rest, then one SGD step."""
    layer = torch.nn.Linear(FEATURES, 1)
    layer.load_state_dict({k: torch.tensor(v) for k, v in outcomes[0]["initial"].items()})
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    per_rank = []
    for outcome in outcomes:
        received, calls, position = received_batches(outcome), [], 0
        for taken in outcome["per_step"]:
            calls.append(received[position:position + taken])
            position += taken
        per_rank.append(calls)
    for index, call in enumerate(zip(*per_rank, strict=True)):
        losses = []
        for batches in call:
            tensors = [collate_items([item(i) for i in batch]) for batch in batches]
            losses.append(torch.stack([torch.nn.functional.mse_loss(layer(x), y) for _, x, y in tensors]).mean())
        (torch.stack(losses).mean() / accumulate).backward()
        if (index + 1) % accumulate == 0 or index == len(per_rank[0]) - 1:
            optimizer.step()
            optimizer.zero_grad()
    return layer.state_dict()
