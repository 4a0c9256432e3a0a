"""The conformance harness itself: it can fail, and its bookkeeping (selection, expected failures) is strict.

Each test runs the real suite in-process with pytester against a design registered only for that test, or
defined the way ``docs/adding-a-design.md`` says (in this repository, or in a package outside it).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytorch_lightning as pl
import tomllib

import harness_common
import prototypes
from prototypes import DESIGNS
from prototypes.batch_processor.training import IteratorTrainingEpochLoop
from prototypes.common import Design
from tests.conformance import plugin

pytest_plugins = ["pytester"]

SUITE = Path(plugin.__file__).parent
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "adding-a-design.md"


class DropEveryThirdBatch:
    """An iterable over a loader that silently loses every third batch: the bug a design must never have."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        return (batch for position, batch in enumerate(self.loader) if position % 3 != 2)


class DroppingTrainer(pl.Trainer):
    def fit(self, model, train_dataloaders=None, *args, **kwargs):
        return super().fit(model, DropEveryThirdBatch(train_dataloaders), *args, **kwargs)


@contextlib.contextmanager
def registered(name: str, summary: str, make_trainer) -> Iterator[Design]:
    """A deliberately broken toy design, in the registry for one test."""
    design = Design(name=name, summary=f"{summary} (a deliberately broken toy)", make_trainer=make_trainer)
    DESIGNS[design.name] = design
    try:
        yield design
    finally:
        del DESIGNS[design.name]


def outcomes_by_clause(results: Path) -> dict[str, set[str]]:
    """Each clause's outcomes in a ``--results`` file."""
    by_clause: dict[str, set[str]] = {}
    for result in json.loads(results.read_text())["results"]:
        by_clause.setdefault(result["clause"], set()).add(result["outcome"])
    return by_clause


@pytest.fixture
def toy_design():
    with registered("toy_dropping", "stock Lightning that loses every third training batch",
                    lambda trainer_kwargs: DroppingTrainer(**trainer_kwargs)) as design:
        yield design


def run_suite(pytester: pytest.Pytester, *args: str, targets: tuple[str, ...] = (str(SUITE),)) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", *targets, *args)


def printed(text: str, outcome: pytest.RunResult) -> bool:
    """Whether the run printed ``text``, whatever the line breaks wrapping put into it."""
    return " ".join(text.split()) in " ".join(outcome.stdout.str().split())


@pytest.mark.timeout(300)
def test_broken_toy_design_fails_the_clauses_it_breaks(pytester, toy_design, tmp_path):
    results = tmp_path / "results.json"
    outcome = run_suite(
        pytester, "--design", toy_design.name, "--results", str(results),
        "-k", "test_fixed_patterns or test_parameter_named_dataloader_iter",
    )
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    outcome.stdout.fnmatch_lines(["*conformance matrix*", "C3 Exactly once, in order * F*", "failed: C3 toy_dropping"])
    assert outcomes_by_clause(results) == {"C1": {"passed"}, "C3": {"failed"}}


class _NeverDrains(IteratorTrainingEpochLoop):
    def _drain_held_batches(self) -> None:
        pass  # the defect: the epoch ends while a pipelining step still holds a batch


def _never_draining_trainer(trainer_kwargs) -> pl.Trainer:
    trainer = DESIGNS["batch_processor"].trainer(**trainer_kwargs)
    trainer.fit_loop.epoch_loop.__class__ = _NeverDrains
    return trainer


@pytest.mark.timeout(300)
def test_design_that_never_drains_fails_c17_only(pytester, tmp_path):
    # a simple step still passes C17 and C3: only the pipelining step's held batch is lost
    results = tmp_path / "results.json"
    with registered("toy_never_drains", "batch_processor without drain calls", _never_draining_trainer) as design:
        outcome = run_suite(
            pytester, "--design", design.name, "--results", str(results),
            "-k", "(test_pipelining_step and sized-w0) or test_simple_step_needs_no_guard or test_fixed_patterns",
        )
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes_by_clause(results) == {"C17": {"failed", "passed"}, "C3": {"passed"}}


