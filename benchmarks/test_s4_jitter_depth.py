"""S4 jitter and depth: load times drawn per item (exponential, fixed seed, mean C), large batches.

The prefetcher runs at depth 1, 2, 4 and 8 (any registered design with a ``depth`` option does), every other
design at its defaults; baselines as in S1 (stock regular flavour, load-only, step-only); all interleaved round
by round. Per run: efficiency, peak process RSS (psutil, sampled whenever a batch is produced or received) and
peak batches in flight (produced by the dataset but not yet received by the step), both observed from the
dataset and step side.
"""

from __future__ import annotations

from functools import partial

import pytest

from benchmarks import harness
from prototypes import IMPLEMENTATIONS

pytestmark = [
    pytest.mark.benchmark(group="S4 jitter and depth (time per batch)", timer=harness.span_clock),
    pytest.mark.timeout(900),  # the first test measures every case, interleaved; smoke mode takes seconds
]

DEPTHS = (1, 2, 4, 8)
DEPTH_DESIGNS = ("prefetcher",)  # named by the issue; skipped with a reason until registered
BASELINES = ("baseline:regular", "baseline:load-only", "baseline:step-only")
FEATURES = 1023  # + the id column: 1024 float32 columns, 4 KiB per row
SEED = 7
PROMISED_EFFICIENCY_AT_DEPTH = {4: 0.5, 8: 0.5}  # asserted for depth designs in benchmark mode, on the best rounds


def _accepts_depth(name: str) -> bool:
    try:
        IMPLEMENTATIONS[name].variant(depth=1)
    except TypeError:
        return False
    return True


def _cases() -> list:
    cases = [pytest.param(who, None, id=who) for who in BASELINES]
    depth_names = sorted(set(DEPTH_DESIGNS) | {n for n in IMPLEMENTATIONS if _accepts_depth(n)})
    for name in IMPLEMENTATIONS:
        if name not in depth_names:
            cases.append(pytest.param(name, None, id=IMPLEMENTATIONS[name].id))
    for name in depth_names:
        for depth in DEPTHS:
            marks = () if name in IMPLEMENTATIONS else pytest.mark.skip(
                reason=f"design {name!r} is not registered in prototypes.IMPLEMENTATIONS yet"
            )
            cases.append(pytest.param(name, depth, id=f"{name}[depth={depth}]", marks=marks))
    return cases


def _key(who: str, depth: int | None) -> str:
    return who if depth is None else f"{who}[depth={depth}]"


def _design(who: str, depth: int | None):
    return IMPLEMENTATIONS[who] if depth is None else IMPLEMENTATIONS[who].variant(depth=depth)


def _once(bench, who: str, depth: int | None) -> harness.Probe:
    sizes = bench.sizes
    n = sizes.s4_batches
    iterations = bench.burner.iterations_for(sizes.s4_c_ms)
    probe = harness.Probe(track_rss=True)
    dataset = harness.TimedDataset(n, harness.jittered_loads(n, sizes.s4_c_ms, SEED), probe, sizes.s4_rows, FEATURES)
    if who == "baseline:load-only":
        harness.run_load_only(probe, harness.loader(dataset))
    elif who == "baseline:step-only":
        batches = [dataset.make(i) for i in range(n)]
        harness.run_step_only(harness.RegularStep(probe, FEATURES, bench.burner, iterations), batches)
        del batches
    elif who == "baseline:regular":
        module = harness.RegularStep(probe, FEATURES, bench.burner, iterations)
        harness.fit(harness.make_trainer(None, bench.root), module, harness.loader(dataset))
    else:
        module = harness.IterStep(probe, FEATURES, bench.burner, iterations)
        harness.fit(harness.make_trainer(_design(who, depth), bench.root), module, harness.loader(dataset))
    harness.check_exactly_once(probe.received, n)
    return probe


def _point(bench) -> harness.Interleaved:
    sizes = bench.sizes
    runs = {}
    for case in _cases():
        who, depth = case.values
        if who in IMPLEMENTATIONS or who in BASELINES:
            runs[_key(who, depth)] = partial(_once, bench, who, depth)
    return bench.store.point(("S4",), lambda: harness.Interleaved(runs, sizes.s4_batches, sizes.s4_rounds, sizes.warmup))


@pytest.fixture(scope="module")
def mmap_threshold(bench):
    if not bench.measuring:  # process-wide; only worth it when the RSS figures are kept
        return None
    threshold = harness.use_mmap_for_large_allocations()
    bench.store.notes["s4_malloc_mmap_threshold_bytes"] = threshold
    return threshold


@pytest.mark.parametrize(("who", "depth"), _cases())
def test_s4_jitter_depth(benchmark, bench, mmap_threshold, who: str, depth: int | None) -> None:
    sizes = bench.sizes
    n = sizes.s4_batches
    batch_mb = sizes.s4_rows * (FEATURES + 1) * 4 / 2**20
    data = _point(bench)
    measurement = data.measurement(_key(who, depth))
    harness.report(benchmark, measurement)
    common = dict(
        L_mean_ms=sizes.s4_c_ms, L_distribution=f"exponential, mean C, seed {SEED}", C_target_ms=sizes.s4_c_ms,
        n_batches=n, batch_mb=harness.rounded(batch_mb, 3),
        time_per_batch_ms=harness.rounded(measurement.median_ms),
        peak_rss_mb=harness.rounded(max(p.peak_rss for p in measurement.probes) / 2**20, 1),
        peak_rss_delta_mb=harness.rounded(max(p.peak_rss - p.rss_start for p in measurement.probes) / 2**20, 1),
        peak_in_flight=max(p.peak_in_flight for p in measurement.probes), rounds=measurement.rounds,
    )
    if who in BASELINES:
        row = dict(design=who, role="baseline", depth=None, **common)
        bench.extra_info(benchmark, row)
        bench.store.record("S4", row)
        return

    o = harness.overlap(data, measurement)
    design = _design(who, depth)
    row = dict(
        design=design.id, role="design", depth=depth, **common,
        L_ms=harness.rounded(o.l), C_ms=harness.rounded(o.c),
        t_serial_ms=harness.rounded(o.t_serial), t_ideal_ms=harness.rounded(o.t_ideal),
        efficiency=harness.rounded(o.efficiency), efficiency_best_rounds=harness.rounded(o.efficiency_best_rounds),
        in_flight_limit=None if depth is None else depth + 1,
    )
    bench.extra_info(benchmark, row)
    bench.store.record("S4", row)
    if bench.measuring and depth is not None:
        assert row["peak_in_flight"] <= depth + 1, (
            f"{design.id}: {row['peak_in_flight']} batches were produced but not yet received by the step,"
            f" more than depth + 1 = {depth + 1}"
        )
        floor = PROMISED_EFFICIENCY_AT_DEPTH.get(depth)
        if floor is not None:
            assert o.efficiency_best_rounds >= floor, (
                f"{design.id}: efficiency {o.efficiency_best_rounds:.3f} (best rounds; median-based {o.efficiency:.3f})"
                f" < {floor} under jitter"
            )
