"""The measuring harness itself (fast; skipped by ``--benchmark-only``, which runs only benchmarks)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import harness


class _FakeProbe(harness.Probe):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.t_epoch_start, self.t_epoch_end = 0.0, seconds


def test_interleaved_rotates_rounds_drops_warmup_and_keeps_errors_per_entry() -> None:
    calls: list[str] = []

    def run(name: str, seconds: float):
        def once() -> harness.Probe:
            calls.append(name)
            return _FakeProbe(seconds)
        return once

    def broken() -> harness.Probe:
        calls.append("broken")
        raise ValueError("design failed")

    data = harness.Interleaved({"a": run("a", 2.0), "b": run("b", 4.0), "broken": broken}, 2, rounds=2, warmup=1)
    assert calls == ["a", "b", "broken", "b", "a", "a", "b"]  # rotation; a failing entry is not run again
    assert data.measurement("a").per_batch_s == [1.0, 1.0]  # warm-up round dropped, span / batches
    assert data.measurement("b").median_ms == 2000.0
    with pytest.raises(ValueError, match="design failed"):
        data.measurement("broken")


class _FakeBenchmark:
    """pytest-benchmark's pedantic loop, reduced to what ``report`` relies on: timer around target, per round."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def pedantic(self, target, rounds: int, warmup_rounds: int) -> None:
        for _ in range(rounds):
            start = harness.span_clock()
            target()
            self.durations.append(harness.span_clock() - start)


def test_report_hands_the_measured_values_to_pytest_benchmark() -> None:
    fake = _FakeBenchmark()
    harness.report(fake, harness.Measurement([0.5, 0.25], [harness.Probe(), harness.Probe()]))
    assert fake.durations == [0.5, 0.25]


def test_probe_span_starts_at_the_earlier_of_first_load_and_epoch_start() -> None:
    probe = harness.Probe()
    probe.t_first_load, probe.t_epoch_start, probe.t_epoch_end = 1.0, 3.0, 7.0
    assert probe.span() == 6.0
    probe.t_first_load = None
    assert probe.span() == 4.0
    with pytest.raises(AssertionError, match="no complete epoch"):
        harness.Probe().span()


def test_in_flight_counts_produced_but_not_received() -> None:
    probe = harness.Probe()
    for _ in range(3):
        probe.batch_produced()
    probe.batch_received(torch.zeros(1, 2))
    probe.batch_produced()
    assert probe.peak_in_flight == 3 and probe.produced - probe.consumed == 3


def test_exactly_once_names_what_went_wrong() -> None:
    harness.check_exactly_once([0, 1, 2], 3)
    with pytest.raises(AssertionError, match=r"missing \[1\], unexpected \[\]"):
        harness.check_exactly_once([0, 2], 3)
    with pytest.raises(AssertionError, match="expected"):
        harness.check_exactly_once([0, 0, 1, 2], 3)


def test_jittered_loads_are_fixed_by_the_seed_with_the_requested_mean() -> None:
    loads = harness.jittered_loads(64, 10.0, seed=7)
    assert loads == harness.jittered_loads(64, 10.0, seed=7)
    assert sum(loads) / len(loads) == pytest.approx(10.0)
    assert max(loads) > 2 * min(loads)


def test_targets_record_where_each_design_stands() -> None:
    rows = {
        "S1": [dict(design="prefetcher[depth=2]", role="design", L_over_C=1.0, efficiency=0.96),
               dict(design="prefetcher[depth=2]", role="design", L_over_C=2.0, efficiency=0.5),
               dict(design="upstream", role="design", L_over_C=1.0, efficiency=0.0)],
        "S3": [dict(design="upstream", role="design", flavour="dataloader_iter", overhead_vs_regular=1.1),
               dict(design="upstream", role="design", flavour="regular", overhead_vs_regular=1.0)],
        "S4": [dict(design="prefetcher[depth=4]", role="design", depth=4, peak_in_flight=6),
               dict(design="baseline:regular", role="baseline", depth=None, peak_in_flight=1)],
    }
    targets = harness.evaluate_targets(rows)
    assert targets["S1"]["results"] == [dict(design="prefetcher[depth=2]", value=0.96, met=True)]
    assert targets["S3"]["results"] == [dict(design="upstream", value=1.1, met=False)]
    assert targets["S4"]["results"] == [dict(design="prefetcher[depth=4]", value=6, limit=5, met=False)]
    assert targets["S2"]["results"] == [] and "note" in targets["S2"]