def test_unknown_design_is_an_error_listing_the_valid_names(pytester):
    outcome = run_suite(pytester, "--design", "no_such_design", "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*unknown design 'no_such_design'; valid names: *upstream*"])


def test_the_old_option_name_still_selects_designs(pytester):
    outcome = run_suite(pytester, "--impl", "no_such_design", "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*unknown design 'no_such_design'*"])


def test_a_variant_named_twice_is_checked_once():
    # "prefetcher" already brings its suite variants, depth 2 among them
    ids = [design.id for design in plugin.select_designs("prefetcher,prefetcher[depth=2],upstream")]
    assert len(ids) == len(set(ids))
    assert ids[-1] == "upstream" and "prefetcher[depth=2]" in ids


@pytest.fixture
def expected_failures_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin, "EXPECTED_FAILURES_DIR", tmp_path)
    return tmp_path


def test_expected_failure_matching_no_test_is_an_error(pytester, toy_design, expected_failures_dir):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "[gaps]\nstale: a stale entry\n[expected failures]\nstale\n    test_c02_items.py::test_no_such_test[sized]\n"
    )
    outcome = run_suite(pytester, "--design", toy_design.name, "-k", "test_c02", "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*match no test*", "*toy_dropping.txt:5: test_c02_items.py::test_no_such_test*"])


def test_a_malformed_expected_failure_file_stops_the_run_naming_the_line(pytester, toy_design, expected_failures_dir):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "[gaps]\n[expected failures]\n"
        "    test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator\n"
    )
    outcome = run_suite(pytester, "--design", toy_design.name, "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*toy_dropping.txt:3: *names no gap*"])


def test_expected_failure_that_passes_fails_the_run(pytester, toy_design, expected_failures_dir, tmp_path):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "[gaps]\n"
        "claimed: claimed broken\n"
        "drops: the toy drops every third batch\n"
        "[expected failures]\n"
        "claimed\n"
        "    test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator\n"
        "drops: the sequence has gaps\n"  # one gap covering five ids
        + "".join(
            f"    test_c03_exactly_once.py::test_fixed_patterns_receive_the_loader_sequence_every_epoch[{p}-sized]\n"
            for p in ("(1,)", "(2,)", "(3,)", "(0, 1)", "(0, 2, 1, 3)")
        )
    )
    targets = (
        f"{SUITE}/test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator",
        f"{SUITE}/test_c03_exactly_once.py::test_fixed_patterns_receive_the_loader_sequence_every_epoch",
    )
    results = tmp_path / "results.json"
    outcome = run_suite(pytester, "--design", toy_design.name, "-k", "test_parameter_named or (sized and not unsized)",
                        "--results", str(results), targets=targets)
    outcome.assert_outcomes(failed=1, xfailed=5)
    outcome.stdout.fnmatch_lines(["*XPASS(strict)*claimed broken*"])
    reported = {(r["outcome"], r["gap"], r["reason"]) for r in json.loads(results.read_text())["results"]}
    assert reported == {
        ("failed", "claimed", "claimed broken"),  # a strict xfail that passes fails
        ("xfailed", "drops", "the sequence has gaps; the toy drops every third batch"),
    }


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.timeout(300)
def test_ctrl_c_cases_pass_when_pytest_starts_with_sigint_ignored():
    """As under ``nohup`` or ``&``: the child inherits SIGINT as ignored, and C13's Ctrl-C cases still pass."""
    inherited = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"],
        preexec_fn=_ignoring_sigint, capture_output=True, text=True, timeout=60,
    )
    assert inherited.stdout.strip() == "True", "the child did not start with SIGINT ignored"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--design", "upstream",
         f"{SUITE}/test_c13_interrupts.py", "-k", "ctrl_c or keyboard_interrupt"],
        preexec_fn=_ignoring_sigint, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=280,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]


