"""The description of each pull request of the stack (``DESCRIPTION.md`` beside its patches): what it changes and
why, its commits, what a user notices, how to adapt (with the migration table's rows), its tests and its CHANGELOG
entries, all read from ``patch.stack``, ``patch.items`` and ``patch.migration``."""

from __future__ import annotations

import ast
from pathlib import Path

from patch.items import TESTS_HERE, Item
from patch.lightning_test_tree import TEST_ROOT
from patch.migration import CHANGES
from patch.stack import PullRequest, items_of

CHANGELOG_SECTIONS = ("Added", "Changed", "Fixed")  # Lightning's CHANGELOG's, in its order


def describe(number: int, stack: tuple[PullRequest, ...], items: tuple[Item, ...], rows: list[dict],
             release: str) -> str:
    """The description of pull request ``number`` of ``stack``, which makes ``items`` on pytorch-lightning
    ``release``: what it changes and why, its commits (``rows``: per commit its subject, its files with their lines,
    and its lines), what a user notices, how to adapt, and its CHANGELOG entries."""
    pull_request = stack[number - 1]
    base = (f"on pull request {number - 1}, \"{stack[number - 2].title}\"" if number > 1
            else f"on pytorch-lightning {release}")
    lines = [f"# {pull_request.title}", "", " ".join(pull_request.why.split()), "",
             f"Pull request {number} of the {len(stack)} that make a `training_step(self, dataloader_iter)` get the"
             f" batches it consumes; it applies {base}.", "", "## Commits", "",
             "| Commit | Files | Lines (+/−) |", "| --- | --- | --- |"]
    lines += [f"| {row['subject']} | {_files_cell(row['files'])} | +{row['added']} −{row['removed']} |" for row in rows]
    made = [item for commit in pull_request.commits for item in items_of(commit, items)]
    lines += ["", "## What a user notices", ""]
    lines += [f"- **{item.title}**. {' '.join(item.why.split())}" for item in made]
    lines += ["", "## How to adapt", "", " ".join(pull_request.adapt.split()), *_migration_lines(made), "", "## Tests",
              "", *_tests_lines(made),
              "", "## CHANGELOG", ""]
    for heading in CHANGELOG_SECTIONS:
        entries = [entry for item in made for section, entry in item.changelog if section == heading]
        lines += [f"### {heading}", "", *(f"- {entry}" for entry in entries), ""] if entries else []
    return "\n".join(lines).rstrip("\n") + "\n"


def _migration_lines(made: list[Item]) -> list[str]:
    """The rows of the migration table (``patch.migration.CHANGES``) whose items this pull request makes."""
    numbers = {item.number for item in made}
    rows = [change for change in CHANGES if set(change.items) & numbers]
    if not rows:
        return []
    lines = ["", "| Today | With this change | How to adapt |", "| --- | --- | --- |"]
    cells = [[text.replace("|", "\\|") for text in (change.old, change.new, change.adapt)] for change in rows]
    return lines + [f"| {' | '.join(row)} |" for row in cells]


def _tests_lines(made: list[Item]) -> list[str]:
    """The test modules the items add to Lightning's tests, with their tests (read from ``patch/tests_pytorch``), and
    Lightning's tests they update."""
    modules = [module for item in made for module in item.tests]
    updated = [test for item in made for test in item.updated_tests]
    if not modules:
        lines = ["No test of its own under `tests/tests_pytorch` yet."]
    else:
        lines = [f"In `{TEST_ROOT.as_posix()}` (the stack made on Lightning's repository carries them; the sdist"
                 " has no tests); `python -m patch.lightning_tests --stack-tests` runs each on stock and on the stack,"
                 " where it must fail and pass:", ""]
    for module in modules:
        tree = ast.parse((TESTS_HERE / module).read_text())
        names = [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
        what = ", ".join(f"`{name}`" for name in names) or " ".join((ast.get_docstring(tree) or "").split())
        lines.append(f"- `{module}`: {what}")
    if updated:
        lines += ["", "Lightning's tests that asserted the old behaviour, updated in the commit that changes it:", ""]
        lines += [f"- `{test.module}::{test.test}`: {' '.join(test.why.split())}" for test in updated]
    return lines


def _files_cell(files: list[dict]) -> str:
    """The files a commit changes, those of one directory counted together where there are several."""
    by_directory: dict[str, list[str]] = {}
    for changed in files:
        by_directory.setdefault(str(Path(changed["path"]).parent), []).append(changed["path"])
    return ", ".join(f"`{paths[0]}`" if len(paths) == 1 else f"`{directory}/` ({len(paths)} files)"
                     for directory, paths in by_directory.items())
