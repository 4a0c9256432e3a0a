"""The pure parts of ``patch.lightning_tests``: the import rewrite, the junit parse, the diff of two runs, and which
test requirements it would install. No Lightning checkout and no network."""

import copy
import json
import sys
from pathlib import Path

import pytest

from harness_common import code_revision
from patch.junit import Outcome, count_outcomes, diff_outcomes, parse_junit, passed_on_both
from patch.lightning_test_differences import Deliberate, Regression, classify, classify_report
from patch.lightning_test_tree import (
    STACK_TEST_MODULES,
    TEST_ROOT,
    UPDATED_TESTS,
    copy_rewritten,
    rewrite_imports,
    versions_with_checkpoints,
)
from patch.lightning_tests import (
    is_stack_test,
    judge_stack_tests,
    main,
    missing_requirements,
    requirement_name,
    rerun_differences,
    stack_test_ids,
    stack_tests_not_shown,
)

# (a line of a Lightning test module, that line as the standalone packages' tests need it)
REWRITES = [
    ("import lightning.pytorch as pl", "import pytorch_lightning as pl"),
    ("from lightning.fabric.utilities.seed import seed_everything",
     "from lightning_fabric.utilities.seed import seed_everything"),
    ("from lightning.pytorch.callbacks import ModelCheckpoint",
     "from pytorch_lightning.callbacks import ModelCheckpoint"),
    ('@mock.patch("lightning.pytorch.trainer.trainer.Trainer.fit")',
     '@mock.patch("pytorch_lightning.trainer.trainer.Trainer.fit")'),
    ('logging.getLogger("lightning.pytorch")', 'logging.getLogger("pytorch_lightning")'),
    ("x = lightning.pytorch.Trainer(); y = lightning.fabric.Fabric()",
     "x = pytorch_lightning.Trainer(); y = lightning_fabric.Fabric()"),
]
# Lines naming something else: a path, a longer name, a name with a prefix, an address, the unified package itself.
UNCHANGED = [
    "from tests_pytorch.helpers.runif import RunIf",
    'path = "src/lightning/pytorch/trainer.py"',
    'url = "https://github.com/lightning.pytorch/issues"',
    "from my_lightning.pytorch import x",
    "from lightning.pytorch_extras import y",
    'contact = "team@lightning.pytorch"',
    "import lightning",
]


@pytest.mark.parametrize(("line", "expected"), REWRITES + [(line, line) for line in UNCHANGED])
def test_rewrite_names_the_standalone_packages_and_leaves_other_names_alone(line, expected):
    assert rewrite_imports(line) == expected
    assert rewrite_imports(expected) == expected  # a rewritten tree rewritten again stays as it is


def test_rewrite_keeps_the_rest_of_a_module_as_it_is():
    module = "import os\n\nfrom lightning.pytorch import Trainer\n\n\ndef test_fit(tmp_path):\n    Trainer()\n"
    assert rewrite_imports(module) == module.replace("lightning.pytorch", "pytorch_lightning")


def test_copy_rewrites_text_files_and_copies_binary_ones(tmp_path: Path):
    source, destination = tmp_path / "source", tmp_path / "destination"
    (source / "loops").mkdir(parents=True)
    (source / "loops" / "test_loops.py").write_text("from lightning.pytorch import Trainer\n")
    (source / "config.yaml").write_text("class_path: lightning.pytorch.callbacks.ModelCheckpoint\n")
    (source / "loops" / "plain.py").write_text("import torch\n")
    checkpoint = bytes([0x80, 0x02, 0xFF, 0x00])  # not UTF-8
    (source / "model.ckpt").write_bytes(checkpoint)

    assert copy_rewritten(source, destination) == 2
    assert (destination / "loops" / "test_loops.py").read_text() == "from pytorch_lightning import Trainer\n"
    assert (destination / "config.yaml").read_text() == "class_path: pytorch_lightning.callbacks.ModelCheckpoint\n"
    assert (destination / "loops" / "plain.py").read_text() == "import torch\n"
    assert (destination / "model.ckpt").read_bytes() == checkpoint


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="2" failures="1" skipped="2" tests="7">
  <testcase classname="tests_pytorch.loops.test_loops" name="test_passes" time="0.1"/>
  <testcase classname="tests_pytorch.loops.test_loops" name="test_fails" time="0.1">
    <failure message="AssertionError: assert 1 == 2&#10;second line">trace</failure>
  </testcase>
  <testcase classname="tests_pytorch.loops.test_loops" name="test_gpu" time="0.0">
    <skipped type="pytest.skip" message="Requires: [GPU machine]">skip</skipped>
  </testcase>
  <testcase classname="tests_pytorch.loops.test_loops" name="test_known_bug" time="0.0">
    <skipped type="pytest.xfail" message="reason: known"/>
  </testcase>
  <testcase classname="tests_pytorch.loops.test_loops.TestFetcher" name="test_param[1-2]" time="0.1">
    <failure message="assert False">call</failure>
  </testcase>
  <testcase classname="tests_pytorch.loops.test_loops.TestFetcher" name="test_param[1-2]" time="0.1">
    <error message="failed on teardown with &quot;OSError&quot;">teardown</error>
  </testcase>
  <testcase classname="" name="tests_pytorch.loops.test_broken" time="0.0">
    <error message="collection failure">ModuleNotFoundError: No module named 'onnx'</error>
  </testcase>
