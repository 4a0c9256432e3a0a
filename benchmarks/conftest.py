"""Benchmark session plumbing: smoke mode by default, measurements with ``--benchmark-only``, results JSON.

- Plain ``pytest``: pytest-benchmark's fixture is disabled for these tests, so every scenario runs once with small
  sizes as a correctness smoke test (batches exactly once, in order; S2's weights equal the unpipelined step's),
  and no timing is asserted.
- ``pytest --benchmark-only`` (or ``--benchmark-enable``): full sizes, warm-up plus measured rounds, medians, the
  promised figures asserted with noise margins, a verdict per target at the end (``summary.py``; pytest-benchmark's
  tables with ``--benchmark-tables``), and at session end ``rfc/results/benchmarks-<machine>.json``, named for the
  machine it describes (``harness_common.machine_file_name()``: ``benchmarks-x86_64-linux-2cpu.json``). A run that
  did not cover S1-S4 and S6 (for example ``-k S1``) writes ``.benchmarks/benchmarks-<machine>.partial.json``
  instead, so it never clobbers a full result; ``BENCHMARKS_RESULTS=path`` overrides where the file goes.
- Every registered design is measured, and so is each design from outside this repository that ``--design`` names
  (``--design package.module:ATTR`` or an installed entry point; see the conformance plugin).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks import results, summary, workloads
from benchmarks.measuring import Interleaved, Measurement, report
from harness_common import SelectionError, select_designs
from prototypes import DESIGNS, Design


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("benchmark").addoption(
        "--benchmark-tables", action="store_true", default=False,
        help="also print pytest-benchmark's own tables (wide) before the verdict summary; without it a measuring "
             "run reports as if --benchmark-quiet were given",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the outside designs ``--design`` names for this session, before the scenarios read the registry.

    A measuring run ends with the targets' verdicts (``summary.py``); pytest-benchmark's tables, wider than most
    terminals, print only with ``--benchmark-tables``. pytest-benchmark reads its options after this hook (its own
    ``pytest_configure`` runs last), so quiet here is quiet there.
    """
    if measuring(config) and not config.getoption("--benchmark-tables"):
        config.option.benchmark_quiet = True
    outside: dict[str, Design] = {}
    try:
        selected = select_designs(config.getoption("design"))
    except SelectionError as error:
        raise pytest.UsageError(str(error)) from None
    for design in selected:
        if design.name not in DESIGNS:
            outside.setdefault(design.name, design)
    DESIGNS.update(outside)
    config.add_cleanup(lambda: [DESIGNS.pop(name) for name in outside])


def measuring(config: pytest.Config) -> bool:
    """True for ``--benchmark-only`` / ``--benchmark-enable`` unless ``--benchmark-disable`` wins."""
    explicit_on = config.getoption("benchmark_only", False) or config.getoption("benchmark_enable", False)
    explicitly_off = config.getoption("benchmark_disable", False) and not config.getoption("benchmark_enable", False)
    return bool(explicit_on and not explicitly_off)


@dataclass(frozen=True)
class Sizes:
    """Everything a scenario's size depends on; ``SMOKE`` for plain pytest, ``MEASURE`` for benchmark runs.

    ``skip``: batches each run receives before its timed window starts (``Probe.per_batch_s``): at least the
    deepest prefetch depth S1, S3 and S6 run, so every pipeline is full when timing starts. ``rounds`` of at least
    ``intervals.MIN_ROUNDS`` give every judged figure a 95 % interval; ``pilot_rounds`` and ``recalibrations``:
    how a point's L/C (M/C) is brought to its nominal value under the load of the moment, before its rounds.
    """

    rounds: int
    warmup: int
    skip: int
    pilot_rounds: int
    recalibrations: int
    # S1: max(L, C) is s1_base_ms, the other is half of it or equal (see test_s1_io_bound.POINTS)
    s1_base_ms: float
    s1_batches: int
    # S2: stage R and the step's compute C, no loading
    s2_r_ms: float
    s2_c_ms: float
    s2_batches: int
    # S3: tiny model, L = 0; ``s3_pairs`` lockstep pairs per design entry (``lockstep.lockstep``), timed from batch
    # ``s3_skip`` (past a depth "auto"'s first batches, which it may prefetch on its thread while it decides)
    s3_batches: int
    s3_rounds: int
    s3_warmup: int
    s3_pairs: int
    s3_skip: int
    # S4: L ~ exponential with mean C, large batches
    s4_c_ms: float
    s4_batches: int
    s4_rows: int
    s4_rounds: int
    # S6: loading in workers, main-process hook work M, step compute C; max(M, C) is s6_base_ms
    s6_base_ms: float
    s6_batches: int
    calibration_batches: int  # batches per calibration run (C: step-only through Lightning; L: load-only)


