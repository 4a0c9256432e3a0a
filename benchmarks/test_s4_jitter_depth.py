"""S4 jitter and depth: load times drawn per item (exponential, fixed seed, mean C), large batches.

Every design runs at its defaults, and every design that prefetches (``Design.prefetch_depth_option``) also at depth
1, 2, 4 and 8; baselines as in S1 (stock regular flavour, load-only, step-only through stock Lightning and its
raw-loop figure); all interleaved round by round. Per run: efficiency, peak process RSS (psutil, sampled whenever a
batch is produced or received) and peak batches in flight (produced by the dataset but not yet received by the step),
both observed from the dataset and step side.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import measuring, workloads

pytestmark = [
    pytest.mark.benchmark(group="S4 jitter and depth (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test measures every case, interleaved; smoke mode takes seconds
]

DEPTHS = (1, 2, 4, 8)
BASELINES = (measuring.SERIAL, measuring.LOAD_ONLY, measuring.STEP_ONLY, measuring.STEP_ONLY_RAW)
ENTRIES = workloads.design_entries(DEPTHS)
FEATURES = 1023  # + the id column: 1024 float32 columns, 4 KiB per row
SEED = 7
CASES = [*BASELINES, *ENTRIES]


def _once(bench, who: str) -> measuring.Probe:
    sizes = bench.sizes
    n = sizes.s4_batches
    iterations = bench.burner.iterations_for(sizes.s4_c_ms)
    probe = measuring.Probe(track_rss=True)
    loads = workloads.jittered_loads(n, sizes.s4_c_ms, SEED)
    dataset = workloads.TimedDataset(n, loads, probe, sizes.s4_rows, FEATURES)
    regular = workloads.RegularStep(probe, FEATURES, bench.burner, iterations)
    if who == measuring.LOAD_ONLY:
        workloads.run_load_only(probe, workloads.loader(dataset))
    elif who in (measuring.STEP_ONLY, measuring.STEP_ONLY_RAW):
        batches = [dataset.make(i) for i in range(n)]
        if who == measuring.STEP_ONLY:
            workloads.run_step_only(regular, batches, bench.root)
        else:
            workloads.run_raw_step_only(regular, batches)
        del batches
    elif who == measuring.SERIAL:
        workloads.fit(workloads.make_trainer(None, bench.root), regular, workloads.loader(dataset))
    else:
        module = workloads.IterStep(probe, FEATURES, bench.burner, iterations)
        workloads.fit(workloads.make_trainer(ENTRIES[who], bench.root), module, workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


def _point(bench) -> measuring.Interleaved:
    runs = {who: partial(_once, bench, who) for who in CASES}
    return bench.interleaved(("S4",), runs, bench.sizes.s4_rounds, bench.sizes.warmup)


@pytest.fixture(scope="module")
def mmap_threshold(bench):
    if not bench.measuring:  # process-wide; only worth it when the RSS figures are kept
        return None
    threshold = measuring.use_mmap_for_large_allocations()
    bench.store.notes["s4_malloc_mmap_threshold_bytes"] = threshold
    return threshold


@pytest.mark.parametrize("who", CASES)
def test_s4_jitter_depth(benchmark, bench, mmap_threshold, who: str) -> None:
    sizes = bench.sizes
    n = sizes.s4_batches
    batch_mb = sizes.s4_rows * (FEATURES + 1) * 4 / 2**20
    data = _point(bench)
    measurement = data.measurement(who)
    measuring.report(benchmark, measurement)
    common = dict(
        L_mean_ms=sizes.s4_c_ms, L_distribution=f"exponential, mean C, seed {SEED}", C_target_ms=sizes.s4_c_ms,
        n_batches=n, batch_mb=measuring.rounded(batch_mb, 3),
        time_per_batch_ms=measuring.rounded(measurement.median_ms),
        peak_rss_mb=measuring.rounded(max(p.peak_rss for p in measurement.probes) / 2**20, 1),
        peak_rss_delta_mb=measuring.rounded(max(p.peak_rss - p.rss_start for p in measurement.probes) / 2**20, 1),
        peak_in_flight=max(p.peak_in_flight for p in measurement.probes), rounds=measurement.rounds,
    )
    if who in BASELINES:
        row = dict(design=who, role="baseline", depth=None, **common)
        bench.extra_info(benchmark, row)
        bench.store.record("S4", row)
        return

    o = measuring.overlap(data, who)
    design = ENTRIES[who]
    depth = workloads.depth_of(design)
    figures = o.row()
    row = dict(
        design=design.id, role="design", depth=depth, default=workloads.is_default(design),
        off_main_thread=workloads.off_main_share(measurement.probes), **common,
        **{k: figures[k] for k in ("L_ms", "C_ms", "C_raw_ms", "t_serial_ms", "t_ideal_ms", "t_ideal_raw_ms",
                                   "efficiency", "efficiency_interval", "efficiency_raw_ideal",
                                   "efficiency_best_rounds")},
        in_flight_limit=depth + 1 if isinstance(depth, int) else None,  # a depth the design chooses: no fixed limit
    )
    bench.extra_info(benchmark, row)
    bench.store.record("S4", row)
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
