"""S4 jitter and depth: load times drawn per item (exponential, fixed seed, mean C), large batches.

Every design runs as it ships, and every design that prefetches (``Design.prefetch_depth_option``) also at depth
1, 2, 4 and 8; baselines as in S1 (stock regular flavour, load-only, step-only through stock Lightning and its
raw-loop figure); all interleaved round by round. Per run: efficiency, peak process RSS (psutil, sampled whenever a
batch is produced or received) and peak batches in flight (produced by the dataset but not yet received by the step),
both observed from the dataset and step side.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import entries, measuring, overlap, workloads

pytestmark = [
    pytest.mark.benchmark(group="S4 jitter and depth (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test measures every case, interleaved; smoke mode takes seconds
]

DEPTHS = (1, 2, 4, 8)
BASELINES = (overlap.SERIAL, overlap.LOAD_ONLY, overlap.STEP_ONLY, overlap.STEP_ONLY_RAW)
# S4 judges fixed depths: the opt-in thread's own depth (2, once "auto" keeps its thread) runs among them
DESIGNS = entries.design_entries(DEPTHS, with_opt_in_thread=False)
FEATURES = 1023  # + the id column: 1024 float32 columns, 4 KiB per row
SEED = 7
CASES = [*BASELINES, *DESIGNS]


def _once(bench, entry: str) -> measuring.Probe:
    sizes = bench.sizes
    n = sizes.s4_batches
    iterations = bench.burner.iterations_for(sizes.s4_c_ms)
    probe = measuring.Probe(track_rss=True)
    loads = workloads.jittered_loads(n, sizes.s4_c_ms, SEED)
    dataset = workloads.TimedDataset(n, loads, probe, sizes.s4_rows, FEATURES)
    regular = workloads.RegularStep(probe, FEATURES, bench.burner, iterations)
    if entry == overlap.LOAD_ONLY:
        workloads.run_load_only(probe, workloads.loader(dataset))
    elif entry in (overlap.STEP_ONLY, overlap.STEP_ONLY_RAW):
        batches = [dataset.make(i) for i in range(n)]
        if entry == overlap.STEP_ONLY:
            workloads.run_step_only(regular, batches, bench.root)
        else:
            workloads.run_raw_step_only(regular, batches)
        del batches
    elif entry == overlap.SERIAL:
        workloads.fit(workloads.make_trainer(None, bench.root), regular, workloads.loader(dataset))
    else:
        module = workloads.IterStep(probe, FEATURES, bench.burner, iterations)
        workloads.fit(workloads.make_trainer(DESIGNS[entry], bench.root), module, workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


def _point(bench) -> measuring.Interleaved:
    runs = {entry: partial(_once, bench, entry) for entry in CASES}
    return bench.interleaved(("S4",), runs, bench.sizes.s4_rounds, bench.sizes.warmup)


@pytest.fixture(scope="module")
def mmap_threshold(bench):
    if not bench.measuring:  # process-wide; only worth it when the RSS figures are kept
        return None
    threshold = measuring.use_mmap_for_large_allocations()
    bench.store.notes["s4_malloc_mmap_threshold_bytes"] = threshold
    return threshold


@pytest.mark.parametrize("entry", CASES)
def test_s4_jitter_depth(benchmark, bench, mmap_threshold, entry: str) -> None:
    sizes = bench.sizes
    n = sizes.s4_batches
    batch_mb = sizes.s4_rows * (FEATURES + 1) * 4 / 2**20
    data = _point(bench)
    measurement = bench.reported(benchmark, data, entry)
    common = dict(
        L_mean_ms=sizes.s4_c_ms, L_distribution=f"exponential, mean C, seed {SEED}", C_target_ms=sizes.s4_c_ms,
        n_batches=n, batch_mb=measuring.rounded(batch_mb, 3),
        time_per_batch_ms=measuring.rounded(measurement.median_ms),
        peak_rss_mb=measuring.rounded(max(p.peak_rss for p in measurement.probes) / 2**20, 1),
        peak_rss_delta_mb=measuring.rounded(max(p.peak_rss - p.rss_start for p in measurement.probes) / 2**20, 1),
        peak_in_flight=max(p.peak_in_flight for p in measurement.probes), rounds=measurement.rounds,
    )
    if entry in BASELINES:
        bench.record(benchmark, "S4", dict(design=entry, role="baseline", depth=None, **common))
        return

    o = overlap.overlap(data, entry)
    design = DESIGNS[entry]
    depth = entries.depth_of(design)
    figures = o.row()
    row = dict(
        **entries.design_fields(design), off_main_thread=entries.off_main_share(measurement.probes), **common,
        **{k: figures[k] for k in ("L_ms", "C_ms", "C_raw_ms", "t_serial_ms", "t_ideal_ms", "t_ideal_raw_ms",
                                   "efficiency", "efficiency_interval", "efficiency_raw_ideal",
                                   "efficiency_best_rounds")},
        in_flight_limit=depth + 1 if isinstance(depth, int) else None,  # a depth the design chooses: no fixed limit
    )
    bench.record(benchmark, "S4", row)
    if bench.measuring and row["in_flight_limit"] is not None:
        assert row["peak_in_flight"] <= depth + 1, (
            f"{design.id}: {row['peak_in_flight']} batches were produced but not yet received by the step,"
            f" more than depth + 1 = {depth + 1}"
        )
        floor = design.promised_s4_efficiency_at_depth.get(depth)  # on the best rounds
        if floor is not None:
            assert o.efficiency_best_rounds >= floor, (
                f"{design.id}: efficiency {o.efficiency_best_rounds:.3f} (best rounds; median of rounds"
                f" {o.efficiency['value']}) < {floor} under jitter"
            )
