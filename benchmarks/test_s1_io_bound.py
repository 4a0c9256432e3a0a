"""S1 I/O-bound loading: items take L ms to produce (sleep), the step computes C ms; does loading overlap the step?

Per L/C point, interleaved round by round in one session: stock Lightning's regular flavour (T_serial), a
load-only run and a step-only run (stock Lightning's loop over batches already in memory, the same step; T_ideal is
the larger of the two), the same step in a raw PyTorch loop (the raw-loop figure), the alternatives a user has
today (stock regular flavour with DataLoader workers; stock ``dataloader_iter`` flavour over the loader wrapped in
torchdata ``nodes`` prefetching), and every registered design running the plainest
``training_step(self, dataloader_iter)``, the prefetching ones also at depth 0, 1, 2 and 4. Before the rounds, the
step's work and the load's sleep are calibrated so that the step-only and load-only runs measure the nominal C and
L. Efficiency e = (T_serial - T) / (T_serial - T_ideal): 0 is no overlap, 1 is perfect overlap.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import measuring, workloads
from benchmarks.conftest import FEATURES, ROWS

pytestmark = [
    pytest.mark.benchmark(group="S1 I/O-bound loading (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test of a point measures the whole point; smoke mode takes seconds
]

# point -> (L, C) as multiples of Sizes.s1_base_ms: the longer of the two is always the base, which keeps the
# serial run of L = 2C as cheap as that of L = C/2.
POINTS = {"L=0.5C": (0.5, 1.0), "L=C": (1.0, 1.0), "L=2C": (1.0, 0.5)}
DEPTHS = (0, 2)  # S3 and S4 run more depths; here the fixed depth the default runs at once it keeps its thread, and 0
BASELINES = (measuring.SERIAL, measuring.LOAD_ONLY, measuring.STEP_ONLY, measuring.STEP_ONLY_RAW)
ENTRIES = workloads.design_entries(DEPTHS)
# What a user runs today, and the simpler design with it: stock Lightning with workers, stock Lightning's
# dataloader_iter flavour over torchdata nodes prefetching, and the design without a thread composed with each.
ALTERNATIVES = ("alt:workers", "alt:nodes-prefetch", *workloads.simpler_design_alternatives())
# Every prefetching design at its defaults also over the worker loader: does the thread still help with workers?
WITH_WORKERS = {f"{d.id}+workers": d for d in ENTRIES.values() if d.prefetch_depth_option and workloads.is_default(d)}
FLAVOUR = {measuring.SERIAL: "regular", measuring.LOAD_ONLY: "load-only", measuring.STEP_ONLY: "step-only",
           measuring.STEP_ONLY_RAW: "step-only (raw loop)", "alt:workers": "regular",
           "alt:nodes-prefetch": "dataloader_iter"}
EVERY = (*BASELINES, *ALTERNATIVES, *ENTRIES, *WITH_WORKERS)
CASES = [(point, who) for point in POINTS for who in EVERY]


def _targets(bench, point: str) -> tuple[float, float]:
    l_factor, c_factor = POINTS[point]
    return l_factor * bench.sizes.s1_base_ms, c_factor * bench.sizes.s1_base_ms


def _load_only_ms(n: int, sleep_ms: float) -> float:
    def run(probe: measuring.Probe) -> None:
        workloads.run_load_only(probe, workloads.loader(workloads.TimedDataset(n, sleep_ms, probe, ROWS, FEATURES)))
    return workloads.timed_epoch(run)


def _knobs(bench, point: str) -> tuple[int, float]:
    """Matmul iterations and sleep (ms) that make this point's step-only and load-only runs measure its C and L,
    under the load of the moment (``workloads.settle``)."""
    l_ms, c_ms = _targets(bench, point)
    n = bench.sizes.calibration_batches
    step = bench.calibrated(f"S1 C={c_ms:g}", lambda: workloads.calibrate_step(
        partial(workloads.step_only_ms, bench.burner, bench.root, ROWS, FEATURES, n), c_ms, bench.burner.ms_per_matmul))
    load = bench.calibrated(f"S1 L={l_ms:g}", lambda: workloads.calibrate_load(partial(_load_only_ms, n), l_ms))

    def pilot(l_knob: workloads.Knob, c_knob: workloads.Knob) -> tuple[float, float]:
        runs = {who: partial(_run, bench, int(c_knob.value), l_knob.value, who)
                for who in (measuring.LOAD_ONLY, measuring.STEP_ONLY)}
        medians = workloads.pilot_medians(runs, bench.sizes.skip, bench.sizes.pilot_rounds)
        return medians[measuring.LOAD_ONLY], medians[measuring.STEP_ONLY]

    settled = bench.calibrated(f"S1 {point}", lambda: workloads.settle(
        pilot, workloads.Knob(load.value, l_ms, load.first_ms - l_ms, integer=False),
        workloads.Knob(step.value, c_ms, step.overhead_ms, integer=True), bench.sizes.recalibrations))
    return int(settled.second.value), settled.first.value


def _once(bench, point: str, who: str) -> measuring.Probe:
    iterations, sleep_ms = _knobs(bench, point)
    return _run(bench, iterations, sleep_ms, who)


def _run(bench, iterations: int, sleep_ms: float, who: str) -> measuring.Probe:
    n = bench.sizes.s1_batches
    probe = measuring.Probe()
    dataset = workloads.TimedDataset(n, sleep_ms, probe, ROWS, FEATURES)
    regular = partial(workloads.RegularStep, probe, FEATURES, bench.burner, iterations)
    iterating = partial(workloads.IterStep, probe, FEATURES, bench.burner, iterations)
    with_workers = partial(workloads.loader, dataset, workloads.ALTERNATIVE_WORKERS)
    if who == measuring.LOAD_ONLY:
        workloads.run_load_only(probe, workloads.loader(dataset))
    elif who == measuring.STEP_ONLY:
        workloads.run_step_only(regular(), [dataset.make(i) for i in range(n)], bench.root)
    elif who == measuring.STEP_ONLY_RAW:
        workloads.run_raw_step_only(regular(), [dataset.make(i) for i in range(n)])
    elif who == measuring.SERIAL:
        workloads.fit(workloads.make_trainer(None, bench.root), regular(), workloads.loader(dataset))
    elif who == "alt:workers":
        workloads.fit_closing(None, bench.root, regular(), with_workers())
    elif who == "alt:nodes-prefetch":
        workloads.fit_closing(None, bench.root, iterating(), workloads.loader(dataset), wrap=workloads.nodes_loader)
    elif who in ALTERNATIVES:  # the simpler design composed with workers or nodes prefetching
        design, composition = workloads.simpler_design_alternatives()[who]
        if composition == "workers":
            workloads.fit_closing(design, bench.root, iterating(), with_workers())
        else:
            workloads.fit_closing(design, bench.root, iterating(), workloads.loader(dataset),
                                  wrap=workloads.nodes_loader)
    elif who in WITH_WORKERS:
        workloads.fit_closing(WITH_WORKERS[who], bench.root, iterating(), with_workers())
    else:
        workloads.fit(workloads.make_trainer(ENTRIES[who], bench.root), iterating(), workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


def _point(bench, point: str) -> measuring.Interleaved:
    runs = {who: partial(_once, bench, point, who) for who in EVERY}
    return bench.interleaved(("S1", point), runs, bench.sizes.rounds, bench.sizes.warmup)


@pytest.mark.parametrize(("point", "who"), CASES, ids=[f"{p}-{w}" for p, w in CASES])
def test_s1_io_bound(benchmark, bench, point: str, who: str) -> None:
    sizes = bench.sizes
    l_ms, c_ms = _targets(bench, point)
    data = _point(bench, point)
    measurement = data.measurement(who)
    measuring.report(benchmark, measurement)
    common = dict(point=point, L_target_ms=l_ms, C_target_ms=c_ms, L_over_C=l_ms / c_ms, n_batches=sizes.s1_batches,
                  timed_batches=sizes.s1_batches - 1 - sizes.skip)

    if who in BASELINES:
        row = dict(design=who, role="baseline", flavour=FLAVOUR[who], **common,
                   time_per_batch_ms=measuring.rounded(measurement.median_ms), rounds=measurement.rounds)
        bench.extra_info(benchmark, row)
        bench.store.record("S1", row)
        return

    o = measuring.overlap(data, who)
    if who in ALTERNATIVES:
        row = dict(design=who, role="alternative", flavour=FLAVOUR.get(who, "dataloader_iter"), **common, **o.row(),
                   rounds=measurement.rounds)
    else:
        design = ENTRIES.get(who) or WITH_WORKERS[who]
        row = dict(design=design.id if who in ENTRIES else who, role="design", flavour="dataloader_iter",
                   depth=workloads.depth_of(design), default=who in ENTRIES and workloads.is_default(design),
                   workers=workloads.ALTERNATIVE_WORKERS if who in WITH_WORKERS else 0,
                   off_main_thread=workloads.off_main_share(measurement.probes), **common, **o.row(),
                   **measuring.versus_alternatives(data, who, ALTERNATIVES),
                   **workloads.versus_fixed_depths(data, who, design, ENTRIES), rounds=measurement.rounds)
    bench.extra_info(benchmark, row)
    bench.store.record("S1", row)

    if bench.measuring and who in ENTRIES and workloads.is_default(ENTRIES[who]):
        # the design's own promise (Design.promised_s1_efficiency), a floor with a margin for noise, applied to the
        # efficiency of each entry's fastest round; the target itself is judged from the interval, not asserted
        floor = ENTRIES[who].promised_s1_efficiency.get(point)
        if floor is not None:
            assert o.efficiency_best_rounds >= floor, (
                f"{who} at {point}: overlap efficiency {o.efficiency_best_rounds:.3f} (best rounds; median of rounds"
                f" {o.efficiency['value']}) < {floor} (T {o.t:.2f} ms, serial {o.t_serial:.2f} ms, ideal"
                f" {o.t_ideal:.2f} ms per batch, medians)"
            )
