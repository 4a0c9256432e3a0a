"""``patch.series`` on the released sdist (downloaded once into ``patch.series.DEFAULT_CACHE``; the first run needs
PyPI): each patch applies, in order, to a fresh unpack of the release and the last leaves the patched tree; the
repository-layout series does the same to the release's package laid out as Lightning's repository; the same items
give byte-identical patches; the kept tree carries the marker naming the series.

Two sets of items, each with its stack: the project's (``patch.items.ITEMS`` in ``patch.stack.STACK``, however
many they hold) and three made here, of which the second has no code (its commit is the first's) and the third edits
what the first added, so they apply in order only.
"""

from __future__ import annotations

import email
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import patch.series as series
from patch.edits import LINE_LENGTH
from patch.environment import BuildError, check_sdist_layout, marker_series
from patch.items import ITEMS, TESTS_HERE, Item
from patch.lightning_test_differences import CLASSIFIED
from patch.migration import CHANGES
from patch.stack import STACK, Commit, PullRequest, check_stack, commit_message
from prototypes.patched import SERIES_MODULE, patch_sources_digest

pytestmark = pytest.mark.timeout(300)  # the first run downloads the sdist

# Lightning's repository (a checkout or an export holding src/lightning/pytorch) of the release, for the
# repository-layout series applied to the real thing; the check skips without it.
CHECKOUT_VARIABLE = "RFC_LIGHTNING_CHECKOUT"


def _add_function(source) -> None:
    source.module("loops.fetchers").insert("def _series_test_marker():\n    return 0\n")


def _change_function(source) -> None:
    source.module("loops.fetchers").replace("_series_test_marker", "def _series_test_marker():\n    return 1\n")


MADE_HERE = (
    Item(1, "Add a function to the fetchers", "Adds it.", _add_function),
    Item(2, "Document the flavour", "No code: the change is in Lightning's documentation.",
         changelog=(("Added", "The flavour is documented"),)),
    Item(3, "Change the function added by item 1", "Changes it.", _change_function),
)
STACK_MADE_HERE = (
    PullRequest("Add the function", "Why.", "Nothing to adapt.", (Commit((1, 2), "Add a documented function"),)),
    PullRequest("Change the function", "Why.", "Call it again.", (Commit((3,)),)),
)
ITEM_SETS = {"project-items": (ITEMS, STACK), "made-here": (MADE_HERE, STACK_MADE_HERE)}


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*")) if path.is_file() and ".git" not in path.relative_to(root).parts
    }


def _unpack(destination: Path) -> Path:
    with tarfile.open(series.download_sdist()) as archive:
        archive.extractall(destination, filter="data")
    return destination / f"pytorch_lightning-{series.RELEASE}"


def _apply_in_order(patches: list[Path], root: Path) -> None:
    for patch_file in patches:
        for check in (["--check"], []):
            result = subprocess.run(["git", "apply", *check, str(patch_file)], cwd=root,
                                    capture_output=True, text=True)
            assert result.returncode == 0, f"{patch_file.name} does not apply in order:\n{result.stderr}"


def _as_repository(sdist_root: Path, destination: Path) -> Path:
    """The release's package as Lightning's repository holds it: ``src/lightning/pytorch``, its imports unified."""
    package = sdist_root / series.PACKAGE_IN_SDIST
    for path in [*package.rglob("*.py"), package / "CHANGELOG.md"]:
        target = destination / "src" / "lightning" / "pytorch" / path.relative_to(package)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(series.to_repository_layout(path.read_text()))
    return destination


@pytest.fixture(scope="module", params=list(ITEM_SETS))
def generated(request, tmp_path_factory):
    """The items applied to the sdist (a git tree) and its series in both layouts."""
    scratch = tmp_path_factory.mktemp(request.param)
    items, stack = ITEM_SETS[request.param]
    with pytest.MonkeyPatch.context() as patch_module:
        patch_module.setattr(series, "ITEMS", items)
        patch_module.setattr(series, "STACK", stack)
        tree = series.patched_tree(scratch / "tree")
        layouts = {layout: series.write_series(tree, scratch / f"series-{layout}", layout)
                   for layout in ("sdist", "repository")}
        kept = series.keep_tree(tree, scratch / "kept")
        yield dict(items=items, stack=stack, tree=tree, kept=kept, identity=series.series_identity(tree),
                   scratch=scratch, **layouts)


