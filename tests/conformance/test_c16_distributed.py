"""C16 Distributed: under DDP each rank gets its own shard exactly once; uneven shards never leave a rank blocked.

The launcher (how the ranks start, report and are stopped) is in ``tests/conformance/ddp.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.conformance.ddp import (
    HELD_ON_ONE_RANK,
    PATTERNS,
    SHARED_KINDS,
    TEST_TIMEOUT_S,
    UNEQUAL_CALLS,
    UNEQUAL_CALLS_PATTERN,
    WORLD,
    finished_on_every_rank,
    hand_written_ddp_weights,
    received_batches,
    reference_ddp_weights,
    require_all_reported,
    run_outcome,
    sampler_shard_batches,
    summary,
    uneven_shard_batches,
)
from tests.conformance.harness import assert_same_batches

pytestmark = pytest.mark.clause("C16")

NOT_TRAINED = "not trained"  # what every warning about batches left untrained says


# --------------------------------------------------------------------------------------------------- (a) shards
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("kind", SHARED_KINDS)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_each_rank_receives_its_sampler_shard_once_in_order(design, pattern, kind):
    outcomes = finished_on_every_rank(kind, pattern, design)
    for rank, outcome in enumerate(outcomes):
        expected = sampler_shard_batches(kind, rank)
        assert_same_batches(received_batches(outcome), expected, what=f"rank {rank}: batches received")
        indices = [batch_idx for _, batch_idx, _ in outcome["steps"]]
        assert indices == list(range(len(expected))), (
            f"rank {rank}: batch_idx {indices}, expected 0..{len(expected) - 1}"
        )


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_ranks_end_with_the_weights_of_averaged_gradient_steps(design, pattern):
    outcomes = finished_on_every_rank("injected", pattern, design)
    steps = len(sampler_shard_batches("injected", 0)) // pattern[0]
    for rank, outcome in enumerate(outcomes):
        assert outcome["global_step"] == steps == outcome["optimizer_steps"], (
            f"rank {rank}: global_step {outcome['global_step']}, optimizer steps {outcome['optimizer_steps']},"
            f" expected {steps} (one per step call)"
        )
    expected = reference_ddp_weights(outcomes, [pattern[0]] * WORLD)
    for rank, outcome in enumerate(outcomes):
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), expected[name], msg=lambda m, rank=rank, name=name: (
                f"rank {rank}: {name} differs from DDP's averaged-gradient SGD:\n{m}"
            ))


# --------------------------------------------------------------------------------------------------- (b) uneven
@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_uneven_shards_stop_every_rank_at_the_same_step_or_raise_the_same_error(design, pattern):
    """Rank 0 has 4 batches, rank 1 has 2: either both stop after the same step, or both raise one clear error.

    The case Accelerate #2258 hung on: a rank whose data ran out leaves the collectives while another still waits
    in one. Here a rank that finished exits (as under torchrun), so a rank left waiting fails on the closed
    connection; had the finished rank stayed alive, it would wait out the process group's timeout (Lightning's
    default: 30 minutes). Either way it is a failure.
    """
    run = run_outcome(design, "uneven", pattern)
    outcomes = require_all_reported(run)
    blocked = [rank for rank, outcome in enumerate(outcomes) if outcome["error"] and outcome["error"]["collective"]]
    assert not blocked, (
        f"rank(s) {blocked} failed inside a collective (left waiting for a rank that had stopped):\n" + summary(run)
    )
    errors = [outcome["error"] for outcome in outcomes]
    if any(errors):
        assert all(errors), "one rank raised while another finished:\n" + summary(run)
        # the same type and message; numbers (a rank, a step) may differ
        kinds = {(e["type"], re.sub(r"\d+", "#", e["message"])) for e in errors}
        assert len(kinds) == 1, "the ranks raised different errors:\n" + summary(run)
        return
    counters = [(o["step_calls"], o["global_step"], o["optimizer_steps"]) for o in outcomes]
    assert len(set(counters)) == 1, (
        "the ranks stopped at different steps (step calls, global_step, optimizer steps):\n" + summary(run)
    )
    for rank, outcome in enumerate(outcomes):
        shard = uneven_shard_batches(rank)
        received = received_batches(outcome)
        assert received == shard[: len(received)], (
            f"rank {rank} received {received}, not an in-order prefix of its shard {shard}"
        )
    assert outcomes[0]["weights"] == outcomes[1]["weights"], "the ranks ended with different weights:\n" + summary(run)


# --------------------------------------------------------------------------------------------------- (c) unequal calls
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_equal_shards_with_unequal_calls_stop_every_rank_at_the_same_step(design):
    """Equal ``DistributedSampler`` shards, a step taking 1 batch per call on rank 0 and 2 on rank 1: rank 1's data
    ends first, so both ranks stop after the same call, with one averaged-gradient step per call, and rank 0, which
    still has batches, warns that it does not train them. Equal shards alone do not end the ranks together: a rank
    that skipped the vote for them would be left in a gradient all-reduce (or a vote) its peer never joins.
    """
    outcomes = finished_on_every_rank(UNEQUAL_CALLS, UNEQUAL_CALLS_PATTERN, design)
    run = run_outcome(design, UNEQUAL_CALLS, UNEQUAL_CALLS_PATTERN)
    shards = [sampler_shard_batches(UNEQUAL_CALLS, rank) for rank in range(WORLD)]
    calls = min(len(shard) // per_call for shard, per_call in zip(shards, UNEQUAL_CALLS_PATTERN, strict=True))
    for rank, outcome in enumerate(outcomes):
        per_call = UNEQUAL_CALLS_PATTERN[rank]
        counters = (outcome["step_calls"], outcome["global_step"], outcome["optimizer_steps"])
        assert counters == (calls,) * 3, (
            f"rank {rank}: step calls, global_step, optimizer steps {counters}; every rank stops after the call in"
            f" which the first rank's data ends, {calls}:\n" + summary(run)
        )
        assert_same_batches(received_batches(outcome), shards[rank][: calls * per_call],
                            what=f"rank {rank}: batches received (its shard's first {calls} calls, once each)")
        left = len(shards[rank]) - calls * per_call
        # the warning names the rank and the cause, in each design's words
        warned = [text for text in outcome["warnings"] if text.startswith(f"rank {rank}") and "another rank" in text]
        assert len(warned) == bool(left), (
            f"rank {rank} has {left} batches of its shard left when the epoch ends; its warnings about them: {warned}"
            " (one expected on a rank with batches left, none elsewhere)"
        )
    reference = reference_ddp_weights(outcomes, list(UNEQUAL_CALLS_PATTERN))
    for rank, outcome in enumerate(outcomes):
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), reference[name], msg=lambda m, rank=rank, name=name: (
                f"rank {rank}: {name} differs from DDP's averaged-gradient SGD over the calls both ranks made:\n{m}"
            ))


# ------------------------------------------------------------------------------------------- (d) held on one rank
@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_a_batch_held_on_one_rank_is_drained_beside_its_peers_last_call(design):
    """Rank 0's step pulls ahead (Lightning's async-handle pattern), so its data ends a call before rank 1's, whose
    step takes one batch per call: rank 0 then holds one batch and rank 1 has one left. In that call each trains one:
    rank 0 in a drain call, rank 1 in a regular one, so their gradient all-reduces pair (a drain call on rank 0
    alone would pair its all-reduce with nothing; dropping the batch would lose it). Every batch is trained, nothing
    is reported lost, and the weights are those of the same loop written by hand: per call, each rank's loss over
    the batch it trained, the gradients averaged."""
    outcomes = finished_on_every_rank(HELD_ON_ONE_RANK, (1,), design)
    run = run_outcome(design, HELD_ON_ONE_RANK, (1,))
    shards = [sampler_shard_batches("explicit", rank) for rank in range(WORLD)]
    calls = len(shards[0])  # rank 0: its first call takes two batches, its last is a drain call
    trained = [[tuple(batch) for batch in outcomes[0]["trained"]], received_batches(outcomes[1])]
    for rank, outcome in enumerate(outcomes):
        assert (outcome["step_calls"], outcome["optimizer_steps"]) == (calls, calls), (
            f"rank {rank}: {outcome['step_calls']} step calls, {outcome['optimizer_steps']} optimizer steps; each"
            f" rank makes {calls}, rank 0's last a drain call:\n" + summary(run)
        )
        assert trained[rank] == shards[rank], f"rank {rank} trained {trained[rank]}:\n" + summary(run)
        lost = [text for text in outcome["warnings"] if NOT_TRAINED in text]
        assert not lost, f"rank {rank} reports batches not trained: {lost}"
    reference = hand_written_ddp_weights(outcomes[0]["initial"], [[[batch] for batch in t] for t in trained])
    for rank, outcome in enumerate(outcomes):
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), reference[name], msg=lambda m, rank=rank, name=name: (
                f"rank {rank}: {name} differs from the loop written by hand:\n{m}"
            ))