# ------------------------------------------------------------------------------------------------ the guide's recipes
def guide_files(language: str) -> dict[str, str]:
    """The guide's ``language`` code blocks that start with ``# <path>``, by that path."""
    blocks = re.findall(rf"```{language}\n(# (\S+)\n.*?)```", GUIDE.read_text(), re.S)
    return {path: text for text, path in blocks}


def registry_with(modules_assignment: str) -> dict:
    """``prototypes/__init__.py`` executed with its ``_DESIGN_MODULES = ...`` replaced: the registry as edited."""
    source = ast.parse(Path(prototypes.__file__).read_text())
    replacement = ast.parse(modules_assignment).body
    targets = [i for i, node in enumerate(source.body)
               if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["_DESIGN_MODULES"]]
    assert len(targets) == 1 and len(replacement) == 1, "the registry no longer assigns _DESIGN_MODULES once"
    source.body[targets[0]] = replacement[0]
    namespace = {"__name__": "prototypes"}
    exec(compile(source, prototypes.__file__, "exec"), namespace)
    return namespace["DESIGNS"]


@pytest.fixture
def in_repository_design(tmp_path, monkeypatch):
    """The guide's ``prototypes/my_design.py`` (written under a scratch directory on the package's path) and the
    guide's registry line: the registry the guide's steps 1 and 2 produce, installed for this test."""
    files = guide_files("python")
    (tmp_path / "prototypes").mkdir()
    (tmp_path / "prototypes" / "my_design.py").write_text(files["prototypes/my_design.py"])
    monkeypatch.setattr(prototypes, "__path__", [*prototypes.__path__, str(tmp_path / "prototypes")])
    try:
        registry = registry_with(files["prototypes/__init__.py"])
        monkeypatch.setattr(prototypes, "DESIGNS", registry)
        yield registry["my_design"]
    finally:
        sys.modules.pop("prototypes.my_design", None)


def _variants(results: Path) -> dict[str, set[str]]:
    """``{variant: outcomes}`` of a results file."""
    by_variant: dict[str, set[str]] = {}
    for result in json.loads(results.read_text())["results"]:
        by_variant.setdefault(result["variant"], set()).add(result["outcome"])
    return by_variant


@pytest.mark.timeout(300)
def test_the_guides_in_repository_design_is_registered_and_checked(pytester, in_repository_design, tmp_path):
    results = tmp_path / "results.json"
    outcome = run_suite(pytester, "--design", "my_design", "--results", str(results), "-k", "test_batch_idx_restarts")
    assert outcome.ret == pytest.ExitCode.OK, outcome.stdout.str()[-3000:]
    design = in_repository_design
    expected = {design.variant(**options).id for options in (design.options, *design.suite_variants)}
    assert _variants(results) == {variant: {"passed"} for variant in expected}
    assert printed(f"my_design {design.summary}", outcome)


OUTSIDE_MODULE = "mypkg/dataloader_iter_design.py"
OUTSIDE = "mypkg.dataloader_iter_design:DESIGN"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on ``sys.path`` holding the guide's outside package ``mypkg``."""
    site = tmp_path / "site"
    (site / "mypkg").mkdir(parents=True)
    (site / "mypkg" / "__init__.py").write_text("")
    (site / OUTSIDE_MODULE).write_text(guide_files("python")[OUTSIDE_MODULE])
    monkeypatch.syspath_prepend(str(site))
    return site


def install_entry_points(site: Path, entry_points: dict[str, dict[str, str]]) -> None:
    """What ``pip install`` leaves for ``importlib.metadata``: a ``*.dist-info`` with the package's entry points."""
    info = site / "mypkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items())
        for group, entries in entry_points.items()
    ))
    importlib.invalidate_caches()


@pytest.fixture
def installed(site):
    """``mypkg`` installed with the entry points of the guide's ``pyproject.toml``."""
    pyproject = tomllib.loads(guide_files("toml")["pyproject.toml"])
    install_entry_points(site, pyproject["project"]["entry-points"])
    return site


