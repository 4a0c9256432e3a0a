"""``patch.repository`` on a small Lightning-shaped git repository made here: the base laid out as the sdist and
back, and ``git am`` of a patch onto its commit, also where the git directory lacks a blob (a partial mirror)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from patch.lightning_test_tree import rewrite_imports
from patch.repository import Repository, base_tree, git_am
from patch.series import to_repository_layout

MODULE = '''"""Uses `lightning.pytorch` and lightning.fabric."""

from lightning.fabric.utilities import rank_zero_warn
from lightning.pytorch.loops import _Loop
import lightning.pytorch as pl


def value():
    return 1
'''


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


@pytest.fixture
def repository(tmp_path: Path) -> Repository:
    """A bare repository of a work tree holding the two packages, a test, a pyproject and a binary docs file."""
    work = tmp_path / "work"
    for path, text in (("src/lightning/pytorch/loops/module.py", MODULE),
                       ("src/lightning/fabric/__init__.py", '"""Fabric."""\n'),
                       ("tests/tests_pytorch/loops/test_module.py", MODULE),
                       ("pyproject.toml", "[tool.ruff]\nline-length = 120\n")):
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    (work / "docs").mkdir()
    (work / "docs" / "image.gif").write_bytes(b"GIF89a" + bytes(range(256)))
    _git(tmp_path, "init", "--quiet", str(work))
    _git(work, "add", "--all")
    _git(work, "commit", "--quiet", "-m", "master")
    _git(tmp_path, "clone", "--quiet", "--bare", str(work), str(tmp_path / "bare.git"))
    return Repository(tmp_path / "bare.git", "HEAD")


def _patch_changing_the_module(repository: Repository, tmp_path: Path, new_line: str) -> Path:
    clone = tmp_path / "author"
    _git(tmp_path, "clone", "--quiet", str(repository.git_dir), str(clone))
    module = clone / "src/lightning/pytorch/loops/module.py"
    module.write_text(module.read_text().replace("    return 1\n", f"    {new_line}\n"))
    _git(clone, "commit", "--quiet", "-am", "Change the value")
    return Path(clone / _git(clone, "format-patch", "-1", "--zero-commit", "HEAD").strip())


def test_the_base_is_the_repository_laid_out_as_the_sdist_and_comes_back_by_the_repository_layout(repository, tmp_path):
    root = base_tree(repository, tmp_path / "base")
    standalone = (root / "src/pytorch_lightning/loops/module.py").read_text()
    assert "from lightning_fabric.utilities import rank_zero_warn" in standalone
    assert "from pytorch_lightning.loops import _Loop" in standalone and "import pytorch_lightning as pl" in standalone
    assert "lightning.pytorch" not in standalone and "lightning.fabric" not in standalone
    assert to_repository_layout(standalone) == MODULE
    assert (root / "src/lightning_fabric/__init__.py").is_file() and (root / "pyproject.toml").is_file()
    assert (root / "tests/tests_pytorch/loops/test_module.py").read_text() == MODULE  # the tests as they are
    assert rewrite_imports("lightning.pytorchx, mylightning.pytorch") == "lightning.pytorchx, mylightning.pytorch"


def test_git_am_applies_the_patch_onto_the_commit(repository, tmp_path):
    patch_file = _patch_changing_the_module(repository, tmp_path, "return 2")
    result = git_am(repository, [patch_file], tmp_path / "am")
    assert (result["applied"], result["dropped"], result["patches"]) == (True, [], 1), result["error"]
    assert "return 2" in (tmp_path / "am/clone/src/lightning/pytorch/loops/module.py").read_text()


def test_git_am_drops_and_names_a_blob_the_git_directory_lacks(repository, tmp_path):
    patch_file = _patch_changing_the_module(repository, tmp_path, "return 3")
    blob = repository.git("rev-parse", "HEAD:docs/image.gif").strip()
    pack = tmp_path / "repacked"  # a bare clone holds its objects in a pack: unpack them, then lose the image's
    pack.mkdir()
    for packed in (repository.git_dir / "objects" / "pack").glob("*.pack"):
        packed.with_suffix(".idx").unlink()
        packed = packed.rename(pack / packed.name)
        subprocess.run(["git", "--git-dir", str(repository.git_dir), "unpack-objects", "-q"], input=packed.read_bytes(),
                       check=True)
    (repository.git_dir / "objects" / blob[:2] / blob[2:]).unlink()
    result = git_am(repository, [patch_file], tmp_path / "am")
    assert (result["applied"], result["dropped"]) == (True, ["docs/image.gif"]), result["error"]


def test_a_patch_that_does_not_apply_is_reported_with_gits_error(repository, tmp_path):
    patch_file = _patch_changing_the_module(repository, tmp_path, "return 2")
    patch_file.write_text(patch_file.read_text().replace("-    return 1", "-    return 7"))
    result = git_am(repository, [patch_file], tmp_path / "am")
    assert not result["applied"] and "Change the value" in result["error"], result