def test_one_directory_per_pull_request_with_its_commits_numbered_through_the_stack(generated):
    stack, patches = generated["stack"], generated["sdist"]
    directories = sorted({path.parent for path in patches})
    assert [d.name.split("-", 1)[0] for d in directories] == [str(n) for n in range(1, len(stack) + 1)]
    assert [len(list(d.glob("*.patch"))) for d in directories] == [len(pr.commits) for pr in stack]
    assert [path.name[:4] for path in patches] == [f"{n:04d}" for n in range(1, len(patches) + 1)]
    for path, commit in zip(patches, [c for pr in stack for c in pr.commits], strict=True):
        # a long subject is folded over lines, as mail headers are
        subject = re.sub(r"\n\s+", " ", email.message_from_string(path.read_text())["Subject"])
        assert subject.endswith(commit_message(commit, generated["items"]).splitlines()[0]), path.name
        assert "\ndiff --git " in path.read_text(), f"{path.name} is empty"


def test_each_description_gives_its_commits_what_a_user_notices_how_to_adapt_its_tests_and_changelog(generated):
    for directory, pull_request in zip(sorted({p.parent for p in generated["sdist"]}), generated["stack"], strict=True):
        text = (directory / series.DESCRIPTION).read_text()
        assert text.startswith(f"# {pull_request.title}\n"), directory.name
        for heading in ("## Commits", "## What a user notices", "## How to adapt", "## Tests", "## CHANGELOG"):
            assert f"\n{heading}\n" in text, (directory.name, heading)
        made = [item for commit in pull_request.commits for item in generated["items"]
                if item.number in commit.items]
        assert all(f"**{item.title}**" in text for item in made), directory.name
        assert all(" ".join(entry.split()) in text for item in made for _, entry in item.changelog), directory.name
        tests = [module for item in made for module in item.tests if Path(module).name.startswith("test_")]
        assert all(f"- `{module}`: `test_" in text for module in tests), directory.name
        if generated["items"] is ITEMS:  # the migration table's rows of the items it makes, under how to adapt
            numbers = {item.number for item in made}
            adapt = text.split("## How to adapt")[1].split("## Tests")[0]
            assert all(change.adapt in adapt for change in CHANGES if set(change.items) & numbers), directory.name


def test_a_stack_that_misplaces_an_item_or_makes_an_empty_commit_is_refused(generated, monkeypatch, tmp_path):
    if generated["items"] is not MADE_HERE:
        pytest.skip("the items made here")
    missing = (PullRequest("Add", "Why.", "Nothing.", (Commit((1,)), Commit((3,)))),)
    with pytest.raises(ValueError, match=r"make items \[1, 3\]; the change list has \[1, 2, 3\]"):
        check_stack(missing, MADE_HERE)
    unnamed = (PullRequest("Add", "Why.", "Nothing.", (Commit((1, 2)), Commit((3,)))),)
    with pytest.raises(ValueError, match=r"commits of several items need a subject: \[\(1, 2\)\]"):
        check_stack(unnamed, MADE_HERE)
    without_code = Item(2, "Document the flavour", "No code and no CHANGELOG entry.")
    monkeypatch.setattr(series, "ITEMS", (MADE_HERE[0], without_code, MADE_HERE[2]))
    monkeypatch.setattr(series, "STACK", (PullRequest("All", "Why.", "Nothing.", (
        Commit((1,)), Commit((2,)), Commit((3,)))),))
    with pytest.raises(ValueError, match=r"the stack's commit of items \(2,\) changes nothing"):
        series.patched_tree(tmp_path / "tree")