@pytest.mark.timeout(300)
def test_a_design_outside_the_repository_runs_by_module_path(pytester, site, tmp_path):
    assert f"--design {OUTSIDE}" in GUIDE.read_text()
    results = tmp_path / "results.json"
    outcome = run_suite(pytester, "--design", OUTSIDE, "--results", str(results), "-k", "test_batch_idx_restarts")
    assert outcome.ret == pytest.ExitCode.OK, outcome.stdout.str()[-3000:]
    outcome.stdout.fnmatch_lines(["*conformance matrix*", "*mine*", "C2 Items *2", "all clauses *2"])
    assert printed("mine stock Lightning, defined outside the repository that holds the suite", outcome)
    assert _variants(results) == {"mine": {"passed"}}
    assert "mine" in json.loads(results.read_text())["designs"]


@pytest.mark.timeout(300)
def test_an_installed_design_runs_by_its_entry_point_name_and_only_when_named(pytester, installed, tmp_path):
    results = tmp_path / "results.json"
    outcome = run_suite(pytester, "--design", "mine", "--results", str(results), "-k", "test_batch_idx_restarts")
    assert outcome.ret == pytest.ExitCode.OK, outcome.stdout.str()[-3000:]
    assert _variants(results) == {"mine": {"passed"}}
    plain = run_suite(pytester, "-k", "test_batch_idx_restarts", "--collect-only", "-q")
    assert "[upstream-sized]" in plain.stdout.str() and "mine" not in plain.stdout.str()


@pytest.mark.timeout(300)
def test_an_outside_designs_expected_failures_are_read_from_its_directory_and_strict(pytester, site, tmp_path):
    own = tmp_path / "conformance"
    own.mkdir()
    (own / "mine.txt").write_text(
        "[gaps]\nclaimed: claimed broken\n[expected failures]\nclaimed\n"
        "    test_c02_items.py::test_batch_idx_restarts_from_zero_each_epoch[sized]\n"
    )
    outcome = run_suite(pytester, "--design", OUTSIDE, "--expected-failures", str(own), "-k", "test_batch_idx_restarts")
    outcome.assert_outcomes(passed=1, failed=1)
    outcome.stdout.fnmatch_lines(["*XPASS(strict)*claimed broken*"])
    (own / "mine.txt").write_text("[gaps]\nstale: stale\n[expected failures]\nstale\n"
                                  "    test_c02_items.py::test_no_such_test[sized]\n")
    stale = run_suite(pytester, "--design", OUTSIDE, "--expected-failures", str(own), "--collect-only")
    assert stale.ret == pytest.ExitCode.USAGE_ERROR
    stale.stderr.fnmatch_lines([f"*{own / 'mine.txt'}:5: test_c02_items.py::test_no_such_test*"])


IMPOSTOR = 'from prototypes.common import Design\nDESIGN = Design(name={name!r}, summary="x", make_trainer=None)\n'


