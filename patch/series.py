"""The RFC's change list written into pytorch-lightning 2.6.6, as a patch series for review.

    python -m patch.series --out DIR [--layout sdist|repository] [--sdist-cache DIR] [--tree DIR] [--summary FILE]

Downloads the release's sdist (``pip download --no-deps --no-binary :all: pytorch-lightning==2.6.6``), unpacks it
into a git repository, applies the items of ``patch.items`` in the RFC's order, one commit per item, and writes the
commits with ``git format-patch`` into ``--out``: ``0001-…patch`` is item 1, each applying on the one before. An item
with no code is still a patch: what it changes is Lightning's documentation, or its message says why it has none.

``--layout repository`` writes the same series for the Lightning repository (``src/lightning/pytorch/``, importing
``lightning.pytorch`` and ``lightning.fabric``), where maintainers review it; the sdist is the standalone package
``pytorch_lightning``, whose files the release process generated from those by renaming the imports. ``--tree DIR``
also keeps the patched sdist (a directory ``pip install`` accepts): ``python -m patch.environment`` builds from it.
``--summary rfc/results/patch-series.json`` writes, per item, the module here that makes its patch and the lines the
patch adds to and removes from each of Lightning's files: the RFC's change list renders them beside its code pointers.

The kept tree carries one file the series does not: the marker module ``pytorch_lightning/_rfc_patch_series.py``
(``prototypes.patched.SERIES_MODULE``), naming the series by a hash of its patches and the ``patch/`` sources that
generated it, so an environment can tell its package is patched, and by what.

The commits carry a fixed date, so the same items applied to the same release give byte-identical patches (and the
same hash).
"""

from __future__ import annotations

import argparse
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

from patch.edits import LightningSource
from patch.items import ITEMS
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
# --always: an item without code is a commit without a diff, and still a patch (its message says why).
_FORMAT_PATCH = ("--always", "--zero-commit", "--no-signature")
# Any fixed date: a commit's date is in its patch, and a date of generation would change the series' hash each run.
_COMMIT_DATE = "2000-01-01T00:00:00+0000"


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


def _git(tree: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": _COMMIT_DATE, "GIT_COMMITTER_DATE": _COMMIT_DATE}
    return subprocess.run(
        ["git", *_AUTHOR, *args], cwd=tree, env=env, check=True, capture_output=True, text=True
    ).stdout


def patched_tree(dest: Path, cache: Path = DEFAULT_CACHE) -> Path:
    """Unpack the sdist into ``dest`` (a new directory), commit it as released, then each item as a commit of its
    own. Returns the unpacked sdist's root, a git repository whose history is the series."""
    with tarfile.open(download_sdist(cache)) as archive:
        archive.extractall(dest, filter="data")
    root = dest / f"pytorch_lightning-{RELEASE}"
    _git(root, "init", "--quiet")
    _git(root, "add", "--all")
    _git(root, "commit", "--quiet", "-m", f"pytorch-lightning {RELEASE} as released (sdist)")
    source = LightningSource(root / PACKAGE_IN_SDIST, "pytorch_lightning")
    for item in ITEMS:
        item.apply(source)
        lightning_style(root, _changed_python_files(root))
        _git(root, "add", "--all")
        _git(root, "commit", "--quiet", "--allow-empty", "-m", item.commit_message())
    return root


def _changed_python_files(root: Path) -> list[str]:
    """The Python files the working tree changes or adds against its last commit."""
    listed = _git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    return sorted(line[3:] for line in listed if line.endswith(".py") and not line.startswith(" D"))


def lightning_style(root: Path, files: list[str]) -> None:
    """What Lightning's pre-commit hooks do to a file before it is committed: ``ruff check --fix --unsafe-fixes``,
    then ``ruff format``, with the ruff this project pins (the version Lightning's hooks pin) and the configuration
    of the sdist's own ``pyproject.toml`` (Lightning's: 120 columns, its rule selection). Raises, with the findings,
    where a finding remains that no fix removes: the item's code must change."""
    if not files:
        return
    ruff = [sys.executable, "-m", "ruff"]
    no_cache = "--no-cache"  # the tree is committed whole
    subprocess.run([*ruff, "check", no_cache, "--quiet", "--fix", "--unsafe-fixes", "--exit-zero", *files], cwd=root,
                   check=True)
    subprocess.run([*ruff, "format", no_cache, "--quiet", *files], cwd=root, check=True)
    remaining = subprocess.run([*ruff, "check", no_cache, "--output-format", "concise", *files], cwd=root,
                               capture_output=True, text=True)
    if remaining.returncode:
        raise RuntimeError(f"Lightning's ruff rules find what no fix removes; change the item's code:\n"
                           f"{remaining.stdout}{remaining.stderr}")


def series_identity(tree: Path) -> str:
    """A hash of the series ``patched_tree`` committed in ``tree``: its patches in the sdist layout, in order."""
    series = _git(tree, "format-patch", *_FORMAT_PATCH, "--stdout", f"HEAD~{len(ITEMS)}")
    return f"sha256:{hashlib.sha256(series.encode()).hexdigest()}"


def marker_text(tree: Path) -> str:
    """The marker module's text for the package patched in ``tree`` (``prototypes.patched`` reads it)."""
    return (
        f'"""Written by `python -m patch.series`: this package is pytorch-lightning {RELEASE} with the RFC\'s patch '
        'series applied."""\n\n'
        f"RELEASE = {RELEASE!r}\n"
        f"PATCHES = {len(ITEMS)}\n"
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
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.patch"):
        old.unlink()
    names = _git(tree, "format-patch", *_FORMAT_PATCH, "--quiet", "-o", str(out), f"HEAD~{len(ITEMS)}").split()
    patches = [Path(name) if Path(name).is_absolute() else out / name for name in names] or sorted(out.glob("*.patch"))
    if layout == "repository":
        for patch_file in patches:
            patch_file.write_text(to_repository_layout(patch_file.read_text()))
    return patches


def summary(tree: Path) -> dict:
    """Per item of the series: its number, title, the module here that makes it, and the lines its patch adds to and
    removes from each of Lightning's files (paths relative to the package)."""
    commits = _git(tree, "rev-list", "--reverse", f"HEAD~{len(ITEMS)}..HEAD").split()
    items = []
    for item, commit in zip(ITEMS, commits, strict=True):
        files = []
        for line in _git(tree, "show", "--numstat", "--format=", commit).splitlines():
            added, removed, path = line.split("\t")
            files.append({
                "path": str(Path(path).relative_to(PACKAGE_IN_SDIST)), "added": int(added), "removed": int(removed)
            })
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
    return {"schema": 1, "release": RELEASE, "items": items}


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
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        tree = patched_tree(Path(scratch), args.sdist_cache)
        patches = write_series(tree, args.out, args.layout)
        if args.summary:
            args.summary.write_text(json.dumps(summary(tree), indent=1) + "\n")
        if args.tree:
            keep_tree(tree, args.tree)
    print(f"{len(patches)} patches ({args.layout} layout) in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
