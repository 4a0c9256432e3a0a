"""The conformance harness as a pytest plugin (loaded with ``-p tests.conformance.plugin`` from pyproject).

- ``--design NAME[,NAME]`` selects designs (default: every registered design with each of its suite variants;
  ``--design 'prefetcher[depth=4]'`` selects one variant). Conformance tests take a ``design`` argument and are
  parametrized over the selection.
- A design defined outside this repository is selected by where it lives, ``--design package.module:ATTR`` (variants
  too: ``'package.module:ATTR[depth=4]'``), or by name when its package declares it in the ``dataloader_iter_designs``
  entry-point group. Installed designs run only when ``--design`` names them: the default run is this repository's
  designs, whatever else is installed. A name taken by a registered design is an error.
- Every conformance test carries ``@pytest.mark.clause("Cn")``; results aggregate per clause.
- ``expected_failures/<design>.txt`` names, per design, each gap once and under it the test ids
  (``<file>::<test>[<params>]``) it fails (format: ``expected_failure_files.py``); ``--expected-failures DIR`` is
  searched first (where a design outside this repository keeps its file). Entries become strict xfails; an id that
  matches no collected test is an error, and so is a listed test that passes.
- While the run goes on, on a terminal, a line when a clause starts (its tests and designs) and one a minute within
  it (the design and test running), each with the tests done of all selected and the time elapsed; none under ``-q``
  or in a log without a terminal unless ``--progress on``.
- At the end, a clause x design matrix of passed / expected-fail / failed tests, at most 100 columns wide
  (``harness_common.terminal``); none when no conformance test ran. ``--results PATH`` writes the outcomes as JSON.
"""

from __future__ import annotations

import json
import platform
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

import harness_common
from harness_common.terminal import fit, width_for, write_matrix
from prototypes.common import Design
from tests.conformance.expected_failure_files import expected_failures_path, load_expected_failures

# Bounded and reproducible by default (CI); `--hypothesis-profile thorough` for a long search. Why the default does
# not shrink: the expected failures and the defect catalogue fail on purpose, and shrinking their examples took most
# of their time; a failing example is reported as found, and `--hypothesis-profile shrink` reruns it shrunk.
# The `design` fixture is an immutable registry entry, so sharing it across examples is safe.
_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("shrink", max_examples=12, derandomize=True, **_COMMON)
settings.register_profile("default", settings.get_profile("shrink"),
                          phases=tuple(phase for phase in Phase if phase is not Phase.shrink))
settings.register_profile("thorough", max_examples=200, **_COMMON)
settings.load_profile("default")

SUITE_DIR = Path(__file__).parent
EXPECTED_FAILURES_DIR = SUITE_DIR / "expected_failures"

