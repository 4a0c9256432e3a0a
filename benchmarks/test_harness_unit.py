"""The benchmark harness itself: measuring, workloads, targets, provenance (fast; skipped by ``--benchmark-only``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import measuring, provenance, targets, workloads
from prototypes.common import Design


class _FakeProbe(measuring.Probe):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.t_epoch_start, self.t_epoch_end = 0.0, seconds


def test_interleaved_rotates_rounds_drops_warmup_and_keeps_errors_per_entry() -> None:
    calls: list[str] = []

    def run(name: str, seconds: float):
        def once() -> measuring.Probe:
            calls.append(name)
            return _FakeProbe(seconds)
        return once

    def broken() -> measuring.Probe:
        calls.append("broken")
        raise ValueError("design failed")

    data = measuring.Interleaved({"a": run("a", 2.0), "b": run("b", 4.0), "broken": broken}, 2, rounds=2, warmup=1)
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
            start = measuring.span_clock()
            target()
            self.durations.append(measuring.span_clock() - start)


def test_report_hands_the_measured_values_to_pytest_benchmark() -> None:
    fake = _FakeBenchmark()
    measuring.report(fake, measuring.Measurement([0.5, 0.25], [measuring.Probe(), measuring.Probe()]))
    assert fake.durations == pytest.approx([0.5, 0.25])  # differences of a running sum: exact up to rounding


def test_probe_span_starts_at_the_earlier_of_first_load_and_epoch_start() -> None:
    probe = measuring.Probe()
    probe.t_first_load, probe.t_epoch_start, probe.t_epoch_end = 1.0, 3.0, 7.0
    assert probe.span() == 6.0
    probe.t_first_load = None
    assert probe.span() == 4.0
    with pytest.raises(AssertionError, match="no complete epoch"):
        measuring.Probe().span()


def test_in_flight_counts_produced_but_not_received() -> None:
    probe = measuring.Probe()
    for _ in range(3):
        probe.batch_produced()
    probe.batch_received(torch.zeros(1, 2))
    probe.batch_produced()
    assert probe.peak_in_flight == 3 and probe.produced - probe.consumed == 3


def test_exactly_once_names_what_went_wrong() -> None:
    measuring.check_exactly_once([0, 1, 2], 3)
    with pytest.raises(AssertionError, match=r"missing \[1\], unexpected \[\]"):
        measuring.check_exactly_once([0, 2], 3)
    with pytest.raises(AssertionError, match="expected"):
        measuring.check_exactly_once([0, 0, 1, 2], 3)


def test_jittered_loads_are_fixed_by_the_seed_with_the_requested_mean() -> None:
    loads = workloads.jittered_loads(64, 10.0, seed=7)
    assert loads == workloads.jittered_loads(64, 10.0, seed=7)
    assert sum(loads) / len(loads) == pytest.approx(10.0)
    assert max(loads) > 2 * min(loads)


def test_targets_judge_designs_by_what_they_declare() -> None:
    def design(name: str, **declared) -> Design:
        return Design(name=name, summary=name, make_trainer=lambda trainer_kwargs, **options: None, **declared)

    designs = {"loads_ahead": design("loads_ahead", prefetch_depth_option="lookahead"), "plain": design("plain")}
    rows = {
        "S1": [dict(design="loads_ahead[lookahead=2]", role="design", default=True, point="L=C", L_over_C=1.0,
                    L_over_C_measured=0.98, efficiency=0.96, vs_best_alternative=0.9),
               dict(design="loads_ahead[lookahead=0]", role="design", default=False, point="L=C", L_over_C=1.0,
                    efficiency=0.0, vs_best_alternative=2.0),
               dict(design="loads_ahead[lookahead=2]", role="design", default=True, point="L=2C", L_over_C=2.0,
                    efficiency=0.5, vs_best_alternative=1.2),
               dict(design="plain", role="design", default=True, point="L=C", L_over_C=1.0, efficiency=0.0),
               dict(design="alt:workers", role="alternative", point="L=C", L_over_C=1.0, efficiency=0.99)],
        "S3": [dict(design="plain", role="design", default=True, flavour="dataloader_iter", overhead_vs_regular=1.1),
               dict(design="plain", role="design", default=True, flavour="regular", overhead_vs_regular=1.0)],
        "S4": [dict(design="loads_ahead[lookahead=4]", role="design", depth=4, peak_in_flight=6),
               dict(design="baseline:regular", role="baseline", depth=None, peak_in_flight=1)],
    }
    judged = targets.evaluate_targets(rows, designs)
    # only the registered configuration of a design that prefetches, at L = C; the measured ratio travels along
    assert judged["S1"]["results"] == [dict(design="loads_ahead[lookahead=2]", value=0.96, met=True, point="L=C",
                                            L_over_C=1.0, L_over_C_measured=0.98)]
    assert [(r["point"], r["met"]) for r in judged["S1-alternatives"]["results"]] == [("L=C", True), ("L=2C", False)]
    assert judged["S3"]["results"] == [dict(design="plain", value=1.1, met=False)]
    assert judged["S4"]["results"] == [dict(design="loads_ahead[lookahead=4]", value=6, limit=5, met=False)]
    assert judged["S2"]["results"] == [] and "note" in judged["S2"]
    assert judged["S6"]["results"] == [] and "note" in judged["S6"]
    # the same rows with no design declaring that it prefetches: nothing is judged against the S1 target
    assert targets.evaluate_targets(rows, {"loads_ahead": design("loads_ahead"), "plain": designs["plain"]})["S1"][
        "results"] == []


def test_calibration_lands_on_the_target_despite_a_loop_cost_and_a_slower_core() -> None:
    # a loop costing 1.2 ms per batch and matmuls 30 % slower than the burner's idle-core figure
    def step_only_ms(iterations: int) -> float:
        return 1.2 + 1.3 * 0.36 * iterations

    calibration = workloads.calibrate_step(step_only_ms, 20.0, ms_per_iteration=0.36)
    assert abs(calibration.measured_ms - 20.0) < 0.5 and calibration.overhead_ms == 1.2
    assert abs(calibration.first_ms - 20.0) > 2.0  # the uncorrected guess would have missed C by this much

    load = workloads.calibrate_load(lambda sleep_ms: sleep_ms + 0.7, 20.0)
    assert load.value == pytest.approx(19.3) and load.measured_ms == pytest.approx(20.0)


def test_design_entries_add_the_depths_of_a_design_that_prefetches_only() -> None:
    entries = workloads.design_entries((0, 1, 2, 4))
    for design in entries.values():
        assert design.prefetch_depth_option or workloads.is_default(design)
    prefetching = [d for d in entries.values() if d.prefetch_depth_option]
    for name in {d.name for d in prefetching}:
        depths = [workloads.depth_of(d) for d in prefetching if d.name == name]
        assert {0, 1, 2, 4} <= set(depths) and len(depths) == len(set(depths))
        assert sum(workloads.is_default(d) for d in prefetching if d.name == name) == 1


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True, timeout=30)


def test_the_code_counts_as_changed_only_outside_the_results_and_rendered_pages(tmp_path: Path) -> None:
    for path in ("prototypes/design.py", "rfc/results/conformance.json", "rfc/generated/matrix.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("committed\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "measured code")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    (tmp_path / "rfc/results/conformance.json").write_text("a new run\n")
    (tmp_path / "rfc/generated/matrix.md").write_text("re-rendered\n")
    assert provenance.code_revision(tmp_path) == {"git_commit": head, "git_dirty": False}
    (tmp_path / "prototypes/design.py").write_text("changed\n")
    assert provenance.code_revision(tmp_path) == {"git_commit": head, "git_dirty": True}