# what Lightning's reviewers would find in added lines and should not: this repository's words (the RFC's item tags,
# the suite's clauses, the benchmarks' scenarios, its designs and prototypes), and lines past Lightning's 120 columns
OUR_WORDS_RE = re.compile(r"\[RFC \d+\]|\bclause\b|\bC\d{1,2}\b|\bS\d\b|\bdesigns?\b|\bprototypes?\b", re.I)


def test_the_added_lines_speak_lightnings_language_in_its_line_length(generated):
    if generated["items"] is not ITEMS:
        pytest.skip("the series of the items made here for the test")
    found = []
    for path in generated["sdist"]:
        source_file = False
        for line in path.read_text().split("\ndiff --git ", 1)[-1].splitlines():
            if line.startswith("+++ "):
                source_file = line.endswith(".py")  # the CHANGELOG's entries are one line each, as Lightning's
            elif line.startswith("+") and ((source_file and len(line) - 1 > LINE_LENGTH) or OUR_WORDS_RE.search(line)):
                found.append(f"{path.name}: {line[1:][:140]}")
    assert not found, "added lines Lightning would not take:\n" + "\n".join(found)


# what a change to Lightning must not reach for: torch's private DDP state, hooks on what the user did not ask to hook
PRIVATE_OR_GLOBAL = ("_comm_hooks", "_use_python_reducer", "register_comm_hook", "register_optimizer_step_pre_hook",
                     "_version")


def test_the_added_lines_use_no_private_torch_state_and_no_global_hook(generated):
    if generated["items"] is not ITEMS:
        pytest.skip("the series of the items made here for the test")
    found = [f"{path.name}: {line[1:].strip()}" for path in generated["repository"]
             for line in path.read_text().splitlines()
             if line.startswith("+") and not line.startswith("+++") and any(name in line for name in PRIVATE_OR_GLOBAL)]
    assert not found, "added lines that use torch's private state or a process-global hook:\n" + "\n".join(found)


def test_the_summary_of_the_committed_series_is_within_its_budgets():
    summary = json.loads((Path(__file__).resolve().parent.parent / "rfc" / "results" / "patch-series.json").read_text())
    assert not series.over_budget(summary)


def test_every_commit_passes_lightnings_ruff_on_the_files_it_touches(generated, tmp_path):
    """What Lightning's pre-commit hooks check on a pull request (``ruff check``, ``ruff format --check``, with the
    configuration of the release's ``pyproject.toml`` and the ruff this project pins), on each commit of the series:
    every prefix of the stack is a state a maintainer could merge."""
    tree = generated["tree"]
    found = []
    for commit in series.commits(tree):
        touched = [f for f in series.git(tree, "diff-tree", "--no-commit-id", "--name-only", "-r", commit).split()
                   if f.endswith(".py")]
        if not touched:
            continue
        checkout = tmp_path / commit[:12]
        series.git(tree, "worktree", "add", "--quiet", "--detach", str(checkout), commit)
        for check in (["check", "--output-format", "concise"], ["format", "--check"]):
            result = subprocess.run([sys.executable, "-m", "ruff", *check, "--no-cache", *touched], cwd=checkout,
                                    capture_output=True, text=True)
            if result.returncode:
                found.append(f"{commit[:12]} ruff {check[0]}:\n{result.stdout}{result.stderr}")
    assert not found, "\n".join(found)


def test_each_patch_applies_in_order_to_a_fresh_unpack_and_the_last_leaves_the_patched_tree(generated):
    fresh = _unpack(generated["scratch"] / "fresh")
    _apply_in_order(generated["sdist"], fresh)
    assert _files(fresh) == _files(generated["tree"])


def test_the_repository_layout_series_applies_in_order_to_the_package_laid_out_as_the_repository(generated):
    released = _as_repository(_unpack(generated["scratch"] / "released"), generated["scratch"] / "repository")
    _apply_in_order(generated["repository"], released)
    expected = _as_repository(generated["tree"], generated["scratch"] / "expected")
    assert _files(released) == _files(expected)