</testsuite></testsuites>
"""


def test_junit_parse_reads_each_outcome_and_its_first_message_line():
    outcomes = parse_junit(JUNIT)
    assert outcomes == {
        "tests_pytorch.loops.test_loops::test_passes": Outcome("passed"),
        "tests_pytorch.loops.test_loops::test_fails": Outcome("failed", "AssertionError: assert 1 == 2"),
        "tests_pytorch.loops.test_loops::test_gpu": Outcome("skipped", "Requires: [GPU machine]"),
        "tests_pytorch.loops.test_loops::test_known_bug": Outcome("xfailed", "reason: known"),
        "tests_pytorch.loops.test_loops.TestFetcher::test_param[1-2]": Outcome(
            "error", 'failed on teardown with "OSError"'
        ),
        "::tests_pytorch.loops.test_broken": Outcome("error", "collection failure"),
    }


def test_counts_separate_skipped_from_the_tests_that_ran():
    counts = count_outcomes(parse_junit(JUNIT))
    assert counts == {
        "skipped": 1, "xfailed": 1, "passed": 1, "failed": 1, "error": 2, "collected": 6, "ran": 5,
    }


def test_diff_lists_every_changed_outcome_unclassified_and_nothing_else():
    stock = {
        "a::same": Outcome("passed"),
        "a::regressed": Outcome("passed"),
        "a::fixed": Outcome("failed", "boom"),
        "a::only_stock": Outcome("skipped"),
        "a::same_message_differs": Outcome("failed", "one"),
    }
    patched = {
        "a::same": Outcome("passed"),
        "a::regressed": Outcome("error", "teardown"),
        "a::fixed": Outcome("passed"),
        "a::only_patched": Outcome("passed"),
        "a::same_message_differs": Outcome("failed", "two"),
    }
    assert diff_outcomes(stock, patched) == [
        {"test": "a::fixed", "stock": "failed", "patched": "passed", "classification": "unclassified"},
        {"test": "a::only_patched", "stock": "absent", "patched": "passed", "classification": "unclassified"},
        {"test": "a::only_stock", "stock": "skipped", "patched": "absent", "classification": "unclassified"},
        {"test": "a::regressed", "stock": "passed", "patched": "error", "classification": "unclassified"},
    ]
    assert passed_on_both(stock, patched) == 1


def test_requirements_installs_only_packages_the_environment_lacks():
    lines = [
        "# needed in tests",
        "coverage ==7.13.4; python_version >= '3.10'",
        "Scikit_Learn >0.22.1, <1.9.0  # for metrics",
        "numpy >1.21.0, <1.27.0; python_version < '3.12'",
        "pytest ==9.0.2",
        "",
        "--extra-index-url https://example.invalid",
    ]
    assert requirement_name(lines[2]) == "scikit-learn"
    installed = {"numpy": "2.4.6", "pytest": "9.2.0"}  # held at their versions, never re-pinned
    assert missing_requirements(lines, installed) == [
        "coverage ==7.13.4; python_version >= '3.10'",
        "Scikit_Learn >0.22.1, <1.9.0",
    ]


def test_legacy_versions_without_a_checkpoint_file_are_set_apart(tmp_path: Path):
    (tmp_path / "1.0.0").mkdir()
    (tmp_path / "1.0.0" / "epoch=3-step=100.ckpt").write_bytes(b"")
    (tmp_path / "1.1.0").mkdir()  # a folder holding no checkpoint, as the repository's own `.gitkeep` leaves it
    assert versions_with_checkpoints(["1.0.0", "1.1.0", "2.6.1"], tmp_path) == (["1.0.0"], ["1.1.0", "2.6.1"])


def test_classification_names_the_clause_or_the_item_and_leaves_the_rest_unclassified():
    classified = {
        "t.loops::test_progress": Deliberate("C6", "asserts one batch per step call"),
        "t.tuner::test_finder[2]": Regression(12, "records each rate twice"),
        "t.gone::test_old": Deliberate("C8", "no longer differs"),
    }
    differences = [
        {"test": "t.loops::test_progress[sized-1]", "stock": "passed", "patched": "failed",
         "classification": "unclassified"},
        {"test": "t.tuner::test_finder[2]", "stock": "passed", "patched": "error", "classification": "unclassified"},
        {"test": "t.tuner::test_finder[3]", "stock": "passed", "patched": "error", "classification": "unclassified"},
    ]
    report = {"differences": differences}
    assert classify_report(report, classified) == ["t.gone::test_old"]
    assert differences == [
        {"test": "t.loops::test_progress[sized-1]", "stock": "passed", "patched": "failed",
         "classification": "deliberate", "clause": "C6", "why": "asserts one batch per step call"},
        {"test": "t.tuner::test_finder[2]", "stock": "passed", "patched": "error",
         "classification": "regression", "item": 12, "why": "records each rate twice"},
        {"test": "t.tuner::test_finder[3]", "stock": "passed", "patched": "error", "classification": "unclassified"},
    ]
    assert report["classifications_without_a_difference"] == ["t.gone::test_old"]
    assert classify(differences, {}) == [] and {d["classification"] for d in differences} == {"unclassified"}
    assert "why" not in differences[0]  # a classification taken back leaves nothing of it behind


def test_the_committed_report_classifies_every_difference_as_the_declared_list_does():
    committed = Path(__file__).resolve().parent.parent / "rfc" / "results" / "lightning-tests.json"
    if not committed.is_file():
        pytest.skip("no committed report: python -m patch.lightning_tests writes rfc/results/lightning-tests.json")
    report = json.loads(committed.read_text(encoding="utf-8"))
    reclassified = copy.deepcopy(report)
    assert classify_report(reclassified) == [], "stale entries: python -m patch.lightning_test_differences"
    assert reclassified == report, "not classified as declared: run python -m patch.lightning_test_differences"
    assert all(d["classification"] != "unclassified" for d in report.get("differences", []))


def test_the_stack_tests_are_the_modules_written_for_lightning_and_each_is_judged_by_both_runs():
    assert STACK_TEST_MODULES and all(module.endswith(".py") for module in STACK_TEST_MODULES)
    module = stack_test_ids()[0]
    stock = {f"{module}::test_new": Outcome("failed", "boom"), f"{module}::test_kept": Outcome("passed"),
             "tests.tests_pytorch.loops.test_loops::test_other": Outcome("passed")}
    patched = {f"{module}::test_new": Outcome("passed"), f"{module}::test_kept": Outcome("passed"),
               "tests.tests_pytorch.loops.test_loops::test_other": Outcome("passed")}
    assert judge_stack_tests(stock, patched) == [
        dict(test=f"{module}::test_kept", stock="passed", patched="passed", updated=False, shows_the_change=False),
        dict(test=f"{module}::test_new", stock="failed", patched="passed", updated=False, shows_the_change=True),
    ]
    # a module that names what only the stack has does not import on stock: its tests err there as one
    assert judge_stack_tests({f"::{module}": Outcome("error", "collection failure")},
                             {f"{module}::test_new": Outcome("passed")}) == [
        dict(test=f"{module}::test_new", stock="error", patched="passed", updated=False, shows_the_change=True),
    ]


def test_an_updated_test_of_lightnings_is_a_stack_test_in_each_parametrisation_and_nothing_else_of_its_module():
    updated = UPDATED_TESTS[0]
    test_id = f"tests.tests_pytorch.{updated.module.removesuffix('.py').replace('/', '.')}::{updated.test}"
    assert is_stack_test(test_id) and is_stack_test(f"{test_id}[False]")
    assert not is_stack_test(f"{test_id}_elsewhere") and not is_stack_test(test_id.split("::")[0] + "::test_other")
    assert is_stack_test(f"::{stack_test_ids()[0]}")  # an added module that does not import on stock



def test_an_updated_test_passes_with_the_stack_and_fails_on_stock_in_one_parametrisation_at_least():
    updated = UPDATED_TESTS[0]
    test_id = f"tests.tests_pytorch.{updated.module.removesuffix('.py').replace('/', '.')}::{updated.test}"
    stock = {f"{test_id}[a]": Outcome("failed"), f"{test_id}[b]": Outcome("passed")}
    rows = judge_stack_tests(stock, {f"{test_id}[a]": Outcome("passed"), f"{test_id}[b]": Outcome("passed")})
    assert [row["updated"] for row in rows] == [True, True]
    assert stack_tests_not_shown(rows) == []
    unchanged = judge_stack_tests({f"{test_id}[a]": Outcome("passed")}, {f"{test_id}[a]": Outcome("failed")})
    assert stack_tests_not_shown(unchanged) == [f"{test_id}[a]: fails with the stack",
                                                f"{test_id}: updated, but no parametrisation of it fails on stock"]


def test_a_difference_that_passes_on_both_builds_in_every_rerun_is_not_repeated_before_any_entry():
    flake = {"test": "t.callbacks::test_spawn", "stock": "passed", "patched": "failed",
             "reruns": {"stock": ["passed"] * 3, "patched": ["passed"] * 3}}
    change = {"test": "t.loops::test_progress", "stock": "passed", "patched": "failed",
              "reruns": {"stock": ["passed"] * 3, "patched": ["failed", "passed", "passed"]}}
    assert classify([flake, change], {"t.callbacks::test_spawn": Deliberate("C1", "a stale entry")}) == [
        "t.callbacks::test_spawn"]
    assert flake["classification"] == "not repeated"
    assert flake["why"] == "passed in every rerun (3 on stock and 3 on patched)"
    assert change["classification"] == "unclassified"  # a rerun that fails again is not a flake


def test_the_differing_parametrisations_of_a_test_run_again_together_each_outcome_read_per_row(tmp_path):
    tests = tmp_path / TEST_ROOT / "loops"
    tests.mkdir(parents=True)
    (tests / "test_rerun.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('n', [1, 2, 3])\ndef test_n(n):\n    assert n != 2\n"
    )
    # the tree's root is pytest's rootdir, as the copied pyproject.toml makes it: the junit ids start from there
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    rows = [{"test": f"tests.tests_pytorch.loops.test_rerun::test_n[{n}]"} for n in (1, 2)]
    rows.append({"test": "::tests.tests_pytorch.loops.test_broken"})  # a collection error: nothing to run alone
    rerun_differences({"stock": sys.executable}, tmp_path, rows, timeout_s=60, reruns=2)
    assert rows[0]["reruns"] == {"stock": ["passed", "passed"]}
    assert rows[1]["reruns"] == {"stock": ["failed", "failed"]}
    assert "reruns" not in rows[2]


def test_rerunning_the_differences_of_a_report_that_does_not_exist_names_the_fix(tmp_path: Path):
    missing = tmp_path / "lightning-tests.json"
    with pytest.raises(SystemExit, match="run without --rerun-differences first"):
        main(["--checkout", str(tmp_path), "--rerun-differences", "--out", str(missing)])
    assert not missing.exists()


@pytest.mark.timeout(120)
def test_a_run_records_the_revision_it_ran_at(tmp_path: Path):
    checkout = tmp_path / "checkout"
    (checkout / TEST_ROOT / "loops").mkdir(parents=True)
    (checkout / TEST_ROOT / "loops" / "test_one.py").write_text("def test_one():\n    assert True\n")
    (checkout / "pyproject.toml").write_text("")
    out = tmp_path / "lightning-tests.json"
    assert main(["--checkout", str(checkout), "--commit", "abc", "--select", "loops", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["runs"]["stock"]["counts"]["passed"] == 1
    assert report["setup"] == code_revision(Path(__file__).resolve().parent.parent / "patch")