SMOKE = Sizes(
    rounds=1, warmup=0, skip=1, pilot_rounds=1, recalibrations=1,
    s1_base_ms=2.0, s1_batches=6,
    s2_r_ms=2.0, s2_c_ms=2.0, s2_batches=7,
    s3_batches=10, s3_rounds=1, s3_warmup=0, s3_pairs=1, s3_skip=2,
    s4_c_ms=2.0, s4_batches=8, s4_rows=256, s4_rounds=1,
    s6_base_ms=2.0, s6_batches=6, calibration_batches=4,
)
# Sized to fit `pytest --benchmark-only` in 20 minutes on 2 cores (the README gives the measured duration): 15
# interleaved rounds give each figure a 95 % interval between its 4th and 12th round (9 rounds measured 10 minutes
# here, with intervals too wide to judge most targets). No warm-up round: each run is timed over its
# steady-state window, so a run's one-off costs fall outside it, and the calibration and pilot rounds run every path
# before S1 and S6; S3 keeps one, its figures being the smallest. S3's judged ratios come from lockstep pairs; each
# run also pairs stock Lightning with itself, so the results show how far apart identical entries land. 24 pairs put
# the 95 % interval of a ratio between its 7th and 18th pair: on this machine narrow enough to judge S3's 2 % and 5 %
# margins, which 10 pairs were not (the A/A row shows the width); S3's interleaved rounds, which judge nothing, drop
# to 6 to pay for them.
MEASURE = Sizes(
    rounds=15, warmup=0, skip=4, pilot_rounds=3, recalibrations=3,
    s1_base_ms=15.0, s1_batches=24,
    s2_r_ms=15.0, s2_c_ms=15.0, s2_batches=24,
    s3_batches=200, s3_rounds=6, s3_warmup=1, s3_pairs=24, s3_skip=20,
    s4_c_ms=10.0, s4_batches=64, s4_rows=1024, s4_rounds=3,
    s6_base_ms=10.0, s6_batches=24, calibration_batches=16,
)
FEATURES = 8  # columns after the id column in S1-S3 batches
ROWS = 4  # rows per batch in S1-S3


@dataclass
class Bench:
    """What a scenario test needs: the mode, its sizes, a calibrated burner, a scratch dir, the result store."""

    measuring: bool
    sizes: Sizes
    burner: workloads.Burner
    root: Path
    store: results.ResultStore
    setup: dict[str, Any]

    calibrations: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str, int, int, int, int], None] | None = None  # a terminal line per point: what, rounds left

    def record(self, benchmark: Any, scenario: str, row: dict[str, Any]) -> None:
        """``row`` into the results of ``scenario`` and into pytest-benchmark's extra info for this test."""
        benchmark.extra_info.update(row)
        benchmark.extra_info["setup"] = self.setup
        self.store.record(scenario, row)

    def interleaved(self, key: tuple, runs: dict[str, Callable[[], Any]], rounds: int, warmup: int) -> Interleaved:
        """The point ``key``'s entries measured round by round (once per session), its progress on the terminal."""
        label = " ".join(key)
        return self.store.point(key, lambda: Interleaved(
            runs, self.sizes.skip, rounds, warmup, label=label, progress=self.progress))

    def reported(self, benchmark: Any, data: Interleaved, entry: str) -> Measurement:
        """The measurement of ``entry`` in the point ``data``, handed to pytest-benchmark as this test's rounds."""
        measurement = data.measurement(entry)
        report(benchmark, measurement)
        return measurement

    def calibrated(self, key: str, calibrate: Callable[[], Any]) -> Any:
        """``calibrate()``'s result for ``key``, computed once per session and recorded in the notes."""
        if key not in self.calibrations:
            self.calibrations[key] = calibrate()
            self.store.notes.setdefault("calibration", {})[key] = self.calibrations[key].as_note()
        return self.calibrations[key]


