"""The benchmark harness itself: measuring, workloads, targets (fast; skipped by ``--benchmark-only``)."""

from __future__ import annotations

import math
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks import calibration, conftest, entries, intervals, lockstep, measuring, patch_cost, targets, workloads
from prototypes.common import Design


class _FakeProbe(measuring.Probe):
    def __init__(self, seconds_per_batch: float, batches: int = 4) -> None:
        super().__init__()
        self.received_at = [i * seconds_per_batch for i in range(batches)]


def test_interleaved_rotates_rounds_drops_warmup_and_keeps_errors_per_entry() -> None:
    calls: list[str] = []
    told: list[tuple] = []

    def run(name: str, seconds: float):
        def once() -> measuring.Probe:
            calls.append(name)
            return _FakeProbe(seconds)
        return once

    def broken() -> measuring.Probe:
        calls.append("broken")
        raise ValueError("design failed")

    data = measuring.Interleaved({"a": run("a", 1.0), "b": run("b", 2.0), "broken": broken}, skip=1, rounds=2,
                                 warmup=1, label="S9 x=1", progress=lambda *args: told.append(args))
    assert calls == ["a", "b", "broken", "b", "a", "a", "b"]  # rotation; a failing entry is not run again
    assert data.measurement("a").per_batch_s == [1.0, 1.0]  # warm-up round dropped, steady-state window
    assert data.measurement("b").median_ms == 2000.0
    assert data.ratio("a", "b") == {"value": 0.5, "interval": None}  # two rounds: too few for an interval
    with pytest.raises(ValueError, match="design failed"):
        data.measurement("broken")
    # before each round and once at the end: label, entries, rounds done, rounds in all, warm-up rounds
    assert told == [("S9 x=1", 3, r, 3, 1) for r in range(4)]


def test_progress_lines_say_what_runs_and_how_many_rounds_remain_within_100_columns() -> None:
    lines = [conftest.progress_text("S6 M=0.5C", 14, done, 10, 1) for done in range(11)]
    assert lines[0] == "S6 M=0.5C: 14 entries, warm-up round 1 of 10 running, 10 rounds left"
    assert lines[1] == "S6 M=0.5C: 14 entries, round 2 of 10 running, 9 rounds left"
    assert lines[10] == "S6 M=0.5C: 14 entries x 10 rounds measured"
    assert all(len(line) <= 100 for line in lines + [conftest.progress_text("S" * 200, 1, 0, 1, 0)])


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


def test_probe_times_the_steady_state_window_after_the_skipped_batches() -> None:
    probe = measuring.Probe()
    for _ in range(5):
        probe.batch_received(torch.zeros(1, 2))
    probe.received_at = [0.0, 5.0, 6.0, 7.5, 9.0]  # a slow first batch (start-up, pipeline fill), then 1.5 s each
    assert probe.per_batch_s(skip=2) == pytest.approx(1.5)
    assert probe.per_batch_s(skip=0) == pytest.approx(2.25)
    with pytest.raises(AssertionError, match="received 5 batches"):
        probe.per_batch_s(skip=4)


def test_the_median_interval_is_the_order_statistics_that_cover_it_95_percent() -> None:
    assert intervals.MIN_ROUNDS == 6
    assert intervals.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) is None  # 5 rounds: no 95 % interval exists
    assert intervals.median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)  # 6 rounds: the extremes (96.9 %)
    assert intervals.median_interval(list(range(1, 10))) == (2, 8)  # 9 rounds: 2nd and 8th (96.1 %)
    assert intervals.median_interval(list(range(1, 16))) == (4, 12)  # 15 rounds: 4th and 12th (96.5 %)
    # on skewed synthetic noise (a busy machine only adds time) the interval holds the true median >= 95 % of runs
    generator = torch.Generator().manual_seed(3)
    true_median = math.log(2.0)  # of Exp(1)
    trials = 2000
    covered = 0
    for _ in range(trials):
        draws = torch.empty(9, dtype=torch.float64).exponential_(1.0, generator=generator).tolist()
        low, high = intervals.median_interval(draws)
        covered += low <= true_median <= high
    assert 0.95 <= covered / trials <= 0.975