CLAUSES = {
    "C1": "Selection",
    "C2": "Items",
    "C3": "Exactly once, in order",
    "C4": "Device and transfer hooks",
    "C5": "End of data",
    "C6": "Progress counts batches",
    "C7": "Limits",
    "C8": "Hooks",
    "C9": "Optimisation",
    "C10": "Logging",
    "C11": "Exactly-once resume",
    "C12": "Errors surface",
    "C13": "Interrupts and early stops",
    "C14": "Misuse",
    "C15": "Evaluation steps",
    "C16": "Distributed",
    "C17": "Steps with work in flight",
    "C18": "Lightning's own features",
    "C19": "Real pipelines",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption(
        # `--impl`, the option's name until the registry was named for designs, is kept as an alias for a release
        "--design", "--impl", dest="design", default=None,
        help="designs to check: NAME or package.module:ATTR, comma-separated, e.g. upstream,'prefetcher[depth=4]'",
    )
    group.addoption(
        "--expected-failures", default=None, metavar="DIR",
        help="a directory of <design>.txt expected-failure files, searched before the suite's own",
    )
    group.addoption("--results", default=None, metavar="PATH", help="write the conformance outcomes as JSON")
    group.addoption(
        "--progress", choices=("auto", "on", "off"), default="auto",
        help="a line as each clause starts, and a minute's heartbeat: auto (on a terminal, not under -q), on, off",
    )
    group.addoption(
        "--record-duration", default=None, metavar="PATH",
        help="record this run's command and wall-clock time in PATH (JSON; the README's durations come from it)",
    )


# ------------------------------------------------------------------------------------------------ selection
def select_designs(spec: str | None) -> list[Design]:
    """``harness_common.select_designs``, its errors reported as pytest usage errors (no traceback)."""
    try:
        return harness_common.select_designs(spec)
    except harness_common.SelectionError as error:
        raise pytest.UsageError(str(error)) from None


def _is_conformance(path: Path) -> bool:
    return SUITE_DIR in Path(path).parents


def pytest_configure(config: pytest.Config) -> None:
    extra_dir = config.getoption("--expected-failures")
    if extra_dir and not Path(extra_dir).is_dir():
        raise pytest.UsageError(
            f"--expected-failures {extra_dir}: no such directory; name the one that holds <design>.txt"
        )
    state = _State(designs=select_designs(config.getoption("design")), extra_dir=extra_dir)
    config.stash[_STATE] = state
    config.stash[_STARTED] = time.monotonic()
    config.pluginmanager.register(state, "conformance-outcomes")
    progress = config.getoption("progress")
    if progress == "on" or (progress == "auto" and config.get_verbosity() >= 0):
        config.pluginmanager.register(_Progress(state, only_on_a_terminal=progress == "auto"), "conformance-progress")


# The libraries whose versions decide what the suite observes, as the run's header names them.
HEADER_VERSIONS = ("torch", "pytorch-lightning", "torchdata", "torchrec", "megatron-core")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """What this run checks, and against what: the designs and variants selected, the versions, the commit."""
    revision = harness_common.code_revision()
    versions = ", ".join(f"{dist} {harness_common.version(dist)}" for dist in HEADER_VERSIONS)
    dirty = " (dirty: uncommitted changes outside the results)" if revision["git_dirty"] else ""
    return [
        f"conformance designs: {', '.join(design.id for design in config.stash[_STATE].designs)}",
        f"python {platform.python_version()}, {versions}",
        f"commit {revision['git_commit']}{dirty}",
    ]


def selected_designs(config: pytest.Config) -> list[Design]:
    """The designs (and variants) this run checks, in ``--design`` order: for tests that compare designs."""
    return list(config.stash[_STATE].designs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "design" in metafunc.fixturenames and _is_conformance(metafunc.definition.path):
        designs = metafunc.config.stash[_STATE].designs
        metafunc.parametrize("design", designs, ids=[d.id for d in designs])


# ------------------------------------------------------------------------------------------------ expected failures
def contract_id(item: pytest.Item) -> str:
    """``<file>::<test>[<params without the design>]``: the same id for every design."""
    design = item.callspec.params["design"]
    others = item.callspec.id.split("-")
    others.remove(design.id)
    params = f"[{'-'.join(others)}]" if others else ""
    return f"{item.path.name}::{item.originalname}{params}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: see every collected test before -k / -m deselect some, so "matches no test" is judged fairly.
    state = config.stash[_STATE]
    collected_files: set[str] = set()
    matched: dict[str, set[str]] = defaultdict(set)
    paths = {d.name: expected_failures_path(EXPECTED_FAILURES_DIR, d.name, state.extra_dir) for d in state.designs}
    expected = {name: load_expected_failures(path) for name, path in paths.items()}
    for item in items:
        if not _is_conformance(item.path) or not hasattr(item, "callspec") or "design" not in item.callspec.params:
            continue
        clause = item.get_closest_marker("clause")
        if clause is None or clause.args[0] not in CLAUSES:
            raise pytest.UsageError(
                f"{item.nodeid}: every conformance test needs @pytest.mark.clause(...) naming one of "
                f"{', '.join(CLAUSES)}"
            )
        design = item.callspec.params["design"]
        cid = contract_id(item)
        collected_files.add(item.path.name)
        entry = expected[design.name].get(cid)
        if entry is not None:
            matched[design.name].add(cid)
            item.add_marker(pytest.mark.xfail(reason=entry.reason, strict=True))
            state.gaps.setdefault(design.name, {})[entry.gap] = entry.sentence
        state.tests[item.nodeid] = dict(
            design=design.name, variant=design.id, test_id=cid, clause=clause.args[0],
            reason=entry.reason if entry else "", gap=entry.gap if entry else "",
        )
    for name, entries in expected.items():
        stale = [
            f"  {paths[name]}:{entry.line}: {cid}"
            for cid, entry in entries.items()
            if cid.split("::")[0] in collected_files and cid not in matched[name]
        ]
        if stale:
            raise pytest.UsageError("expected failures that match no test (fix or delete them):\n" + "\n".join(stale))


# ------------------------------------------------------------------------------------------------ outcomes
class _State:
    """Selected designs, what each conformance test is, and how it ended (registered as a plugin object)."""

    def __init__(self, designs: list[Design], extra_dir: str | None = None) -> None:
        self.designs = designs
        self.extra_dir = extra_dir
        self.tests: dict[str, dict] = {}
        self.outcomes: dict[str, str] = {}
        self.gaps: dict[str, dict[str, str]] = {}  # design -> {gap key: sentence}, for the gaps this run collected

    @property
    def summaries(self) -> dict[str, str]:
        return {design.name: design.summary for design in self.designs}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.tests or (report.when != "call" and report.passed):
            return
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        elif report.when != "call" and report.failed:
            outcome = "error"
        else:
            outcome = report.outcome
        # a failing teardown must not hide behind a passing call
        if self.outcomes.get(report.nodeid) in (None, "passed", "xfailed"):
            self.outcomes[report.nodeid] = outcome
        if report.when == "call" and report.user_properties:
            # what a test measured (`record_property`), e.g. C19's batches trained per epoch, for the RFC's tables
            self.tests[report.nodeid]["measured"] = dict(report.user_properties)


_STATE = pytest.StashKey[_State]()
_STARTED = pytest.StashKey[float]()


class _Progress:
    """Progress lines: which clause and design run, how many of the selected tests are done, the time elapsed.

    Why lines and not a live status line: they read the same in a terminal and in a log (``--progress on``). Why not
    a line per design and clause: a clause's tests take each design in turn, test by test, so such lines would repeat
    all run long.
    """

    HEARTBEAT_S = 60

    def __init__(self, state: _State, only_on_a_terminal: bool) -> None:
        self.state = state
        self.only_on_a_terminal = only_on_a_terminal
        self.reporter = None
        self.selected: list[str] = []  # the conformance tests left after -k and -m, in run order
        self.done = 0
        self.clause: str | None = None
        self.started = self.last_line = time.monotonic()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        # Why not in a log without a terminal (CI's): pytest's dots and the final matrix say enough there
        self.reporter = None if self.only_on_a_terminal and not (reporter and reporter.isatty()) else reporter
        self.selected = [item.nodeid for item in session.items if item.nodeid in self.state.tests]
        self.started = self.last_line = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logstart(self, nodeid: str, location: tuple) -> None:
        test = self.state.tests.get(nodeid)
        if test is None or self.reporter is None:
            return
        if test["clause"] != self.clause:
            self.clause = test["clause"]
            in_clause = [self.state.tests[n] for n in self.selected if self.state.tests[n]["clause"] == self.clause]
            designs = ", ".join(f"{d} ({n} variants)" if n > 1 else d for d, n in self._variants(in_clause).items())
            self._line(f"{self.clause} {CLAUSES.get(self.clause, '')}: {len(in_clause)} tests; {designs}")
        elif time.monotonic() - self.last_line >= self.HEARTBEAT_S:
            self._line(f"{self.clause} running {test['variant']}: {test['test_id']}")  # a long clause's heartbeat

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple) -> None:
        self.done += nodeid in self.state.tests

    @staticmethod
    def _variants(tests: list[dict]) -> dict[str, int]:
        """Per design, in run order, how many of its variants ``tests`` cover."""
        seen: dict[str, set[str]] = {}
        for test in tests:
            seen.setdefault(test["design"], set()).add(test["variant"])
        return {design: len(variants) for design, variants in seen.items()}

    def _line(self, text: str) -> None:
        self.last_line = time.monotonic()
        minutes, seconds = divmod(int(self.last_line - self.started), 60)
        width = width_for(self.reporter)
        prefix = f"[{self.done}/{len(self.selected)} {minutes}:{seconds:02}] "
        for line in textwrap.wrap(text, width, initial_indent=prefix, subsequent_indent=" " * len(prefix),
                                  break_on_hyphens=False, break_long_words=False):
            self.reporter.write_line(fit(line, width))


def outcomes(state: _State) -> list[dict]:
    """Each conformance test that reported an outcome: what it is (design, variant, clause, ...) and its outcome, in
    the selection's order of variants (the registry's, unless ``--design`` names another)."""
    order = {design.id: position for position, design in enumerate(state.designs)}
    return [
        dict(test, outcome=state.outcomes[nodeid])
        for nodeid, test in sorted(state.tests.items(), key=lambda kv: (order[kv[1]["variant"]], kv[1]["test_id"]))
        if nodeid in state.outcomes
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash[_STATE]
    write_matrix(terminalreporter, outcomes(state), CLAUSES, state.summaries)
    results_path = config.getoption("--results")
    if results_path:
        write_results(Path(results_path), state)
        terminalreporter.write_line(f"conformance results written to {results_path}")
    durations_path = config.getoption("--record-duration")
    if durations_path:
        record_duration(Path(durations_path), config, exitstatus)
        terminalreporter.write_line(f"duration recorded in {durations_path}")


def record_duration(path: Path, config: pytest.Config, exitstatus: int) -> None:
    """Add this run to ``path``: its command (without this option), wall-clock seconds, exit status and machine."""
    args, skip = [], False
    for arg in config.invocation_params.args:
        if skip or arg.startswith("--record-duration"):
            skip = arg == "--record-duration"
            continue
        args.append(arg)
    recorded = json.loads(path.read_text()) if path.exists() else {"schema": 1, "runs": {}}
    recorded["runs"][" ".join(["pytest", *args])] = dict(
        seconds=round(time.monotonic() - config.stash[_STARTED], 1), exit_status=int(exitstatus),
        setup=harness_common.conformance_setup(),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(recorded, indent=1) + "\n")


def write_results(path: Path, state: _State) -> None:
    results = outcomes(state)
    names = sorted({r["design"] for r in results})
    payload = dict(
        schema=1,
        setup=harness_common.conformance_setup(),
        clauses=CLAUSES,
        designs={name: dict(summary=state.summaries[name], gaps=state.gaps.get(name, {})) for name in names},
        results=results,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
