"""S4 jitter and depth: load times drawn per item (exponential, fixed seed, mean C), large batches.

Every design that prefetches (``Design.prefetch_depth_option``) runs at depth 1, 2, 4 and 8, every other
design at its defaults; baselines as in S1 (stock regular flavour, load-only, step-only); all interleaved round
by round. Per run: efficiency, peak process RSS (psutil, sampled whenever a batch is produced or received) and
peak batches in flight (produced by the dataset but not yet received by the step), both observed from the
dataset and step side.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import measuring, workloads
from prototypes import IMPLEMENTATIONS

pytestmark = [
    pytest.mark.benchmark(group="S4 jitter and depth (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test measures every case, interleaved; smoke mode takes seconds
]

DEPTHS = (1, 2, 4, 8)
BASELINES = ("baseline:regular", "baseline:load-only", "baseline:step-only")
FEATURES = 1023  # + the id column: 1024 float32 columns, 4 KiB per row
SEED = 7


def _cases() -> list:
    cases = [pytest.param(who, None, id=who) for who in BASELINES]
    prefetching = [name for name, design in IMPLEMENTATIONS.items() if design.prefetch_depth_option]
    cases += [pytest.param(name, None, id=design.id) for name, design in IMPLEMENTATIONS.items()
              if name not in prefetching]
    cases += [pytest.param(name, depth, id=_key(name, depth)) for name in prefetching for depth in DEPTHS]
    return cases


def _key(who: str, depth: int | None) -> str:
    return who if depth is None else _design(who, depth).id


def _design(who: str, depth: int | None):
    design = IMPLEMENTATIONS[who]
    return design if depth is None else design.variant(**{design.prefetch_depth_option: depth})


def _once(bench, who: str, depth: int | None) -> measuring.Probe:
    sizes = bench.sizes
    n = sizes.s4_batches
    iterations = bench.burner.iterations_for(sizes.s4_c_ms)
    probe = measuring.Probe(track_rss=True)
    dataset = workloads.TimedDataset(n, workloads.jittered_loads(n, sizes.s4_c_ms, SEED), probe, sizes.s4_rows, FEATURES)
    if who == "baseline:load-only":
        workloads.run_load_only(probe, workloads.loader(dataset))
    elif who == "baseline:step-only":
        batches = [dataset.make(i) for i in range(n)]
        workloads.run_step_only(workloads.RegularStep(probe, FEATURES, bench.burner, iterations), batches)
        del batches
    elif who == "baseline:regular":
        module = workloads.RegularStep(probe, FEATURES, bench.burner, iterations)
        workloads.fit(workloads.make_trainer(None, bench.root), module, workloads.loader(dataset))
    else:
        module = workloads.IterStep(probe, FEATURES, bench.burner, iterations)
        workloads.fit(workloads.make_trainer(_design(who, depth), bench.root), module, workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


def _point(bench) -> measuring.Interleaved:
    sizes = bench.sizes
    runs = {}
    for case in _cases():
        who, depth = case.values
        if who in IMPLEMENTATIONS or who in BASELINES:
            runs[_key(who, depth)] = partial(_once, bench, who, depth)
    return bench.store.point(("S4",), lambda: measuring.Interleaved(runs, sizes.s4_batches, sizes.s4_rounds, sizes.warmup))


@pytest.fixture(scope="module")
def mmap_threshold(bench):
    if not bench.measuring:  # process-wide; only worth it when the RSS figures are kept
        return None
    threshold = measuring.use_mmap_for_large_allocations()
    bench.store.notes["s4_malloc_mmap_threshold_bytes"] = threshold
    return threshold


@pytest.mark.parametrize(("who", "depth"), _cases())
def test_s4_jitter_depth(benchmark, bench, mmap_threshold, who: str, depth: int | None) -> None:
    sizes = bench.sizes
    n = sizes.s4_batches
    batch_mb = sizes.s4_rows * (FEATURES + 1) * 4 / 2**20
    data = _point(bench)
    measurement = data.measurement(_key(who, depth))
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

    o = measuring.overlap(data, measurement)
    design = _design(who, depth)
    row = dict(
        design=design.id, role="design", depth=depth, **common,
        L_ms=measuring.rounded(o.l), C_ms=measuring.rounded(o.c),
        t_serial_ms=measuring.rounded(o.t_serial), t_ideal_ms=measuring.rounded(o.t_ideal),
        efficiency=measuring.rounded(o.efficiency), efficiency_best_rounds=measuring.rounded(o.efficiency_best_rounds),
        in_flight_limit=None if depth is None else depth + 1,
    )
    bench.extra_info(benchmark, row)
    bench.store.record("S4", row)
    if bench.measuring and depth is not None:
        assert row["peak_in_flight"] <= depth + 1, (
            f"{design.id}: {row['peak_in_flight']} batches were produced but not yet received by the step,"
            f" more than depth + 1 = {depth + 1}"
        )
        floor = design.promised_s4_efficiency_at_depth.get(depth)  # on the best rounds
        if floor is not None:
            assert o.efficiency_best_rounds >= floor, (
                f"{design.id}: efficiency {o.efficiency_best_rounds:.3f} (best rounds; median-based {o.efficiency:.3f})"
                f" < {floor} under jitter"
            )
