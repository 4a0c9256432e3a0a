"""S1 I/O-bound loading: items take L ms to produce (sleep), the step computes C ms; does loading overlap the step?

Per L/C point, interleaved round by round in one session: stock Lightning's regular flavour (T_serial), a
load-only run and a step-only run (stock Lightning's loop over batches already in memory, the same step; T_ideal is
the larger of the two), the same step in a raw PyTorch loop (the raw-loop figure), the alternatives a user has
today (stock regular flavour with DataLoader workers; stock ``dataloader_iter`` flavour over the loader wrapped in
torchdata ``nodes`` prefetching), and every registered design running the plainest
``training_step(self, dataloader_iter)``: as it ships, with its opt-in prefetch thread, and, where it prefetches,
at depth 0 and 2 (``benchmarks.entries``). Before the rounds, the step's work and the load's sleep are calibrated so
that the step-only and load-only runs measure the nominal C and L. Efficiency e = (T_serial - T) / (T_serial -
T_ideal): 0 is no overlap, 1 is perfect overlap. What the two overlap scenarios share is written once in
``benchmarks.scenario``.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import calibration, entries, measuring, overlap, workloads
from benchmarks.conftest import FEATURES, ROWS
from benchmarks.scenario import OverlapScenario

pytestmark = [
    pytest.mark.benchmark(group="S1 I/O-bound loading (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test of a point measures the whole point; smoke mode takes seconds
]

DEPTHS = (0, 2)  # S3 and S4 run more depths; here no thread, and the fixed depth "auto" runs once it keeps its thread
DESIGNS = entries.design_entries(DEPTHS)
# Every design's prefetch thread (the configuration the S1 targets judge) also over the worker loader: does the
# thread still help with workers? Shown, not judged.
WITH_WORKERS = {f"{d.id}+workers": d for d in DESIGNS.values() if entries.is_thread_configuration(d)}
S1 = OverlapScenario(
    name="S1",
    # L and C as multiples of Sizes.s1_base_ms: the longer of the two is always the base, which keeps the serial run
    # of L = 2C as cheap as that of L = C/2.
    points={"L=0.5C": (0.5, 1.0), "L=C": (1.0, 1.0), "L=2C": (1.0, 0.5)},
    baselines=(overlap.SERIAL, overlap.LOAD_ONLY, overlap.STEP_ONLY, overlap.STEP_ONLY_RAW),
    # What a user runs today, and the simpler design with it: stock Lightning with workers, stock Lightning's
    # dataloader_iter flavour over torchdata nodes prefetching, and the design without a thread composed with each.
    alternatives=("alt:workers", "alt:nodes-prefetch", *entries.simpler_design_alternatives()),
    flavours={overlap.SERIAL: "regular", overlap.LOAD_ONLY: "load-only", overlap.STEP_ONLY: "step-only",
              overlap.STEP_ONLY_RAW: "step-only (raw loop)", "alt:workers": "regular",
              "alt:nodes-prefetch": "dataloader_iter"},
    designs=DESIGNS,
    shown=WITH_WORKERS,
)


def _load_only_ms(n: int, sleep_ms: float) -> float:
    def run(probe: measuring.Probe) -> None:
        workloads.run_load_only(probe, workloads.loader(workloads.TimedDataset(n, sleep_ms, probe, ROWS, FEATURES)))
    return calibration.timed_epoch(run)


def _knobs(bench, point: str) -> tuple[int, float]:
    """Matmul iterations and sleep (ms) that make this point's step-only and load-only runs measure its C and L,
    under the load of the moment."""
    l_ms, c_ms = S1.targets(point, bench.sizes.s1_base_ms)
    load = bench.calibrated(f"S1 L={l_ms:g}", lambda: calibration.calibrate_load(
        partial(_load_only_ms, bench.sizes.calibration_batches), l_ms))

    def pilot(l_knob: calibration.Knob, c_knob: calibration.Knob) -> tuple[float, float]:
        runs = {entry: partial(_run, bench, int(c_knob.value), l_knob.value, entry)
                for entry in (overlap.LOAD_ONLY, overlap.STEP_ONLY)}
        medians = calibration.pilot_medians(runs, bench.sizes.skip, bench.sizes.pilot_rounds)
        return medians[overlap.LOAD_ONLY], medians[overlap.STEP_ONLY]

    sleep, step = S1.settled(bench, point, calibration.Knob(load.value, l_ms, load.first_ms - l_ms, integer=False),
                             c_ms, pilot)
    return int(step.value), sleep.value


def _once(bench, point: str, entry: str) -> measuring.Probe:
    iterations, sleep_ms = _knobs(bench, point)
    return _run(bench, iterations, sleep_ms, entry)


def _run(bench, iterations: int, sleep_ms: float, entry: str) -> measuring.Probe:
    n = bench.sizes.s1_batches
    probe = measuring.Probe()
    dataset = workloads.TimedDataset(n, sleep_ms, probe, ROWS, FEATURES)
    regular = partial(workloads.RegularStep, probe, FEATURES, bench.burner, iterations)
    iterating = partial(workloads.IterStep, probe, FEATURES, bench.burner, iterations)
    with_workers = partial(workloads.loader, dataset, workloads.ALTERNATIVE_WORKERS)
    if entry == overlap.LOAD_ONLY:
        workloads.run_load_only(probe, workloads.loader(dataset))
    elif entry == overlap.STEP_ONLY:
        workloads.run_step_only(regular(), [dataset.make(i) for i in range(n)], bench.root)
    elif entry == overlap.STEP_ONLY_RAW:
        workloads.run_raw_step_only(regular(), [dataset.make(i) for i in range(n)])
    elif entry == overlap.SERIAL:
        workloads.fit(workloads.make_trainer(None, bench.root), regular(), workloads.loader(dataset))
    elif entry == "alt:workers":
        workloads.fit_closing(None, bench.root, regular(), with_workers())
    elif entry == "alt:nodes-prefetch":
        workloads.fit_closing(None, bench.root, iterating(), workloads.loader(dataset), wrap=workloads.nodes_loader)
    elif entry in S1.alternatives:  # the simpler design composed with workers or nodes prefetching
        design, composition = entries.simpler_design_alternatives()[entry]
        if composition == "workers":
            workloads.fit_closing(design, bench.root, iterating(), with_workers())
        else:
            workloads.fit_closing(design, bench.root, iterating(), workloads.loader(dataset),
                                  wrap=workloads.nodes_loader)
    elif entry in WITH_WORKERS:
        workloads.fit_closing(WITH_WORKERS[entry], bench.root, iterating(), with_workers())
    else:
        workloads.fit(workloads.make_trainer(DESIGNS[entry], bench.root), iterating(), workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


@pytest.mark.parametrize(("point", "entry"), S1.cases, ids=[f"{p}-{e}" for p, e in S1.cases])
def test_s1_io_bound(benchmark, bench, point: str, entry: str) -> None:
    sizes = bench.sizes
    l_ms, c_ms = S1.targets(point, sizes.s1_base_ms)
    data = S1.measured(bench, point, partial(_once, bench))
    common = dict(point=point, L_target_ms=l_ms, C_target_ms=c_ms, L_over_C=l_ms / c_ms, n_batches=sizes.s1_batches,
                  timed_batches=sizes.s1_batches - 1 - sizes.skip)
    if entry in DESIGNS or entry in WITH_WORKERS:
        common["workers"] = workloads.ALTERNATIVE_WORKERS if entry in WITH_WORKERS else 0
    figures = S1.record(bench, benchmark, data, entry, common)

    if bench.measuring and entry in DESIGNS and entries.is_thread_configuration(DESIGNS[entry]):
        # the promise of the design's prefetch thread (Design.promised_s1_efficiency), a floor with a margin for
        # noise, applied to the efficiency of each entry's fastest round; the target itself is judged from the
        # interval, not asserted
        floor = DESIGNS[entry].promised_s1_efficiency.get(point)
        if floor is not None:
            assert figures.efficiency_best_rounds >= floor, (
                f"{entry} at {point}: overlap efficiency {figures.efficiency_best_rounds:.3f} (best rounds; median of"
                f" rounds {figures.efficiency['value']}) < {floor} (T {figures.t:.2f} ms, serial"
                f" {figures.t_serial:.2f} ms, ideal {figures.t_ideal:.2f} ms per batch, medians)"
            )
