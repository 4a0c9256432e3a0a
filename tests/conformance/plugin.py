"""The conformance harness as a pytest plugin (loaded with ``-p tests.conformance.plugin`` from pyproject).

- ``--impl NAME[,NAME]`` selects designs (default: every registered design with each of its suite variants;
  ``--impl 'prefetcher[depth=4]'`` selects one variant). Conformance tests take a ``design`` argument and are
  parametrized over the selection.
- A design defined outside this repository is selected by where it lives, ``--impl package.module:ATTR`` (variants
  too: ``'package.module:ATTR[depth=4]'``), or by name when its package declares it in the ``dataloader_iter_designs``
  entry-point group. Installed designs run only when ``--impl`` names them: the default run is this repository's
  designs, whatever else is installed. A name taken by a registered design is an error.
- Every conformance test carries ``@pytest.mark.clause("Cn")``; results aggregate per clause.
- ``expected_failures/<design>.txt`` lists, per design, each reason followed by the test ids
  (``<file>::<test>[<params>]``) it explains; ``--expected-failures DIR`` is searched first (where a design
  outside this repository keeps its file). Entries become strict xfails; an id that matches no collected test
  is an error, and so is a listed test that passes.
- At the end, a clause x design matrix of passed / expected-fail / failed tests, at most 100 columns wide
  (``terminal.py``); none when no conformance test ran. ``--results PATH`` writes the outcomes as JSON.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import operator
import os
import platform
import re
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from benchmarks.provenance import provenance
from prototypes.common import Design
from tests.conformance.terminal import write_matrix

# Bounded and reproducible by default (CI); `--hypothesis-profile thorough` for a long search.
# The `design` fixture is an immutable registry entry, so sharing it across examples is safe.
_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.register_profile("default", max_examples=12, derandomize=True, **_COMMON)
settings.register_profile("thorough", max_examples=200, **_COMMON)
settings.load_profile("default")

SUITE_DIR = Path(__file__).parent
EXPECTED_FAILURES_DIR = SUITE_DIR / "expected_failures"
ENTRY_POINT_GROUP = "dataloader_iter_designs"

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
        "--impl", default=None,
        help="designs to check: NAME or package.module:ATTR, comma-separated, e.g. upstream,'prefetcher[depth=4]'",
    )
    group.addoption(
        "--expected-failures", default=None, metavar="DIR",
        help="a directory of <design>.txt expected-failure files, searched before the suite's own",
    )
    group.addoption("--results", default=None, metavar="PATH", help="write the conformance outcomes as JSON")


# ------------------------------------------------------------------------------------------------ selection
def _split_top_level(spec: str) -> list[str]:
    """Split on commas outside brackets: ``a,b[x=1,y=2]`` -> ``["a", "b[x=1,y=2]"]``."""
    return [part.strip() for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", spec) if part.strip()]


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip("'\"")


def installed_designs() -> dict[str, importlib.metadata.EntryPoint]:
    """The designs installed packages declare in the ``dataloader_iter_designs`` entry-point group, by name."""
    from prototypes import IMPLEMENTATIONS

    points = {point.name: point for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    clashes = [f"{name} = {points[name].value}" for name in sorted(set(points) & set(IMPLEMENTATIONS))]
    if clashes:
        raise pytest.UsageError(
            f"entry points in group {ENTRY_POINT_GROUP!r} take the names of designs in this repository "
            f"({'; '.join(clashes)}); rename each entry point and its Design in the package that declares it"
        )
    return points


def _as_design(source: str, value: object) -> Design:
    if not isinstance(value, Design):
        raise pytest.UsageError(
            f"--impl {source}: {type(value).__name__} is not a prototypes.common.Design; point it at an object "
            "built with Design(name=..., summary=..., make_trainer=...)"
        )
    return value


def _design_at(path: str) -> Design:
    """The design ``package.module:ATTR`` names."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise pytest.UsageError(
            f"--impl {path}: cannot import {module_name!r} ({error}); install the package that defines it "
            "or put its directory on PYTHONPATH"
        ) from None
    try:
        value = operator.attrgetter(attribute)(module)
    except AttributeError:
        designs = sorted(name for name, value in vars(module).items() if isinstance(value, Design))
        raise pytest.UsageError(
            f"--impl {path}: module {module_name!r} has no attribute {attribute!r}; "
            f"the Designs it defines: {', '.join(designs) or 'none'}"
        ) from None
    design = _as_design(path, value)
    from prototypes import IMPLEMENTATIONS

    if IMPLEMENTATIONS.get(design.name, design) is not design:
        raise pytest.UsageError(
            f"--impl {path}: its name {design.name!r} is taken by a design in this repository; "
            "give the outside design another Design(name=...)"
        )
    return design