def test_verdicts_come_from_the_interval_not_the_value() -> None:
    assert intervals.verdict([0.96, 0.99], ">=", 0.95) == "met"
    assert intervals.verdict([0.90, 0.94], ">=", 0.95) == "missed"
    assert intervals.verdict([0.93, 0.97], ">=", 0.95) == "inconclusive"  # the median may be above: still unsure
    assert intervals.verdict([0.97, 1.00], "<=", 1.0) == "met"
    assert intervals.verdict([1.01, 1.10], "<=", 1.0) == "missed"
    assert intervals.verdict([0.98, 1.02], "<=", 1.0) == "inconclusive"
    assert intervals.verdict(None, "<=", 1.0) == "not judged"
    assert intervals.summary([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]) == {"value": 4.0, "interval": [1.0, 7.0]}


def test_settle_corrects_both_knobs_until_the_measured_ratio_is_nominal() -> None:
    # the machine is 20 % slower for matmuls than calibrated, and building a batch costs 0.7 ms on top of the sleep
    def pilot(load: calibration.Knob, step: calibration.Knob) -> tuple[float, float]:
        return load.value + 0.7, 1.0 + 1.2 * 0.4 * step.value

    load = calibration.Knob(9.3, 10.0, 0.7, integer=False)
    step = calibration.Knob(int((10.0 - 1.0) / 0.4), 10.0, 1.0, integer=True)
    settled = calibration.settle(pilot, load, step, attempts=3)
    first_l, first_c = settled.pilots[0]
    last_l, last_c = settled.pilots[-1]
    assert abs(first_l / first_c - 1.0) > 0.10  # as calibrated alone, the point would not have been judged
    assert abs(last_l / last_c - 1.0) <= 0.05 and len(settled.pilots) == 2

    # a machine whose every measurement is off in the same way: at most `attempts` corrections, then it stops
    stubborn = calibration.settle(lambda a, b: (5.0, 10.0), load, step, attempts=2)
    assert len(stubborn.pilots) == 3
    # a correction that overshoots (a burst of other work during its pilot) is not kept: the closest pilot's knobs are
    bursts = iter([(10.0, 14.0), (10.0, 10.4), (10.0, 6.0)])
    kept = calibration.settle(lambda a, b: next(bursts), load, step, attempts=2)
    assert kept.pilots == [(10.0, 14.0), (10.0, 10.4)] and kept.second.value < step.value
    bursts = iter([(10.0, 14.0), (10.0, 12.0), (10.0, 6.0)])
    overshot = calibration.settle(lambda a, b: next(bursts), load, step, attempts=2)
    assert len(overshot.pilots) == 3 and overshot.second == step.corrected(14.0)  # the 2nd try's knobs, not the 3rd
    # a measurement barely above the fixed cost corrects by at most 2x, never a thousandfold
    assert step.corrected(1.0001).value == 2 * step.value and step.corrected(1000.0).value == round(step.value / 2)


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
        "S1": [dict(design="loads_ahead[lookahead=2]", role="design", configuration="ships", point="L=C", L_over_C=1.0,
                    L_over_C_measured=0.98, efficiency=0.96, efficiency_interval=[0.955, 0.97],
                    vs_best_alternative=0.9, vs_best_alternative_interval=[0.85, 0.95]),
               dict(design="loads_ahead[lookahead=0]", role="design", configuration=None, point="L=C", L_over_C=1.0,
                    efficiency=0.0, vs_best_alternative=2.0),
               dict(design="loads_ahead[lookahead=2]", role="design", configuration="ships", point="L=2C", L_over_C=2.0,
                    L_over_C_measured=1.95, efficiency=0.5, vs_best_alternative=1.2,
                    vs_best_alternative_interval=[0.98, 1.3]),
               dict(design="loads_ahead[lookahead=2]", role="design", configuration="ships", point="L=0.5C",
                    L_over_C=0.5, L_over_C_measured=0.44, efficiency=0.9, vs_best_alternative=0.8,
                    vs_best_alternative_interval=[0.7, 0.9]),
               dict(design="plain", role="design", configuration="ships", point="L=C", L_over_C=1.0, efficiency=0.0),
               dict(design="alt:workers", role="alternative", point="L=C", L_over_C=1.0, efficiency=0.99)],
        "S3": [dict(design="plain", role="design", configuration="ships", flavour="dataloader_iter",
                    overhead_vs_stock=1.1, overhead_vs_stock_interval=[1.07, 1.12]),
               dict(design="plain", role="design", configuration="ships", flavour="regular", overhead_vs_stock=1.0,
                    overhead_vs_stock_interval=[0.99, 1.01])],
        "S4": [dict(design="loads_ahead[lookahead=4]", role="design", depth=4, peak_in_flight=6),
               dict(design="baseline:regular", role="baseline", depth=None, peak_in_flight=1)],
    }
    judged = targets.evaluate_targets(rows, designs)
    # only what a design that prefetches (and declares no opt-in thread) ships, at L = C; the measured ratio
    # travels along
    assert judged["S1"]["results"] == [dict(design="loads_ahead[lookahead=2]", value=0.96, interval=[0.955, 0.97],
                                            verdict="met", met=True, point="L=C", L_over_C=1.0,
                                            L_over_C_measured=0.98)]
    alternatives = judged["S1-alternatives"]["results"]
    assert [(r["point"], r["verdict"]) for r in alternatives] == [
        ("L=C", "met"), ("L=2C", "inconclusive"), ("L=0.5C", "not judged")]
    assert alternatives[2]["reason"] == "measured L/C 0.44 is off the nominal 0.50 by more than 10%"
    assert [(r["verdict"], r["met"]) for r in judged["S3"]["results"]] == [("missed", False)]
    assert judged["S3-regular"]["results"][0]["verdict"] == "met"
    assert judged["S4"]["results"] == [dict(design="loads_ahead[lookahead=4]", value=6, interval=None, limit=5,
                                            verdict="missed", met=False)]
    assert judged["S2"]["results"] == [] and "note" in judged["S2"]
    assert judged["S6"]["results"] == [] and "note" in judged["S6"]
    # a figure without an interval (too few rounds) is not judged, and says why
    no_interval = targets.judge(dict(design="x", efficiency=0.99), targets.TARGETS["S1"])
    assert no_interval["verdict"] == "not judged" and "fewer than 6 rounds" in no_interval["reason"]
    # the same rows with no design declaring that it prefetches: nothing is judged against the S1 target
    assert targets.evaluate_targets(rows, {"loads_ahead": design("loads_ahead"), "plain": designs["plain"]})["S1"][
        "results"] == []


