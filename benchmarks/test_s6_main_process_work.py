"""S6 work in the transfer hooks: loading in DataLoader workers plus main-process work M per batch in the
batch-transfer hooks (the CPU stand-in for host-to-device copies and device-side augmentation), step compute C.

Loading (L = ``Sizes.s6_base_ms`` of sleep per item) runs in ``workloads.ALTERNATIVE_WORKERS`` DataLoader workers
with ``persistent_workers=True``, so it costs the main process little; M is calibrated matmuls in
``on_before_batch_transfer`` / ``on_after_batch_transfer``, at M/C = 0.5, 1 and 2. Per point, interleaved round by
round: stock Lightning's regular flavour over that loader (T_serial, and the first alternative: it is what a user
with workers runs today), the same loader wrapped in torchdata ``nodes`` prefetching under stock Lightning's
``dataloader_iter`` flavour (the second alternative), a load-only run (the loader plus the hooks' work, no step), a
step-only run (stock Lightning over batches already in memory, no hook work) and its raw-loop figure, and every
registered design as it ships, with its opt-in prefetch thread and, where it prefetches, at depth 0 and 2
(``benchmarks.entries``). Where a loop does not run the transfer hooks (stock Lightning's ``dataloader_iter``
flavour), the step runs them itself (``workloads.IterStep``), so every entry does the same work. What the two
overlap scenarios share is written once in ``benchmarks.scenario``.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import pytest

from benchmarks import calibration, entries, measuring, overlap, workloads
from benchmarks.conftest import FEATURES, ROWS
from benchmarks.scenario import OverlapScenario

pytestmark = [
    pytest.mark.benchmark(group="S6 main-process work in the transfer hooks (time per batch)",
                          timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test of a point measures the whole point; smoke mode takes seconds
]

DEPTHS = (0, 2)  # S3 and S4 run more depths; here no thread, and the fixed depth "auto" runs once it keeps its thread
SERIAL = "alt:workers"  # the stock regular flavour over the worker loader: the serial baseline and an alternative
S6 = OverlapScenario(
    name="S6",
    points={"M=0.5C": (0.5, 1.0), "M=C": (1.0, 1.0), "M=2C": (1.0, 0.5)},  # M and C as multiples of s6_base_ms
    baselines=(overlap.LOAD_ONLY, overlap.STEP_ONLY, overlap.STEP_ONLY_RAW),
    # What a user can do today with the same work: stock Lightning over the worker loader as is, or with it
    # prefetched by torchdata nodes, or the hook work moved into the DataLoader workers (where it can run: CPU work)
    # or into torchdata ParallelMapper threads; and the design without a thread over nodes prefetching.
    alternatives=(SERIAL, "alt:nodes-prefetch", "alt:hook-work-in-workers", "alt:hook-work-in-mapper-threads",
                  *entries.simpler_design_alternatives(("nodes-prefetch",))),
    flavours={overlap.LOAD_ONLY: "load-only (loader and hooks)", overlap.STEP_ONLY: "step-only",
              overlap.STEP_ONLY_RAW: "step-only (raw loop)", SERIAL: "regular", "alt:nodes-prefetch": "dataloader_iter",
              "alt:hook-work-in-workers": "regular", "alt:hook-work-in-mapper-threads": "regular"},
    designs=entries.design_entries(DEPTHS),
    serial=SERIAL,
)
MAPPER_THREADS = workloads.ALTERNATIVE_WORKERS


def _hook_work_ms(bench, n: int, iterations: int) -> float:
    """Milliseconds of one batch's hook work on this thread: the fastest of ``n`` (as the burner's own calibration,
    what it costs on a core nobody else is using; the pilot rounds then correct it under the load of the moment)."""
    samples = []
    for _ in range(n):
        start = time.perf_counter()
        bench.burner.run(iterations)
        samples.append((time.perf_counter() - start) * 1000.0)
    return min(samples)


def _knobs(bench, point: str) -> tuple[int, int]:
    """Matmul iterations of the hooks (M) and of the step (C) that measure this point's nominal M and C, under the
    load of the moment."""
    m_ms, c_ms = S6.targets(point, bench.sizes.s6_base_ms)
    hooks = bench.calibrated(f"S6 M={m_ms:g}", lambda: calibration.calibrate_step(
        partial(_hook_work_ms, bench, bench.sizes.calibration_batches), m_ms, bench.burner.ms_per_matmul))

    def pilot(m_knob: calibration.Knob, c_knob: calibration.Knob) -> tuple[float, float]:
        runs = {entry: partial(_run, bench, int(m_knob.value), int(c_knob.value), entry)
                for entry in (overlap.LOAD_ONLY, overlap.STEP_ONLY)}
        data = measuring.Interleaved(runs, bench.sizes.skip, bench.sizes.pilot_rounds, warmup=0)
        m = statistics.median(p.hook_ms_per_batch() or 0.0 for p in data.measurement(overlap.LOAD_ONLY).probes)
        return m, data.measurement(overlap.STEP_ONLY).median_ms

    work, step = S6.settled(bench, point, calibration.Knob(hooks.value, m_ms, hooks.overhead_ms, integer=True),
                            c_ms, pilot)
    return int(work.value), int(step.value)


def _once(bench, point: str, entry: str) -> measuring.Probe:
    return _run(bench, *_knobs(bench, point), entry)


def _run(bench, hook_iterations: int, iterations: int, entry: str) -> measuring.Probe:
    n = bench.sizes.s6_batches
    probe = measuring.Probe()
    in_workers = hook_iterations if entry == "alt:hook-work-in-workers" else 0
    dataset = workloads.TimedDataset(n, bench.sizes.s6_base_ms, probe, ROWS, FEATURES,
                                     burner=bench.burner, work_iterations=in_workers)
    data = workloads.loader(dataset, workloads.ALTERNATIVE_WORKERS)
    regular = partial(workloads.RegularStep, probe, FEATURES, bench.burner, iterations, hook_iterations)
    iterating = partial(workloads.IterStep, probe, FEATURES, bench.burner, iterations, hook_iterations)
    if entry == overlap.LOAD_ONLY:
        module = regular()  # only its hooks run: what the main process does per batch besides the step
        probe.epoch_started()
        try:
            for batch in data:
                module.on_after_batch_transfer(module.on_before_batch_transfer(batch, 0), 0)
                probe.batch_received(batch)
        finally:
            data._iterator._shutdown_workers()
        probe.epoch_ended()
    elif entry == overlap.STEP_ONLY:
        module = workloads.RegularStep(probe, FEATURES, bench.burner, iterations)
        workloads.run_step_only(module, [dataset.make(i) for i in range(n)], bench.root)
    elif entry == overlap.STEP_ONLY_RAW:
        module = workloads.RegularStep(probe, FEATURES, bench.burner, iterations)
        workloads.run_raw_step_only(module, [dataset.make(i) for i in range(n)])
    elif entry == SERIAL:
        workloads.fit_closing(None, bench.root, regular(), data)
    elif entry == "alt:nodes-prefetch":
        workloads.fit_closing(None, bench.root, iterating(), data, wrap=workloads.nodes_loader)
    elif entry == "alt:hook-work-in-workers":  # the work ran in the dataset, in the workers; the hooks do none
        workloads.fit_closing(None, bench.root, workloads.RegularStep(probe, FEATURES, bench.burner, iterations), data)
    elif entry == "alt:hook-work-in-mapper-threads":
        work = partial(_hook_work_on_batch, bench.burner, hook_iterations)
        workloads.fit_closing(None, bench.root, workloads.RegularStep(probe, FEATURES, bench.burner, iterations), data,
                              wrap=partial(workloads.mapped_loader, work, MAPPER_THREADS))
    elif entry in S6.alternatives:  # the simpler design over the worker loader prefetched by torchdata nodes
        design, _ = entries.simpler_design_alternatives(("nodes-prefetch",))[entry]
        workloads.fit_closing(design, bench.root, iterating(), data, wrap=workloads.nodes_loader)
    else:
        workloads.fit_closing(S6.designs[entry], bench.root, iterating(), data)
    measuring.check_exactly_once(probe.received, n)
    return probe


def _hook_work_on_batch(burner: workloads.Burner, iterations: int, batch):
    burner.run(iterations)
    return batch


@pytest.mark.parametrize(("point", "entry"), S6.cases, ids=[f"{p}-{e}" for p, e in S6.cases])
def test_s6_main_process_work(benchmark, bench, point: str, entry: str) -> None:
    sizes = bench.sizes
    m_ms, c_ms = S6.targets(point, sizes.s6_base_ms)
    data = S6.measured(bench, point, partial(_once, bench))
    # M as the hooks measured it on the main thread of the serial run, in the same rounds as everything else
    hook_ms = statistics.median(p.hook_ms_per_batch() or 0.0 for p in data.measurement(SERIAL).probes)
    common = dict(point=point, L_target_ms=sizes.s6_base_ms, workers=workloads.ALTERNATIVE_WORKERS,
                  M_target_ms=m_ms, C_target_ms=c_ms, M_over_C=m_ms / c_ms, M_ms=measuring.rounded(hook_ms),
                  n_batches=sizes.s6_batches, timed_batches=sizes.s6_batches - 1 - sizes.skip)
    S6.record(bench, benchmark, data, entry, common,
              added=lambda figures: dict(M_over_C_measured=measuring.rounded(hook_ms / figures.c)))