@pytest.mark.parametrize(
    "impl, entry_points, error",
    [
        ("nomodule.design:DESIGN", {}, "*cannot import 'nomodule.design' (No module named 'nomodule'); install *"),
        ("mypkg.dataloader_iter_design:NOPE", {}, "*has no attribute 'NOPE'; the Designs it defines: DESIGN"),
        ("mypkg.dataloader_iter_design:pl", {}, "*module is not a prototypes.common.Design; point it at *"),
        ("mypkg.upstream:DESIGN", {}, "*its name 'upstream' is taken by a design in this repository; *"),
        (f"{OUTSIDE},mypkg.mine:DESIGN", {}, "*two different designs are named 'mine'; rename one"),
        ("no_such_design", {"other": OUTSIDE}, "*unknown design 'no_such_design'; valid names: *other*upstream*"),
        ("other", {"other": OUTSIDE}, "*the Design is named 'mine'; name the entry point after its Design"),
        ("broken", {"broken": "mypkg.missing:DESIGN"}, "*--design broken (entry point *cannot load it*"),
        ("", {"upstream": "mypkg.upstream:DESIGN"}, "*take the names of designs in this repository (upstream = *"),
    ],
    ids=["unimportable", "missing-attribute", "not-a-design", "registered-name", "two-named-alike",
         "unknown-lists-installed", "entry-point-misnamed", "entry-point-broken", "entry-point-clash"],
)
def test_a_bad_outside_design_is_an_error_naming_the_fix(pytester, site, impl, entry_points, error):
    for name in ("upstream", "mine"):
        (site / "mypkg" / f"{name}.py").write_text(IMPOSTOR.format(name=name))
    install_entry_points(site, {harness_common.ENTRY_POINT_GROUP: entry_points})
    outcome = run_suite(pytester, *(["--design", impl] if impl else []), "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines([error])


def test_a_missing_expected_failures_directory_is_an_error(pytester, tmp_path):
    outcome = run_suite(pytester, "--expected-failures", str(tmp_path / "nowhere"), "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*--expected-failures *nowhere: no such directory; name the one that holds*"])


# ------------------------------------------------------------------------------------------------ what the run prints
def test_a_run_where_no_conformance_test_ran_prints_no_matrix(pytester):
    # pytest --benchmark-only skips every conformance test: nothing ran, so there is no matrix to show
    c01 = str(SUITE / "test_c01_selection.py")
    skipped = run_suite(pytester, "--design", "upstream", "--benchmark-only", targets=(c01,))
    assert skipped.ret == pytest.ExitCode.OK
    counts = skipped.parseoutcomes()
    assert set(counts) == {"skipped"} and counts["skipped"] > 0
    assert "conformance matrix" not in skipped.stdout.str()
    # a run that collects no conformance test at all, with the plugin loaded as pyproject loads it
    pytester.makepyfile(test_other="def test_other():\n    pass\n")
    other = pytester.runpytest("-p", "tests.conformance.plugin", "-p", "no:cacheprovider")
    other.assert_outcomes(passed=1)
    assert "conformance matrix" not in other.stdout.str()


def test_a_subset_prints_only_the_clauses_and_designs_that_ran(pytester):
    outcome = run_suite(pytester, "--design", "upstream,callback", "-k", "test_batch_idx_restarts and upstream")
    assert outcome.ret == pytest.ExitCode.OK, outcome.stdout.str()[-3000:]
    matrix = outcome.stdout.str().split("conformance matrix")[1]
    rows = [line.split()[0] for line in matrix.splitlines() if re.match(r"C\d+ |all clauses", line)]
    assert rows == ["C2", "all"]
    assert "upstream" in matrix and "callback" not in matrix


@pytest.mark.timeout(300)
def test_failed_cells_are_red_unless_no_color_is_set(pytester, toy_design, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # pytest's writer colours output to a pipe only when asked to
    monkeypatch.delenv("PY_COLORS", raising=False)
    c03 = SUITE / "test_c03_exactly_once.py"
    fixed_patterns = f"{c03}::test_fixed_patterns_receive_the_loader_sequence_every_epoch"
    args = ("--design", toy_design.name, "-k", "not unsized")
    coloured = run_suite(pytester, *args, targets=(fixed_patterns,))
    assert coloured.ret == pytest.ExitCode.TESTS_FAILED
    red_bold = re.compile(r"\x1b\[31m\x1b\[1m *\d+ F\d+")  # the writer's markup for red=True, bold=True
    assert red_bold.search(coloured.stdout.str()), coloured.stdout.str()[-3000:]
    monkeypatch.setenv("NO_COLOR", "1")
    plain = run_suite(pytester, *args, targets=(fixed_patterns,))
    assert "\x1b[" not in plain.stdout.str().split("conformance matrix")[1]
    plain.stdout.fnmatch_lines(["failed: C3 toy_dropping"])