def test_calibration_lands_on_the_target_despite_a_loop_cost_and_a_slower_core() -> None:
    # a loop costing 1.2 ms per batch and matmuls 30 % slower than the burner's idle-core figure
    def step_only_ms(iterations: int) -> float:
        return 1.2 + 1.3 * 0.36 * iterations

    step = calibration.calibrate_step(step_only_ms, 20.0, ms_per_iteration=0.36)
    assert abs(step.measured_ms - 20.0) < 0.5 and step.overhead_ms == 1.2
    assert abs(step.first_ms - 20.0) > 2.0  # the uncorrected guess would have missed C by this much

    load = calibration.calibrate_load(lambda sleep_ms: sleep_ms + 0.7, 20.0)
    assert load.value == pytest.approx(19.3) and load.measured_ms == pytest.approx(20.0)


def _registered(name: str, **declared) -> Design:
    """A registry entry whose trainer takes a ``lookahead`` option, declaring what ``declared`` says."""
    def make_trainer(trainer_kwargs, lookahead=0):
        return None

    return Design(name=name, summary=name, make_trainer=make_trainer, **declared)


# what ships without a thread and declares its opt-in thread (as the prefetcher does); what prefetches as it ships;
# what does not prefetch
THREADED = _registered("threaded", options={"lookahead": 0}, thread_options={"lookahead": "auto"},
                       prefetch_depth_option="lookahead", promised_s1_efficiency={"L=C": 0.8})
SHIPS_PREFETCHING = _registered("ships_prefetching", options={"lookahead": 2}, prefetch_depth_option="lookahead")
PLAIN = _registered("plain")
REGISTRY = {d.name: d for d in (THREADED, SHIPS_PREFETCHING, PLAIN)}