def test_the_repository_layout_series_applies_to_a_lightning_checkout(generated, tmp_path):
    checkout = os.environ.get(CHECKOUT_VARIABLE)
    if not checkout:
        pytest.skip(f"set {CHECKOUT_VARIABLE} to a Lightning checkout of the release (with src/lightning/pytorch)")
    package = Path("src") / "lightning" / "pytorch"
    shutil.copytree(Path(checkout) / package, tmp_path / package)
    _apply_in_order(generated["repository"], tmp_path)


def test_the_same_items_give_byte_identical_patches(generated, monkeypatch):
    monkeypatch.setattr(series, "ITEMS", generated["items"])
    monkeypatch.setattr(series, "STACK", generated["stack"])
    again = series.patched_tree(generated["scratch"] / "again")
    patches = series.write_series(again, generated["scratch"] / "again-series", "sdist")
    assert [path.read_bytes() for path in patches] == [path.read_bytes() for path in generated["sdist"]]
    assert series.series_identity(again) == generated["identity"]


def test_the_kept_tree_is_the_patched_sdist_with_the_marker_naming_the_series(generated):
    kept, marker_path = generated["kept"], series.PACKAGE_IN_SDIST / f"{SERIES_MODULE}.py"
    marker = runpy.run_path(str(kept / marker_path))
    commits = sum(len(pull_request.commits) for pull_request in generated["stack"])
    assert (marker["PATCHES"], marker["SERIES"]) == (commits, generated["identity"])
    assert marker["SOURCES"] == patch_sources_digest() and marker_series(kept) == generated["identity"]
    assert {name for name in _files(kept) if name != marker_path.as_posix()} == set(_files(generated["tree"]))
    check_sdist_layout(kept)  # what `pip install` of it builds: the standalone package


def test_a_tree_without_the_marker_from_other_sources_or_with_another_package_is_refused(
    generated, tmp_path, monkeypatch
):
    with pytest.raises(BuildError, match="has no .*pass a tree written by `python -m patch.series --out DIR --tree"):
        marker_series(generated["tree"])
    monkeypatch.setattr("patch.environment.patch_sources_digest", lambda: "sha256:changed-items")
    with pytest.raises(BuildError, match="generated from other patch/ sources than this checkout's"):
        marker_series(generated["kept"])
    monkeypatch.undo()
    shutil.copytree(generated["kept"] / "src", tmp_path / "src")
    (tmp_path / "src" / "lightning").mkdir()
    with pytest.raises(BuildError, match=r"not the sdist's \['lightning_fabric', 'pytorch_lightning'\]"):
        check_sdist_layout(tmp_path)


def test_every_test_module_written_for_lightning_belongs_to_exactly_one_item():
    claimed = [module for item in ITEMS for module in item.tests]
    written = sorted(path.relative_to(TESTS_HERE).as_posix() for path in TESTS_HERE.rglob("*.py"))
    assert sorted(claimed) == written, "name each module of patch/tests_pytorch in the `tests` of the item it tests"


def test_every_migration_row_names_items_of_the_list_and_tests_that_exist():
    """Each test a row of ``patch.migration.CHANGES`` names is a test the stack adds (``patch/tests_pytorch``), one of
    Lightning's it updates, one of Lightning's whose difference is classified, or a conformance test here."""
    updated = {f"{test.module}::{test.test}" for item in ITEMS for test in item.updated_tests}
    classified = {key.removeprefix("tests.tests_pytorch.").split("[")[0] for key in CLASSIFIED}
    here = Path(__file__).resolve().parent
    numbers = {item.number for item in ITEMS}
    for change in CHANGES:
        assert change.tests and set(change.items) <= numbers, change
        for test in change.tests:
            path, _, name = test.partition("::")
            module = path.removesuffix(".py").replace("/", ".")
            defined = any(p.is_file() and re.search(rf"^def {name}\(", p.read_text(), re.M)
                          for p in (TESTS_HERE / path, here / path))
            assert defined or test in updated or f"{module}::{name}" in classified, (
                f"{test}: neither a test the stack adds or updates, nor a classified difference, nor one of ours")
