"""Lightning's repository at a commit (its master, say) as the base of the stack, and the stack applied to it.

A pull request is made against master, not against a release. ``base_tree`` lays the repository's
``src/lightning/pytorch`` and ``src/lightning/fabric`` out as the release's sdist lays out its standalone packages
(their imports renamed as for the standalone packages' tests, ``patch.lightning_test_tree.rewrite_imports``), so
that the items apply to master's code as they do to the release's; ``patch.series`` then writes the
repository-layout patches, which ``git_am`` applies, with a plain ``git am``, to a clone of the repository at that
commit.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from patch.lightning_test_tree import TEST_ROOT, rewrite_imports

PACKAGES = (("src/lightning/pytorch", "src/pytorch_lightning"), ("src/lightning/fabric", "src/lightning_fabric"))
TEXT_SUFFIXES = (".py", ".md", ".pyi")
TESTS = TEST_ROOT.as_posix()


@dataclass(frozen=True)
class Repository:
    """A Lightning git repository (its git directory, a bare mirror will do) and the commit the stack is made on."""

    git_dir: Path
    commit: str

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", str(self.git_dir), *args], check=True, capture_output=True,
                              text=True).stdout

    def full_commit(self) -> str:
        return self.git("rev-parse", "--verify", f"{self.commit}^{{commit}}").strip()


def base_tree(repository: Repository, dest: Path) -> Path:
    """The repository's packages at the commit, laid out and named as the sdist's, with its tests (as they are) and
    its ``pyproject.toml`` (its ruff configuration), in ``dest`` (a new directory); returns the tree's root. Where a
    file names the standalone packages itself (an old CHANGELOG entry), ``patch.series.to_repository_layout`` would
    not bring its lines back: ``git_am`` is what tells whether the patches apply."""
    archive = subprocess.run(
        ["git", "--git-dir", str(repository.git_dir), "archive", "--format=tar", repository.commit,
         *(unified for unified, _ in PACKAGES), TESTS, "pyproject.toml"],
        check=True, capture_output=True,
    ).stdout
    unpacked = dest / "repository"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(unpacked, filter="data")
    root = dest / f"lightning-{repository.commit[:12]}"
    (root / "src").mkdir(parents=True)
    (unpacked / "pyproject.toml").rename(root / "pyproject.toml")
    (root / TESTS).parent.mkdir()
    (unpacked / TESTS).rename(root / TESTS)  # as the repository has them: the items' tests are written so
    for unified, standalone in PACKAGES:
        for path in sorted((unpacked / unified).rglob("*")):
            if not path.is_file():
                continue
            target = root / standalone / path.relative_to(unpacked / unified)
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.suffix in TEXT_SUFFIXES:
                target.write_text(rewrite_imports(path.read_text()))
            else:
                path.rename(target)
    return root


def git_am(repository: Repository, patches: list[Path], scratch: Path) -> dict:
    """Apply ``patches`` (repository layout) with ``git am`` to a clone of the repository at the commit. A blob the
    git directory lacks (a partial mirror) is dropped from the clone's index first, in a commit of its own, and
    named: ``git am`` writes trees, which needs every blob. Returns ``applied``, the commit, the dropped paths and
    ``git am``'s error."""
    commit = repository.full_commit()
    clone = scratch / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", "--shared", str(repository.git_dir), str(clone)],
                   check=True)
    missing = _missing_blobs(repository, commit)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-c", "user.name=stack", "-c", "user.email=stack@localhost", *args], cwd=clone,
                              capture_output=True, text=True, check=check)

    if missing:
        run("sparse-checkout", "set", "--no-cone", "/*", *(f"!/{path}" for path in missing))
    # Why not checked: a missing blob fails the checkout of its own path (left out of the sparse checkout) alone
    run("checkout", "--quiet", "--detach", commit, check=False)
    if run("rev-parse", "HEAD").stdout.strip() != commit:
        raise RuntimeError(f"could not check out {commit} in a clone of {repository.git_dir}")
    if missing:
        run("update-index", "--force-remove", *missing)
        run("commit", "--quiet", "-m", "Drop the blobs this mirror lacks")
    result = run("am", "--quiet", *map(str, patches), check=False)
    return dict(commit=commit, applied=result.returncode == 0, patches=len(patches), dropped=missing,
                error="" if result.returncode == 0 else (result.stdout + result.stderr).strip()[-2000:])


def _missing_blobs(repository: Repository, commit: str) -> list[str]:
    listed = [line.split(" ", 2)[1:] for line in
              repository.git("ls-tree", "-r", "--format=%(objecttype) %(objectname) %(path)", commit).splitlines()
              if line.startswith("blob ")]  # a submodule's commit is never in the repository
    checked = subprocess.run(["git", "--git-dir", str(repository.git_dir), "cat-file", "--batch-check"],
                             input="\n".join(blob for blob, _ in listed), capture_output=True, text=True,
                             check=True).stdout
    missing = {line.split()[0] for line in checked.splitlines() if line.endswith(" missing")}
    return sorted(path for blob, path in listed if blob in missing)
