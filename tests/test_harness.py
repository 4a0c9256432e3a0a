"""The conformance harness itself: it can fail, and its bookkeeping (selection, expected failures) is strict.

Each test runs the real suite in-process with pytester against a design registered only for that test.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl

from prototypes import IMPLEMENTATIONS
from prototypes.batch_processor.training import IteratorTrainingEpochLoop
from prototypes.common import Design
from tests.conformance import plugin

pytest_plugins = ["pytester"]

SUITE = Path(plugin.__file__).parent


class DropEveryThirdBatch:
    """An iterable over a loader that silently loses every third batch: the bug a design must never have."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        return (batch for position, batch in enumerate(self.loader) if position % 3 != 2)


class DroppingTrainer(pl.Trainer):
    def fit(self, model, train_dataloaders=None, *args, **kwargs):
        return super().fit(model, DropEveryThirdBatch(train_dataloaders), *args, **kwargs)


@pytest.fixture
def toy_design():
    design = Design(
        name="toy_dropping",
        summary="stock Lightning that loses every third training batch (a deliberately broken toy)",
        make_trainer=lambda trainer_kwargs: DroppingTrainer(**trainer_kwargs),
    )
    IMPLEMENTATIONS[design.name] = design
    yield design
    del IMPLEMENTATIONS[design.name]


def run_suite(pytester: pytest.Pytester, *args: str, targets: tuple[str, ...] = (str(SUITE),)) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", *targets, *args)


@pytest.mark.timeout(300)
def test_broken_toy_design_fails_the_clauses_it_breaks(pytester, toy_design, tmp_path):
    results = tmp_path / "results.json"
    outcome = run_suite(
        pytester, "--impl", toy_design.name, "--results", str(results),
        "-k", "test_fixed_patterns or test_parameter_named_dataloader_iter",
    )
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    outcome.stdout.fnmatch_lines(["*conformance matrix*", "toy_dropping *FAIL"])
    by_clause: dict[str, set[str]] = {}
    for result in json.loads(results.read_text())["results"]:
        by_clause.setdefault(result["clause"], set()).add(result["outcome"])
    assert by_clause == {"C1": {"passed"}, "C3": {"failed"}}, by_clause


class _NeverDrains(IteratorTrainingEpochLoop):
    def _drain_held_batches(self) -> None:
        pass  # the defect: the epoch ends while a pipelining step still holds a batch


def _never_draining_trainer(trainer_kwargs) -> pl.Trainer:
    trainer = IMPLEMENTATIONS["batch_processor"].trainer(**trainer_kwargs)
    trainer.fit_loop.epoch_loop.__class__ = _NeverDrains
    return trainer


@pytest.fixture
def never_draining_design():
    design = Design(
        name="toy_never_drains",
        summary="batch_processor without drain calls (a deliberately broken toy)",
        make_trainer=_never_draining_trainer,
    )
    IMPLEMENTATIONS[design.name] = design
    yield design
    del IMPLEMENTATIONS[design.name]


@pytest.mark.timeout(300)
def test_design_that_never_drains_fails_c17_only(pytester, never_draining_design, tmp_path):
    results = tmp_path / "results.json"
    outcome = run_suite(
        pytester, "--impl", never_draining_design.name, "--results", str(results),
        "-k", "(test_pipelining_step and sized-w0) or test_simple_step_needs_no_guard or test_fixed_patterns",
    )
    assert outcome.ret == pytest.ExitCode.TESTS_FAILED
    failed = {(r["clause"], r["test_id"].split("[")[0].split("::")[1])
              for r in json.loads(results.read_text())["results"] if r["outcome"] == "failed"}
    assert failed == {("C17", "test_pipelining_step_trains_every_batch_once_per_epoch")}, failed


def test_unknown_design_is_an_error_listing_the_valid_names(pytester):
    outcome = run_suite(pytester, "--impl", "no_such_design", "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*unknown design 'no_such_design'; valid names: *upstream*"])


@pytest.fixture
def expected_failures_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin, "EXPECTED_FAILURES_DIR", tmp_path)
    return tmp_path


def test_expected_failure_matching_no_test_is_an_error(pytester, toy_design, expected_failures_dir):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "reason: a stale entry\n    test_c02_items.py::test_no_such_test[sized]\n"
    )
    outcome = run_suite(pytester, "--impl", toy_design.name, "-k", "test_c02", "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*match no test*", "*toy_dropping.txt:2: test_c02_items.py::test_no_such_test*"])


def test_expected_failure_without_reason_is_an_error(pytester, toy_design, expected_failures_dir):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator\n"
    )
    outcome = run_suite(pytester, "--impl", toy_design.name, "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines(["*toy_dropping.txt:1: *gives no reason*"])


@pytest.mark.parametrize(
    "text, error",
    [
        ("reason: nothing under it\n\nreason: another\n    test_c02_items.py::test_x\n", "*:1: reason 'nothing under it' covers no test id*"),
        ("reason: twice\n    test_c02_items.py::test_x\n    test_c02_items.py::test_x\n", "*:3: *already listed on line 2*"),
        ("reason:\n    test_c02_items.py::test_x\n", "*:1: empty reason*"),
    ],
    ids=["reason-without-ids", "id-listed-twice", "empty-reason"],
)
def test_a_malformed_reason_group_is_an_error(pytester, toy_design, expected_failures_dir, text, error):
    (expected_failures_dir / "toy_dropping.txt").write_text(text)
    outcome = run_suite(pytester, "--impl", toy_design.name, "--collect-only")
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines([error])


def test_expected_failure_that_passes_fails_the_run(pytester, toy_design, expected_failures_dir):
    (expected_failures_dir / "toy_dropping.txt").write_text(
        "reason: claimed broken\n"
        "    test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator\n"
        "reason: the toy drops every third batch\n"  # one reason covering five ids
        + "".join(
            f"    test_c03_exactly_once.py::test_fixed_patterns_receive_the_loader_sequence_every_epoch[{p}-sized]\n"
            for p in ("(1,)", "(2,)", "(3,)", "(0, 1)", "(0, 2, 1, 3)")
        )
    )
    targets = (
        f"{SUITE}/test_c01_selection.py::test_parameter_named_dataloader_iter_receives_an_iterator",
        f"{SUITE}/test_c03_exactly_once.py::test_fixed_patterns_receive_the_loader_sequence_every_epoch",
    )
    outcome = run_suite(pytester, "--impl", toy_design.name, "-k", "test_parameter_named or (sized and not unsized)",
                         targets=targets)
    outcome.assert_outcomes(failed=1, xfailed=5)
    outcome.stdout.fnmatch_lines(["*XPASS(strict)*claimed broken*"])


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
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--impl", "upstream",
         f"{SUITE}/test_c13_interrupts.py", "-k", "ctrl_c or keyboard_interrupt"],
        preexec_fn=_ignoring_sigint, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=280,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "3 passed" in run.stdout, run.stdout[-2000:]