def test_the_entries_of_a_scenario_follow_what_each_design_declares(monkeypatch) -> None:
    monkeypatch.setattr(entries, "DESIGNS", REGISTRY)
    measured = entries.design_entries((0, 2))
    assert {key: entries.configuration_of(design) for key, design in measured.items()} == {
        "threaded[lookahead=0]": "ships", "threaded[lookahead='auto']": "opt-in thread",
        "threaded[lookahead=2]": None, "ships_prefetching[lookahead=2]": "ships",
        "ships_prefetching[lookahead=0]": None, "plain": "ships"}
    # the configuration the overlap targets judge and the S1 promises are asserted on: the opt-in thread where a
    # design declares one, else what a design that prefetches ships; none for a design that does not prefetch
    assert [key for key, design in measured.items() if entries.is_thread_configuration(design)] == [
        "threaded[lookahead='auto']", "ships_prefetching[lookahead=2]"]
    assert entries.design_fields(measured["threaded[lookahead='auto']"]) == dict(
        design="threaded[lookahead='auto']", role="design", depth="auto", configuration="opt-in thread",
        default=False)
    # S4 runs fixed depths only, besides what each design ships
    assert list(entries.design_entries((1,), with_opt_in_thread=False)) == [
        "threaded[lookahead=0]", "threaded[lookahead=1]", "ships_prefetching[lookahead=2]",
        "ships_prefetching[lookahead=1]", "plain"]
    # thread options that are what a design ships name no second configuration: it is judged on what it ships
    ships_its_thread = _registered("ships_its_thread", options={"lookahead": 2}, thread_options={"lookahead": 2},
                                   prefetch_depth_option="lookahead")
    assert entries.opt_in_thread(ships_its_thread) is None
    assert entries.thread_configuration(ships_its_thread) == "ships"


def test_the_overlap_targets_judge_the_opt_in_thread_and_the_others_what_ships() -> None:
    def row(design: str, configuration: str | None, **figures) -> dict:
        return dict(design=design, role="design", configuration=configuration, **figures)

    overlap = dict(point="M=C", M_over_C=1.0, M_over_C_measured=1.0, efficiency=0.95, efficiency_interval=[0.92, 0.97],
                   vs_best_alternative=0.9, vs_best_alternative_interval=[0.85, 0.95])
    cost = dict(flavour="dataloader_iter", overhead_vs_stock=1.0, overhead_vs_stock_interval=[0.99, 1.01],
                speedup=1.8, speedup_interval=[1.7, 1.9])
    rows = {
        "S6": [row("threaded[lookahead=0]", "ships", **overlap),
               row("threaded[lookahead='auto']", "opt-in thread", **overlap),
               row("threaded[lookahead=2]", None, **overlap),
               row("ships_prefetching[lookahead=2]", "ships", **overlap),
               row("plain", "ships", **overlap)],
        "S3": [row("threaded[lookahead=0]", "ships", **cost),
               row("threaded[lookahead='auto']", "opt-in thread", **cost),
               row("plain", "ships", **cost)],
        "S2": [row("threaded[lookahead=0]", "ships", **cost), row("plain", "ships", **cost)],
    }
    judged = targets.evaluate_targets(rows, REGISTRY)
    for overlap_target in ("S6", "S6-alternatives"):
        assert [r["design"] for r in judged[overlap_target]["results"]] == [
            "threaded[lookahead='auto']", "ships_prefetching[lookahead=2]"]
    for cost_target in ("S3", "S2"):
        assert [r["design"] for r in judged[cost_target]["results"]] == ["threaded[lookahead=0]", "plain"]


# ------------------------------------------------------------------------------------------------- lockstep
def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _fake_run(name: str, log: Path, batches: int = 12, produce_on_a_thread: bool = False, fail_at: int = -1):
    """A run as a scenario's is seen by the probe: produce, work, receive; each receipt logged as ``name i``."""

    def run() -> measuring.Probe:
        probe = measuring.Probe()
        for i in range(batches):
            if produce_on_a_thread:
                thread = threading.Thread(target=probe.batch_produced)
                thread.start()
                thread.join()
            else:
                probe.batch_produced()
            if i == fail_at:
                raise ValueError(f"{name} failed at batch {i}")
            _spin(0.001)
            with open(log, "a") as out:
                out.write(f"{name} {i}\n")
            probe.batch_received(torch.full((1, 2), float(i)))
        return probe

    return run


@pytest.mark.timeout(60)
def test_lockstep_runs_take_turns_batch_by_batch_from_the_window_on(tmp_path: Path) -> None:
    log, skip = tmp_path / "receipts", 3
    pair = lockstep.lockstep(_fake_run("a", log), _fake_run("b", log), skip)
    receipts = [line.split() for line in log.read_text().splitlines()]
    in_window = [name for name, i in receipts if int(i) > skip]
    assert in_window == ["a", "b"] * (12 - 1 - skip)  # strictly alternating, the first run first
    assert pair.first_s > 0 and pair.second_s > 0 and not pair.threaded
    assert pair.ratio == pair.second_s / pair.first_s


