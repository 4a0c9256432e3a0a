"""S3 overhead: a tiny model, no loading latency, no step compute; what does each design cost per batch?

Interleaved round by round in one session: a raw PyTorch loop over the same loader and model, stock Lightning's
regular flavour and its ``dataloader_iter`` flavour (today's), then every design as it ships with the plainest
``training_step(self, dataloader_iter)`` and, since every design must run the regular flavour as stock Lightning does
(C1), with ``training_step(self, batch, batch_idx)`` too; in the ``dataloader_iter`` flavour (the regular flavour does
not use the depth) also each design's opt-in prefetch thread and, where it prefetches, depth 0, 1, 2 and 4
(``benchmarks.entries``). These rounds give each entry's time per batch. The targets judge what each design ships.

Each design's flavour is judged against the same flavour of stock Lightning (``overhead_vs_stock``) in lockstep
pairs (``lockstep.lockstep``): the two runs take turns batch by batch on one core, so both see the machine at the
same moment, and each pair gives one ratio. Stock Lightning's flavour is also paired with itself (``AA_PAIR``): how
far apart identical entries land is measured in every run. An entry whose batches come from a background thread in
the timed window cannot be paired fairly (its thread would load during the other run's turn); its ratio comes from
the interleaved rounds, and its row says so (``paired``). A design that ships without a thread is paired; an opt-in
thread that has stopped itself before the window (``"auto"`` on this tiny step) is paired too. Every module here
defines the batch-transfer hooks: where the loop skips them (stock Lightning's flavour), the step runs them, so
every entry does the same work per batch.
"""

from __future__ import annotations

import cProfile
import pstats
from functools import partial

import pytest

from benchmarks import entries, intervals, lockstep, measuring, workloads
from benchmarks.conftest import FEATURES

pytestmark = [
    pytest.mark.benchmark(group="S3 overhead, tiny model, L = 0 (time per batch)", timer=measuring.span_clock),
    pytest.mark.timeout(900),  # the first test measures every case, interleaved; smoke mode takes seconds
]

# raw PyTorch, and stock Lightning's two flavours: today's regular and today's dataloader_iter flavour
BASELINES = ("baseline:raw-pytorch", "baseline:regular", "baseline:dataloader_iter")
REGULAR, STOCK_ITER = "baseline:regular--", "baseline:dataloader_iter--"
DEPTHS = (0, 1, 2, 4)
DESIGNS = entries.design_entries(DEPTHS)
CASES = [(entry, "-") for entry in BASELINES] + [
    (entry, flavour) for entry, design in DESIGNS.items()
    for flavour in (("dataloader_iter", "regular") if entries.configuration_of(design) == entries.SHIPS
                    else ("dataloader_iter",))
]
ROWS = 1  # batch size 1: the per-batch machinery dominates
AA_PAIR = "baseline:dataloader_iter"  # stock Lightning's flavour paired with itself: the lockstep's own spread


def _once(bench, entry: str, flavour: str, profile: cProfile.Profile | None = None) -> measuring.Probe:
    n = bench.sizes.s3_batches
    probe = measuring.Probe()
    probe.profile = profile
    dataset = workloads.TimedDataset(n, 0.0, probe, ROWS, FEATURES)
    if entry == "baseline:raw-pytorch":
        workloads.run_raw_loop(workloads.RegularStep(probe, FEATURES, bench.burner, 0), workloads.loader(dataset))
    else:
        iterating = flavour == "dataloader_iter" or entry == "baseline:dataloader_iter"
        module = (workloads.IterStep if iterating else workloads.RegularStep)(probe, FEATURES, bench.burner, 0)
        design = None if entry in BASELINES else DESIGNS[entry]
        workloads.fit(workloads.make_trainer(design, bench.root), module, workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, n)
    return probe


def _point(bench) -> measuring.Interleaved:
    runs = {f"{entry}-{flavour}": partial(_once, bench, entry, flavour) for entry, flavour in CASES}
    return bench.interleaved(("S3",), runs, bench.sizes.s3_rounds, bench.sizes.s3_warmup)


def _reference(entry: str, flavour: str) -> str:
    """The stock entry a case is judged against: the same flavour of stock Lightning."""
    return STOCK_ITER if flavour == "dataloader_iter" or entry == AA_PAIR else REGULAR


def _paired(bench) -> dict[str, list[lockstep.Pair]]:
    """Lockstep pairs per case (its key), each against its reference; rounds alternate which run goes first. An
    entry found running a thread in the window is not paired again (its list is emptied)."""
    cases = [(AA_PAIR, "-")] + [(entry, flavour) for entry, flavour in CASES if entry not in BASELINES]

    def measure() -> dict[str, list[lockstep.Pair]]:
        pairs: dict[str, list[lockstep.Pair]] = {f"{entry}-{flavour}": [] for entry, flavour in cases}
        threaded: set[str] = set()
        rounds = bench.sizes.s3_pairs
        for r in range(rounds):
            if bench.progress is not None:
                bench.progress("S3 lockstep", len(cases), r, rounds, 0)
            for entry, flavour in cases:
                key = f"{entry}-{flavour}"
                if key in threaded:
                    continue
                reference = _reference(entry, flavour).removesuffix("--")
                runs = (partial(_once, bench, reference, "-"), partial(_once, bench, entry, flavour))
                pair = lockstep.lockstep(*(runs if r % 2 == 0 else runs[::-1]), bench.sizes.s3_skip)
                if pair.threaded:
                    threaded.add(key)
                    pairs[key] = []
                    continue
                pairs[key].append(pair if r % 2 == 0 else lockstep.Pair(pair.second_s, pair.first_s, False))
        if bench.progress is not None:
            bench.progress("S3 lockstep", len(cases), rounds, rounds, 0)
        return pairs

    return bench.store.point(("S3", "lockstep"), measure)