@pytest.fixture(autouse=True)
def _torch_threads():
    """Every benchmark runs with ``workloads.TORCH_THREADS`` intra-op threads (recorded in the results)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(workloads.TORCH_THREADS)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def benchmark(benchmark, request):
    """pytest-benchmark's fixture, disabled (the function runs once) unless the session is measuring."""
    if not measuring(request.config):
        benchmark.disabled = True
    return benchmark


@pytest.fixture(scope="session")
def bench(request, tmp_path_factory) -> Bench:
    on = measuring(request.config)
    previous = torch.get_num_threads()
    torch.set_num_threads(workloads.TORCH_THREADS)
    try:
        burner = workloads.Burner()
    finally:
        torch.set_num_threads(previous)
    setup = results.setup_info()
    store = results.RESULTS
    sizes = MEASURE if on else SMOKE
    store.notes.update(
        mode="measure" if on else "smoke",
        sizes=asdict(sizes),
        matmul_ms=round(burner.ms_per_matmul, 4),
        matmul_size=burner.size,
        loadavg_start=list(os.getloadavg()),
    )
    return Bench(on, sizes, burner, tmp_path_factory.mktemp("bench"), store, setup,
                 progress=_progress_line(request.config) if on else None)


PROGRESS_WIDTH = 100


def progress_text(label: str, entries: int, done: int, total: int, warmup: int) -> str:
    """What a point's progress line says, within ``PROGRESS_WIDTH`` columns."""
    if done >= total:
        text = f"{label}: {entries} entries x {total} rounds measured"
    else:
        kind = "warm-up round" if done < warmup else "round"
        text = f"{label}: {entries} entries, {kind} {done + 1} of {total} running, {total - done} rounds left"
    return text[:PROGRESS_WIDTH]


def _progress_line(config: pytest.Config) -> Callable[[str, int, int, int, int], None] | None:
    """Writes a point's progress to the terminal while its rounds run, past pytest's output capture (so it shows
    without ``-s``): one line per point, rewritten in place on a terminal, written once at the start otherwise (a
    log file gets no carriage returns)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None:
        return None
    interactive = bool(reporter.isatty)
    writer = config.get_terminal_writer()

    def write(label: str, entries: int, done: int, total: int, warmup: int) -> None:
        if not interactive and done > 0:
            return
        text = progress_text(label, entries, done, total, warmup)
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if done == 0 and writer.width_of_current_line:  # after pytest's progress dots
                reporter.line("")
            if interactive:
                reporter.rewrite(text, erase=True)
                if done >= total:
                    reporter.line("")
            else:
                reporter.line(text)

    return write


_WRITTEN = pytest.StashKey[tuple[dict[str, Any], Path, bool]]()  # the results document, its path, whether complete


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    store = results.RESULTS
    if not measuring(session.config) or not store.rows:
        return
    store.notes["loadavg_end"] = list(os.getloadavg())
    store.notes["pytest_exitstatus"] = int(exitstatus)
    # Only the start is a fair sign of other work: later load averages include this run's own threads.
    at_start = store.notes.get("loadavg_start", [0.0])[0]
    if at_start > 0.75:
        store.notes["warning"] = (
            f"the machine was busy when the run started (1-minute load average {at_start:.1f} on {os.cpu_count()}"
            " cores): every figure is noisier for it, and S2 needs both cores idle"
        )
    complete = all(store.rows.get(s) for s in results.CPU_SCENARIOS)
    name = f"benchmarks-{results.MACHINE_KIND}.json"
    if os.environ.get("BENCHMARKS_RESULTS"):
        path = Path(os.environ["BENCHMARKS_RESULTS"])
    elif complete:
        path = results.RESULTS_DIR / name
    else:
        path = results.PARTIAL_DIR / name.replace(".json", ".partial.json")
    document = results.results_document(store, results.setup_info())
    results.write_json(path, document)
    session.config.stash[_WRITTEN] = (document, path, complete)


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's tables, when they are printed: the verdicts end the run
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if _WRITTEN in config.stash:
        summary.write_summary(terminalreporter, *config.stash[_WRITTEN])