@pytest.mark.timeout(60)
def test_lockstep_marks_a_pair_whose_batches_come_from_a_thread(tmp_path: Path) -> None:
    log = tmp_path / "receipts"
    assert lockstep.lockstep(_fake_run("a", log), _fake_run("b", log, produce_on_a_thread=True), 2).threaded


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fail_at", [1, 6], ids=["before-the-window", "in-the-window"])
def test_lockstep_raises_a_failing_runs_error_without_hanging_the_other(tmp_path: Path, fail_at: int) -> None:
    log = tmp_path / "receipts"
    with pytest.raises(RuntimeError, match="b failed at batch"):
        lockstep.lockstep(_fake_run("a", log), _fake_run("b", log, fail_at=fail_at), 3)


# ------------------------------------------------------------------------------------------------- the patch's cost
@pytest.mark.timeout(300)
def test_a_pair_across_interpreters_takes_turns_batch_by_batch(tmp_path: Path) -> None:
    # two interpreters (here the same one twice): S3's run in each, taking turns through pipes from the window on
    log, skip, batches = tmp_path / "receipts", 3, 12
    first_s, second_s = patch_cost.pair(sys.executable, sys.executable, ("dataloader_iter", "dataloader_iter"), batches,
                                       skip, log)
    receipts = [line.split() for line in log.read_text().splitlines()]
    in_window = [name for name, i in receipts if int(i) > skip]
    assert in_window == ["0", "1"] * (batches - 1 - skip)  # strictly alternating, the first run first
    assert first_s > 0 and second_s > 0


@pytest.mark.timeout(300)
def test_a_pair_across_interpreters_raises_its_runs_errors_instead_of_waiting() -> None:
    # runs that never reach their window (no batch after the skip) fail, and the pair says why
    with pytest.raises(RuntimeError, match="received no batch after the first 8"):
        patch_cost.pair(sys.executable, sys.executable, ("regular", "regular"), 8, 8)


def test_the_patch_cost_judges_each_flavour_against_its_threshold_from_the_interval() -> None:
    ratios = {"regular": [1.0 + i / 10_000 for i in range(24)],
              "dataloader_iter": [0.998 + i / 1000 for i in range(24)], patch_cost.SAME_ENVIRONMENT: [1.0] * 24}
    stock = dict(python="3.11", torch="2.x", pytorch_lightning="9.9.9", patch_series=None)
    payload = patch_cost.results(ratios, stock, dict(stock, patch_series="sha256:ab"), 200, 20)
    rows = {row["case"]: row for row in payload["rows"]}
    assert rows["regular"]["verdict"] == "met" and rows["regular"]["threshold"] == 1.01
    assert rows["dataloader_iter"]["verdict"] == "inconclusive"  # its interval straddles 1.01
    assert "verdict" not in rows[patch_cost.SAME_ENVIRONMENT] and rows[patch_cost.SAME_ENVIRONMENT]["pairs"] == 24
    assert payload["setup"]["stock"]["patch_series"] is None and payload["setup"]["batches"] == 200


def test_the_patch_cost_pairs_cycle_over_every_build_in_both_orders(monkeypatch) -> None:
    made: list[tuple[str, str, tuple[str, str]]] = []

    def pair(first: str, second: str, flavours: tuple[str, str], batches: int, skip: int) -> tuple[float, float]:
        made.append((first, second, flavours))
        return 1.0, 1.0

    monkeypatch.setattr(patch_cost, "pair", pair)
    ratios = patch_cost.measure(["s1", "s2"], ["p1", "p2"], 8, 10, 2)
    assert all(len(values) == 8 for values in ratios.values())
    regular = [(first, second) for first, second, flavours in made if flavours == ("regular", "regular")]
    assert regular == [("s1", "p1"), ("p1", "s1"), ("s2", "p1"), ("p1", "s2"),
                       ("s1", "p2"), ("p2", "s1"), ("s2", "p2"), ("p2", "s2")]
    # stock's control pairs two builds of stock, never a build with itself
    controls = [(first, second) for first, second, _ in made[2::5]]
    assert len(controls) == 8 and all(first != second and {first, second} == {"s1", "s2"} for first, second in controls)
    # the patched flavour beside stock's regular step, in the same pairs of builds: each run keeps its own flavour
    # whichever takes the first turn
    beside_regular = made[3::5]
    assert [(first, second) for first, second, _ in beside_regular] == regular
    assert all(flavours == (("regular", "dataloader_iter") if first.startswith("s") else ("dataloader_iter", "regular"))
               for first, _, flavours in beside_regular)
    # the look-ahead without the transfer, beside today's flavour: the transfer left out on the patched side only
    without_transfer = made[4::5]
    assert [(first, second) for first, second, _ in without_transfer] == regular
    leave_out = patch_cost.WITHOUT_TRANSFER
    assert all(flavours == (("dataloader_iter", leave_out) if first.startswith("s") else (leave_out, "dataloader_iter"))
               for first, _, flavours in without_transfer)


