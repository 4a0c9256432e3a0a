"""The RFC's change list written into pytorch-lightning 2.6.6, as a stack of pull requests for review.

    python -m patch.series --out DIR [--layout sdist|repository] [--sdist-cache DIR] [--tree DIR] [--summary FILE]

Downloads the release's sdist (``pip download --no-deps --no-binary :all: pytorch-lightning==2.6.6``), unpacks it
into a git repository, applies the items of ``patch.items`` grouped into the commits and pull requests of
``patch.stack``, and writes the stack with ``git format-patch`` into ``--out``: one directory per pull request
(``1-…/``, ``2-…/``) with its patches, numbered through the stack so that ``git am DIR/*/*.patch`` applies them in
order, and its description (``DESCRIPTION.md``: what it changes and why, its commits, what a user notices, how to
adapt, its CHANGELOG entries).

``--layout repository`` writes the same series for the Lightning repository (``src/lightning/pytorch/``, importing
``lightning.pytorch`` and ``lightning.fabric``), where maintainers review it; the sdist is the standalone package
``pytorch_lightning``, whose files the release process generated from those by renaming the imports. ``--tree DIR``
also keeps the patched sdist (a directory ``pip install`` accepts): ``python -m patch.environment`` builds from it.
``--summary rfc/results/patch-series.json`` writes, per item, the module here that makes it and the lines it adds to
and removes from each of Lightning's files (the RFC's change list renders them beside its code pointers), and the
stack's pull requests with their commits.

The kept tree carries one file the series does not: the marker module ``pytorch_lightning/_rfc_patch_series.py``
(``prototypes.patched.SERIES_MODULE``), naming the series by a hash of its patches and the ``patch/`` sources that
generated it, so an environment can tell its package is patched, and by what.

The commits carry a fixed date, so the same items in the same stack applied to the same release give byte-identical
patches (and the same hash).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness_common import code_revision
from patch.descriptions import describe
from patch.edits import LightningSource
from patch.items import ITEMS
from patch.lightning_test_tree import TEST_ROOT
from patch.migration import CHANGES
from patch.repository import Repository, base_tree
from patch.stack import STACK, PullRequest, check_stack, commit_message, items_of
from patch.stack import commits as stack_commits
from prototypes.patched import SERIES_MODULE, patch_sources_digest

RELEASE = "2.6.6"
PACKAGE_IN_SDIST = Path("src") / "pytorch_lightning"
DEFAULT_CACHE = Path.home() / ".cache" / "rfc-dataloader-iter" / "sdist"
# The standalone packages' names -> the repository's (the release process renames the other way).
REPOSITORY_NAMES = (
    ("src/pytorch_lightning/", "src/lightning/pytorch/"),
    ("pytorch_lightning", "lightning.pytorch"),
    ("lightning_fabric", "lightning.fabric"),
)
_AUTHOR = ["-c", "user.name=rfc-dataloader-iter", "-c", "user.email=rfc-dataloader-iter@localhost"]
_FORMAT_PATCH = ("--zero-commit", "--no-signature")
# Any fixed date: a commit's date is in its patch, and a date of generation would change the series' hash each run.
_COMMIT_DATE = "2000-01-01T00:00:00+0000"
BASE_TAG = "base"  # the sdist as released, or the repository at its commit: the stack's base
ITEMS_BRANCH = "items"  # one commit per item, in the stack's order: what each item changes
DESCRIPTION = "DESCRIPTION.md"  # a pull request's description, beside its patches
# what the stack may add to the package's modules (tests and the CHANGELOG aside) for a reviewer to take in
SOURCE_LINES_BUDGET = 600  # non-blank lines the stack adds to the package's modules
PULL_REQUEST_BUDGET = 400  # the same, per pull request
FETCHERS_GROWTH_BUDGET = 300  # how much longer `loops/fetchers.py` may get
FETCHERS = PACKAGE_IN_SDIST / "loops" / "fetchers.py"


def download_sdist(cache: Path = DEFAULT_CACHE) -> Path:
    """The release's sdist, downloaded once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"pytorch_lightning-{RELEASE}.tar.gz"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"pytorch-lightning=={RELEASE}", "-d", str(cache)],
            check=True,
        )
        found = sorted(cache.glob(f"pytorch_lightning-{RELEASE}.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip download wrote no pytorch_lightning-{RELEASE}.tar.gz into {cache}")
    return found[0]


def git(tree: Path, *args: str) -> str:
    """``git args`` in ``tree``, as the series' author at its fixed date; its output."""
    env = {**os.environ, "GIT_AUTHOR_DATE": _COMMIT_DATE, "GIT_COMMITTER_DATE": _COMMIT_DATE}
    return subprocess.run(
        ["git", *_AUTHOR, *args], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout


def patched_tree(dest: Path, cache: Path = DEFAULT_CACHE, repository: Repository | None = None) -> Path:
    """Unpack the sdist into ``dest`` (a new directory), or lay out ``repository`` at its commit as the sdist is laid
    out (``patch.repository.base_tree``), and commit it (tag ``BASE_TAG``); apply the items in the stack's order, one
    commit each (branch ``ITEMS_BRANCH``: what each item changes), then write the stack: one commit per commit of
    ``patch.stack.STACK`` on the base, each the tree of its last item's commit. Returns the tree's root, a git
    repository whose ``HEAD`` is the stack's last commit."""
    check_stack(STACK, ITEMS)
    if repository is None:
        with tarfile.open(download_sdist(cache)) as archive:
            archive.extractall(dest, filter="data")
        root, base = dest / f"pytorch_lightning-{RELEASE}", f"pytorch-lightning {RELEASE}"
    else:
        root = base_tree(repository, dest)
        base = f"Lightning's repository at {repository.full_commit()}"
    git(root, "init", "--quiet")
    git(root, "add", "--all")
    git(root, "commit", "--quiet", "-m", f"{base}, laid out as the release's sdist")
    git(root, "tag", BASE_TAG)
    source = LightningSource(root / PACKAGE_IN_SDIST, "pytorch_lightning")
    tests_root = root / TEST_ROOT  # a repository's, not the sdist's
    last_item_commit = {}
    for commit in stack_commits(STACK):
        for item in items_of(commit, ITEMS):
            item.apply(source, tests_root if tests_root.is_dir() else None)
            lightning_style(root, _changed_python_files(root))
            git(root, "add", "--all")
            git(root, "commit", "--quiet", "--allow-empty", "-m", item.commit_message())
        last_item_commit[commit] = git(root, "rev-parse", "HEAD").strip()
    git(root, "branch", ITEMS_BRANCH)
    git(root, "checkout", "--quiet", "--detach", BASE_TAG)
    for commit, tree in last_item_commit.items():
        git(root, "read-tree", "-u", "--reset", tree)
        if not git(root, "status", "--porcelain"):
            raise ValueError(f"the stack's commit of items {commit.items} changes nothing: every commit must carry a "
                             "change, so place an item without one in the commit whose code makes it")
        git(root, "commit", "--quiet", "-m", commit_message(commit, ITEMS))
    return root


def commits(tree: Path, ref: str = "HEAD") -> list[str]:
    """The commits ``patched_tree`` made in ``tree`` after the release, oldest first: the stack's (``HEAD``) or, with
    ``ref=ITEMS_BRANCH``, one per item."""
    return git(tree, "rev-list", "--reverse", f"{BASE_TAG}..{ref}").split()


def _changed_python_files(root: Path) -> list[str]:
    """The Python files the working tree changes or adds against its last commit."""
    listed = git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    return sorted(line[3:] for line in listed if line.endswith(".py") and not line.startswith(" D"))


def lightning_style(root: Path, files: list[str]) -> None:
    """What Lightning's pre-commit hooks do to a file before it is committed: ``ruff check --fix --unsafe-fixes``,
    then ``ruff format``, with the ruff this project pins (the version Lightning's hooks pin) and the configuration
    of the tree's own ``pyproject.toml`` (Lightning's: 120 columns, its rule selection). Raises, with the findings,
    where a finding remains that no fix removes: the item's code must change."""
    tests = [name for name in files if Path(name).is_relative_to(TEST_ROOT)]
    for group, options in ((sorted(set(files) - set(tests)), ()), (tests, REPOSITORY_FIRST_PARTY)):
        if group:
            _ruff(root, group, options)


# Why for the tests: they import `lightning` and their helpers' `tests_pytorch`, which ruff takes for first-party in
# Lightning's repository (it finds `src/lightning` there, and the tests run from `tests/`) and for third-party in a
# tree laid out as the sdist, where it would order the imports otherwise
REPOSITORY_FIRST_PARTY = ("--config", 'lint.isort.known-first-party = ["lightning", "tests_pytorch"]')


def _ruff(root: Path, files: list[str], options: tuple[str, ...]) -> None:
    ruff = [sys.executable, "-m", "ruff"]
    no_cache = "--no-cache"  # the tree is committed whole
    subprocess.run([*ruff, "check", no_cache, *options, "--quiet", "--fix", "--unsafe-fixes", "--exit-zero", *files],
                   cwd=root, check=True)
    subprocess.run([*ruff, "format", no_cache, *options, "--quiet", *files], cwd=root, check=True)
    remaining = subprocess.run([*ruff, "check", no_cache, *options, "--output-format", "concise", *files], cwd=root,
                               capture_output=True, text=True)
    if remaining.returncode:
        raise RuntimeError(f"Lightning's ruff rules find what no fix removes; change the item's code:\n"
                           f"{remaining.stdout}{remaining.stderr}")


def series_identity(tree: Path) -> str:
    """A hash of the series ``patched_tree`` committed in ``tree``: its patches in the sdist layout, in order."""
    series = git(tree, "format-patch", *_FORMAT_PATCH, "--stdout", BASE_TAG)
    return f"sha256:{hashlib.sha256(series.encode()).hexdigest()}"


def marker_text(tree: Path) -> str:
    """The marker module's text for the package patched in ``tree`` (``prototypes.patched`` reads it)."""
    return (
        f'"""Written by `python -m patch.series`: this package is pytorch-lightning {RELEASE} with the RFC\'s patch '
        'series applied."""\n\n'
        f"RELEASE = {RELEASE!r}\n"
        f"PATCHES = {len(commits(tree))}\n"
        "# sha256 of the series' patches (sdist layout, in order) and of the patch/ sources that generated them\n"
        f"SERIES = {series_identity(tree)!r}\n"
        f"SOURCES = {patch_sources_digest()!r}\n"
    )


def keep_tree(tree: Path, dest: Path) -> Path:
    """Copy the patched sdist to ``dest`` (replaced if present) without its git history, with the marker module."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(tree, dest, ignore=shutil.ignore_patterns(".git"))
    (dest / PACKAGE_IN_SDIST / f"{SERIES_MODULE}.py").write_text(marker_text(tree))
    return dest


def write_series(tree: Path, out: Path, layout: str) -> list[Path]:
    """The stack in ``out``: per pull request a directory ``<n>-<title>`` holding its patches, numbered through the
    stack (``git am out/*/*.patch`` applies them all, in order), and its description, ``DESCRIPTION.md``. Returns the
    patches in order."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9]*-*"):
        if (old / DESCRIPTION).is_file():
            shutil.rmtree(old)
    patches = []
    for number, (pull_request, shas, rows) in enumerate(_pull_requests(tree), start=1):
        directory = out / f"{number}-{_slug(pull_request.title)}"
        directory.mkdir()
        git(tree, "format-patch", *_FORMAT_PATCH, "--quiet", "--start-number", str(len(patches) + 1),
             "-o", str(directory), f"{shas[0]}~..{shas[-1]}")
        written = sorted(directory.glob("*.patch"))
        if layout == "repository":
            for patch_file in written:
                patch_file.write_text(to_repository_layout(patch_file.read_text()))
        (directory / DESCRIPTION).write_text(describe(number, STACK, ITEMS, rows, RELEASE))
        patches += written
    return patches


def _pull_requests(tree: Path) -> list[tuple[PullRequest, list[str], list[dict]]]:
    """Each pull request of ``STACK`` with its commits in ``tree``: their ids, and per commit its subject, its items
    and the lines it changes per file."""
    stack, grouped = commits(tree), []
    for pull_request in STACK:
        shas, stack = stack[:len(pull_request.commits)], stack[len(pull_request.commits):]
        rows = []
        for commit, sha in zip(pull_request.commits, shas, strict=True):
            files = _numstat(tree, sha)
            rows.append({"subject": git(tree, "log", "-1", "--format=%s", sha).strip(), "items": list(commit.items),
                         "files": files, "added": sum(f["added"] for f in files),
                         "removed": sum(f["removed"] for f in files)})
        grouped.append((pull_request, shas, rows))
    return grouped


def _slug(title: str, words: int = 6) -> str:
    return "-".join(re.findall(r"[a-z0-9]+", title.lower())[:words])


def _numstat(tree: Path, commit: str) -> list[dict]:
    """The lines ``commit`` adds to and removes from each file (paths relative to the package; a test's, to the
    tree)."""
    files = []
    for line in git(tree, "show", "--numstat", "--format=", commit).splitlines():
        added, removed, path = line.split("\t")
        in_package = Path(path).is_relative_to(PACKAGE_IN_SDIST)
        files.append({"path": str(Path(path).relative_to(PACKAGE_IN_SDIST)) if in_package else path,
                      "added": int(added), "removed": int(removed)})
    return files


def added_source_lines(tree: Path, since: str = BASE_TAG, until: str = "HEAD") -> dict[str, int]:
    """The lines the commits ``since..until`` (by default the stack) add to the package's modules (its tests and the
    CHANGELOG are not among them), by kind: ``code``, ``docstrings``, ``comments`` and ``blank``; what the RFC holds
    against the pull requests' size."""
    counts = dict.fromkeys(("code", "docstrings", "comments", "blank"), 0)
    added: dict[str, list[int]] = {}
    path = None
    for line in git(tree, "diff", "-U0", since, until, "--", PACKAGE_IN_SDIST.as_posix()).splitlines():
        if line.startswith("+++ "):
            path = line[len("+++ b/"):] if line.endswith(".py") else None
        elif path and (hunk := re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)):
            start, length = int(hunk.group(1)), int(hunk.group(2) or 1)
            added.setdefault(path, []).extend(range(start, start + length))
    for path, numbers in added.items():
        source = git(tree, "show", f"{until}:{path}")
        lines = source.splitlines()
        docstrings = {number for node in ast.walk(ast.parse(source))
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and ast.get_docstring(node, clean=False) is not None
                      for number in range(node.body[0].lineno, node.body[0].end_lineno + 1)}
        for number in numbers:
            text = lines[number - 1].strip()
            kind = ("blank" if not text else "docstrings" if number in docstrings
                    else "comments" if text.startswith("#") else "code")
            counts[kind] += 1
    return counts


def summary(tree: Path) -> dict:
    """Per item of the series (in the change list's order): its number, title, the module here that makes it, and
    the lines its edits add to and remove from each of Lightning's files (paths relative to the package); per pull
    request of the stack: its title and its commits, each with its subject, its items and its lines per file."""
    made_by = dict(zip([item.number for commit in stack_commits(STACK) for item in items_of(commit, ITEMS)],
                       commits(tree, ITEMS_BRANCH), strict=True))
    items = []
    for item in ITEMS:
        files = _numstat(tree, made_by[item.number])
        code = Path(inspect.getfile(item.apply_edits)) if item.apply_edits else None
        items.append({
            "number": item.number,
            "title": item.title,
            "part": item.part,
            "why": item.why.strip(),
            "code": str(code.relative_to(Path(__file__).resolve().parent.parent)) if code else None,
            "files": files,
            "added": sum(f["added"] for f in files),
            "removed": sum(f["removed"] for f in files),
        })
    pull_requests = [
        {"title": pull_request.title, "commits": rows,
         "added_source": _non_blank(added_source_lines(tree, f"{shas[0]}~", shas[-1]))}
        for pull_request, shas, rows in _pull_requests(tree)
    ]
    fetchers = [len(git(tree, "show", f"{ref}:{FETCHERS.as_posix()}").splitlines()) for ref in (BASE_TAG, "HEAD")]
    return {"schema": 2, "release": RELEASE, "items": items, "pull_requests": pull_requests,
            "added_source": added_source_lines(tree), "source_lines_budget": SOURCE_LINES_BUDGET,
            "pull_request_budget": PULL_REQUEST_BUDGET,
            "fetchers_growth": fetchers[1] - fetchers[0], "fetchers_growth_budget": FETCHERS_GROWTH_BUDGET,
            "migration": [dataclasses.asdict(change) for change in CHANGES]}


def _non_blank(counts: dict[str, int]) -> int:
    return counts["code"] + counts["docstrings"] + counts["comments"]


def over_budget(summary: dict) -> list[str]:
    """What in a ``summary`` passes its budget: the stack's added source lines, a pull request's, the growth of
    ``loops/fetchers.py``; empty where all hold."""
    over = []
    if (total := _non_blank(summary["added_source"])) > summary["source_lines_budget"]:
        over.append(f"the stack adds {total} source lines, over its budget of {summary['source_lines_budget']}")
    over += [f"pull request {number} ({pull_request['title']}) adds {pull_request['added_source']} source lines,"
             f" over its budget of {summary['pull_request_budget']}"
             for number, pull_request in enumerate(summary["pull_requests"], start=1)
             if pull_request["added_source"] > summary["pull_request_budget"]]
    if summary["fetchers_growth"] > summary["fetchers_growth_budget"]:
        over.append(f"loops/fetchers.py grows by {summary['fetchers_growth']} lines, over its budget of"
                    f" {summary['fetchers_growth_budget']}")
    return over


def to_repository_layout(patch_text: str) -> str:
    """A patch against the sdist as a patch against the repository: paths and imports renamed (context lines too,
    since the repository's files differ from the sdist's exactly by those names)."""
    for standalone, unified in REPOSITORY_NAMES:
        patch_text = re.sub(rf"(?<![\w.]){re.escape(standalone)}", unified, patch_text)
    return patch_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the series (*.patch)")
    parser.add_argument("--layout", choices=("sdist", "repository"), default="sdist")
    parser.add_argument("--sdist-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--tree", type=Path, help="also keep the patched sdist here (replaced if present)")
    parser.add_argument("--summary", type=Path, help="write each item's code here and lines changed (JSON)")
    parser.add_argument("--repository", type=Path, help="make the stack on this Lightning git directory's --commit")
    parser.add_argument("--commit", default="HEAD", help="the repository's commit (default: HEAD)")
    args = parser.parse_args(argv)
    if args.repository and (args.tree or args.summary):
        parser.error("--tree and --summary describe the stack on the release: leave out --repository")
    repository = Repository(args.repository, args.commit) if args.repository else None
    with tempfile.TemporaryDirectory() as scratch:
        tree = patched_tree(Path(scratch), args.sdist_cache, repository)
        patches = write_series(tree, args.out, args.layout)
        if args.summary:
            written = {**summary(tree), "setup": code_revision()}
            args.summary.write_text(json.dumps(written, indent=1) + "\n")
            for line in over_budget(written):
                print(f"over budget: {line}", file=sys.stderr)
            if over_budget(written):
                return 1
        if args.tree:
            keep_tree(tree, args.tree)
    print(f"{len(STACK)} pull requests, {len(patches)} patches ({args.layout} layout) in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