def _installed_design(point: importlib.metadata.EntryPoint) -> Design:
    where = f"{point.name} (entry point {point.value!r} in group {ENTRY_POINT_GROUP!r})"
    try:
        value = point.load()
    except (ImportError, AttributeError) as error:
        raise pytest.UsageError(
            f"--impl {where}: cannot load it ({error}); fix the entry point or reinstall its package"
        ) from None
    design = _as_design(where, value)
    if design.name != point.name:
        raise pytest.UsageError(
            f"--impl {where}: the Design is named {design.name!r}; name the entry point after its Design"
        )
    return design


def _design_named(name: str, installed: dict[str, importlib.metadata.EntryPoint]) -> Design:
    from prototypes import IMPLEMENTATIONS

    if ":" in name:
        return _design_at(name)
    if name in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[name]
    if name in installed:
        return _installed_design(installed[name])
    raise pytest.UsageError(
        f"--impl: unknown design {name!r}; valid names: {', '.join(sorted({*IMPLEMENTATIONS, *installed}))}, "
        "or package.module:ATTR for a design defined elsewhere"
    )


def select_designs(spec: str | None) -> list[Design]:
    from prototypes import IMPLEMENTATIONS

    installed = installed_designs()  # a clash is an error even when nothing installed is selected
    if not spec:
        return [v for d in IMPLEMENTATIONS.values() for v in (d, *(d.variant(**o) for o in d.suite_variants))]
    selected, by_name = [], {}
    for part in _split_top_level(spec):
        match = re.fullmatch(r"([\w.]+(?::[\w.]+)?)(?:\[(.*)\])?", part)
        design = _design_named(match.group(1) if match else part, installed)
        if by_name.setdefault(design.name, design) is not design:
            raise pytest.UsageError(f"--impl: two different designs are named {design.name!r}; rename one")
        if match and match.group(2) is not None:
            options = dict(kv.split("=", 1) for kv in match.group(2).split(",") if kv)
            try:
                selected.append(design.variant(**{k.strip(): _parse_value(v) for k, v in options.items()}))
            except TypeError as error:
                raise pytest.UsageError(f"--impl {part}: {error}") from None
        else:
            selected.extend([design, *(design.variant(**o) for o in design.suite_variants)])
    # Why: "prefetcher,prefetcher[depth=4]" names depth 4 twice (once among the suite's variants); one test per
    # variant, in the order first named
    return list({design.id: design for design in selected}.values())


def _is_conformance(path: Path) -> bool:
    return SUITE_DIR in Path(path).parents


def pytest_configure(config: pytest.Config) -> None:
    extra_dir = config.getoption("--expected-failures")
    if extra_dir and not Path(extra_dir).is_dir():
        raise pytest.UsageError(
            f"--expected-failures {extra_dir}: no such directory; name the one that holds <design>.txt"
        )
    state = _State(designs=select_designs(config.getoption("--impl")), extra_dir=extra_dir)
    config.stash[_STATE] = state
    config.pluginmanager.register(state, "conformance-outcomes")