def _paired_ratio(bench, key: str) -> dict | None:
    """Median and 95 % interval of a case's lockstep ratios (design over stock), None if it could not be paired."""
    pairs = _paired(bench)[key]
    return intervals.summary([pair.ratio for pair in pairs]) if pairs else None


@pytest.mark.parametrize(("entry", "flavour"), CASES, ids=[e if f == "-" else f"{e}-{f}" for e, f in CASES])
def test_s3_overhead(benchmark, bench, entry: str, flavour: str) -> None:
    n = bench.sizes.s3_batches
    data = _point(bench)
    measurement = bench.reported(benchmark, data, f"{entry}-{flavour}")
    t = measurement.median_ms
    if entry in BASELINES:
        kind = {"baseline:raw-pytorch": "raw", "baseline:regular": "regular"}.get(entry, "dataloader_iter")
        row = dict(design=entry, role="baseline", flavour=kind, n_batches=n, time_per_batch_ms=measuring.rounded(t),
                   rounds=measurement.rounds)
        if entry == AA_PAIR:
            # the lockstep's own spread: stock Lightning's flavour over itself, which a perfect method puts at 1
            identical = _paired_ratio(bench, f"{entry}--")
            row.update(same_entry_ratio=identical["value"], same_entry_ratio_interval=identical["interval"],
                       pairs=len(_paired(bench)[f"{entry}--"]))
    else:
        key = f"{entry}-{flavour}"
        regular = data.measurement(REGULAR).median_ms
        raw = data.measurement("baseline:raw-pytorch--").median_ms
        # each flavour against the same flavour of stock Lightning: what the design adds to it, from lockstep pairs
        # where the entry could be paired, else from the interleaved rounds
        interleaved = data.ratio(key, _reference(entry, flavour))
        paired = _paired_ratio(bench, key)
        same_flavour = paired or interleaved
        design = DESIGNS[entry]
        row = dict(
            **entries.design_fields(design), flavour=flavour,
            off_main_thread=entries.off_main_share(measurement.probes), n_batches=n,
            time_per_batch_ms=measuring.rounded(t), t_regular_ms=measuring.rounded(regular),
            t_stock_iter_ms=measuring.rounded(data.measurement(STOCK_ITER).median_ms),
            t_raw_ms=measuring.rounded(raw), overhead_vs_regular=measuring.rounded(t / regular),
            overhead_vs_stock=same_flavour["value"], overhead_vs_stock_interval=same_flavour["interval"],
            overhead_vs_raw=measuring.rounded(t / raw), rounds=measurement.rounds,
            paired=paired is not None, pairs=len(_paired(bench)[key]),
            overhead_vs_stock_interleaved=interleaved["value"],
            overhead_vs_stock_interleaved_interval=interleaved["interval"],
        )
    bench.record(benchmark, "S3", row)


# ------------------------------------------------------------------------------------------------- where it goes
PROFILED_FUNCTIONS = 8  # per profiled entry: the functions with the most main-thread time per batch above stock's


def _profiled(bench, entry: str, flavour: str) -> dict[str, float]:
    """Main-thread seconds per batch by function (own time, cProfile) from epoch start to epoch end of one run of
    this S3 entry."""
    profile = cProfile.Profile()
    _once(bench, entry, flavour, profile)
    n = bench.sizes.s3_batches
    own: dict[str, float] = {}
    for (path, line, function), (_, _, tottime, _, _) in pstats.Stats(profile).stats.items():
        short = path.split("site-packages/")[-1].replace(str(workloads.REPO_ROOT) + "/", "")
        key = f"{short}:{line}({function})"
        own[key] = own.get(key, 0.0) + tottime / n
    return own


@pytest.mark.benchmark(group="S3 profile (wall time of the profiled runs, not a measurement)")
def test_s3_where_the_main_thread_time_goes(benchmark, bench) -> None:
    """A profile of the main thread of each prefetching design's ``dataloader_iter`` entries against stock's
    regular flavour: where the per-batch time S3 measures above stock goes (the hand-off included: a main thread
    waiting for the prefetch thread shows as time in the queue's and locks' functions). One profiled run each, after
    the measured rounds. cProfile slows every call, and a function's time on the main thread includes waiting for
    the GIL while the prefetch thread holds it, so the figures locate the cost; the S3 rows size it."""
    _point(bench)  # after the measurement, never in its rounds
    benchmark.pedantic(_profile_every_prefetching_entry, args=(bench,), rounds=1, warmup_rounds=0)


def _profile_every_prefetching_entry(bench) -> None:
    stock = _profiled(bench, "baseline:regular", "-")
    prefetching = [entry for entry, design in DESIGNS.items() if design.prefetch_depth_option]
    for entry in prefetching:
        own = _profiled(bench, entry, "dataloader_iter")
        excess = sorted(((own.get(k, 0.0) - stock.get(k, 0.0), k) for k in set(own) | set(stock)), reverse=True)
        for extra_s, function in excess[:PROFILED_FUNCTIONS]:
            bench.store.record("S3-profile", dict(
                design=DESIGNS[entry].id, role="design", function=function,
                us_per_batch=measuring.rounded(own.get(function, 0.0) * 1e6, 1),
                stock_us_per_batch=measuring.rounded(stock.get(function, 0.0) * 1e6, 1),
                extra_us_per_batch=measuring.rounded(extra_s * 1e6, 1),
            ))