@pytest.mark.timeout(300)
def test_the_case_without_the_transfer_refuses_a_build_of_stock() -> None:
    # this environment runs stock Lightning, whose loop has no transfer to leave out: the run says so and fails
    with pytest.raises(RuntimeError, match=f"the {patch_cost.WITHOUT_TRANSFER} case needs the patch"):
        patch_cost.pair(sys.executable, sys.executable, ("dataloader_iter", patch_cost.WITHOUT_TRANSFER), 12, 3)


@pytest.mark.timeout(300)
def test_an_instruction_count_is_exact_and_follows_the_work_per_batch() -> None:
    # the same code counts the same; the regular step passes each batch through the transfer hooks, which today's
    # flavour skips, so it executes more per batch
    regular = [patch_cost.count_instructions(sys.executable, "regular", 40, 10) for _ in range(2)]
    flavour = patch_cost.count_instructions(sys.executable, "dataloader_iter", 40, 10)
    assert regular[0] == regular[1] and regular[0] > flavour > 1000


def test_the_instruction_counts_cover_every_build_and_case(monkeypatch) -> None:
    counted: list[tuple[str, str]] = []

    def count(python: str, flavour: str, batches: int, skip: int) -> float:
        counted.append((python, flavour))
        return {"regular": 100.0, "dataloader_iter": 80.0, patch_cost.WITHOUT_TRANSFER: 84.0}[flavour] + (
            python == "p2")

    monkeypatch.setattr(patch_cost, "count_instructions", count)
    found = patch_cost.instructions(["s1"], ["p1", "p2"], 10, 2)
    assert len(counted) == len(set(counted)) == 8  # each (build, flavour) once: 2 of stock, 3 of each patched build
    assert found["regular"] == dict(reference=[100.0, 100.0], measured=[100.0, 101.0], ratio=1.005)
    assert found[patch_cost.SAME_ENVIRONMENT]["ratio"] == 1.0
    assert found[patch_cost.OVER_REGULAR]["reference"] == [100.0, 100.0]
    assert found[patch_cost.WITHOUT_TRANSFER]["ratio"] == 84.5 / 80.0


def test_the_patch_cost_refuses_builds_of_one_environment_that_run_different_things(monkeypatch, capsys) -> None:
    runs = {"s1": dict(pytorch_lightning="9.9.9", patch_series=None),
            "p1": dict(pytorch_lightning="9.9.9", patch_series="sha256:ab"),
            "p2": dict(pytorch_lightning="9.9.9", patch_series="sha256:cd")}
    monkeypatch.setattr(patch_cost, "_versions", runs.__getitem__)
    with pytest.raises(SystemExit):
        patch_cost.main(["--stock-python", "s1", "--patched-python", "p1", "p2", "--out", "unused.json"])
    error = " ".join(capsys.readouterr().err.split())
    assert "p2 runs" in error and "the builds of an environment must run the same" in error


# ------------------------------------------------------------------------------------------------- S7's control
def test_the_s7_control_sends_the_vote_alone_as_a_broadcast(monkeypatch) -> None:
    from benchmarks import test_s7_ddp_vote

    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, **kwargs: sent.append(("all_reduce",
                                                                                                 tensor.numel())))
    monkeypatch.setattr(torch.distributed, "broadcast", lambda tensor, src, **kwargs: sent.append(("broadcast", src)))
    test_s7_ddp_vote.vote_as_broadcast()
    maximum = torch.distributed.ReduceOp.MAX
    torch.distributed.all_reduce(torch.zeros(1, dtype=torch.int), op=maximum)  # the patched loop's vote
    torch.distributed.all_reduce(torch.zeros(1))  # a sum of floats, as a metric's sync
    torch.distributed.all_reduce(torch.zeros(3, dtype=torch.int), op=maximum)
    assert sent == [("broadcast", 0), ("all_reduce", 1), ("all_reduce", 3)]