def selected_designs(config: pytest.Config) -> list[Design]:
    """The designs (and variants) this run checks, in ``--impl`` order: for tests that compare designs."""
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


def expected_failures_path(design_name: str, extra_dir: str | None = None) -> Path:
    """``<design>.txt`` in ``--expected-failures DIR`` if it is there, else in the suite's own directory."""
    if extra_dir and (Path(extra_dir) / f"{design_name}.txt").exists():
        return Path(extra_dir) / f"{design_name}.txt"
    return EXPECTED_FAILURES_DIR / f"{design_name}.txt"


def load_expected_failures(path: Path) -> dict[str, tuple[str, int]]:
    """``{contract id: (reason, line number)}`` from a design's file (none if it has no file), grouped by reason::

        reason: <why the design fails these tests>
            <file>::<test>[<params without the design>]
            <file>::<test>[<params without the design>]

    A reason covers the indented ids under it. An id before any reason, a reason without ids, or an id listed
    twice is an error; ``#`` starts a comment line.
    """
    if not path.exists():
        return {}
    entries: dict[str, tuple[str, int]] = {}
    reason, reason_line, covered = None, 0, 0

    def close_group() -> None:
        if reason is not None and not covered:
            raise pytest.UsageError(f"{path}:{reason_line}: reason {reason!r} covers no test id (indent the ids under it)")

    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("reason:"):
            close_group()
            reason, reason_line, covered = line.removeprefix("reason:").strip(), number, 0
            if not reason:
                raise pytest.UsageError(f"{path}:{number}: empty reason")
            continue
        test_id = line.strip()
        if reason is None or not line[0].isspace():
            raise pytest.UsageError(
                f"{path}:{number}: expected failure {test_id!r} gives no reason (indent it under a 'reason: ...' line)"
            )
        if test_id in entries:
            raise pytest.UsageError(f"{path}:{number}: {test_id!r} is already listed on line {entries[test_id][1]}")
        entries[test_id] = (reason, number)
        covered += 1
    close_group()
    return entries


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: see every collected test before -k / -m deselect some, so "matches no test" is judged fairly.
    state = config.stash[_STATE]
    collected_files: set[str] = set()
    matched: dict[str, set[str]] = defaultdict(set)
    paths = {d.name: expected_failures_path(d.name, state.extra_dir) for d in state.designs}
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
            item.add_marker(pytest.mark.xfail(reason=entry[0], strict=True))
        state.tests[item.nodeid] = dict(
            design=design.name, variant=design.id, test_id=cid, clause=clause.args[0],
            reason=entry[0] if entry else "",
        )
    for name, entries in expected.items():
        stale = [
            f"  {paths[name]}:{line}: {cid}"
            for cid, (_, line) in entries.items()
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


def outcomes(state: _State) -> list[dict]:
    """Each conformance test that reported an outcome: what it is (design, variant, clause, ...) and its outcome."""
    return [
        dict(test, outcome=state.outcomes[nodeid])
        for nodeid, test in sorted(state.tests.items(), key=lambda kv: (kv[1]["variant"], kv[1]["test_id"]))
        if nodeid in state.outcomes
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash[_STATE]
    write_matrix(terminalreporter, outcomes(state), CLAUSES, state.summaries)
    results_path = config.getoption("--results")
    if results_path:
        write_results(Path(results_path), state)
        terminalreporter.write_line(f"conformance results written to {results_path}")


def run_setup() -> dict:
    """Where and with what a run happened: the ``setup`` of every results file."""
    return dict(machine=f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs", **provenance())


def write_results(path: Path, state: _State) -> None:
    results = outcomes(state)
    names = sorted({r["design"] for r in results})
    payload = dict(
        schema=1,
        setup=run_setup(),
        clauses=CLAUSES,
        designs={name: dict(summary=state.summaries[name]) for name in names},
        results=results,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
