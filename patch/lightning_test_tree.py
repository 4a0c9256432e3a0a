"""The copy of Lightning's tests that ``patch.lightning_tests`` runs: the checkout's ``tests/tests_pytorch`` with the
unified package's imports (``lightning.pytorch``, ``lightning.fabric``) renamed to the standalone packages' (as
Lightning's CI does for ``pytorch_lightning``), the tests the stack adds and updates where asked, and the legacy
checkpoints this machine can write."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from patch.edits import ModuleSource
from patch.items import ITEMS, TESTS_HERE

# Lightning's packages as the repository's tests import them -> as the standalone PyPI packages name them.
IMPORT_MAPPING = (("lightning.pytorch", "pytorch_lightning"), ("lightning.fabric", "lightning_fabric"))

TEST_ROOT = Path("tests") / "tests_pytorch"
# the tests the stack adds, each module a path under TEST_ROOT (run as a selection of its own)
STACK_TEST_MODULES = tuple(sorted(path.relative_to(TESTS_HERE).as_posix() for path in TESTS_HERE.rglob("test_*.py")))
# Lightning's tests the stack updates, in the order of its items: each fails on stock, as a test the stack adds does
UPDATED_TESTS = tuple(updated for item in ITEMS for updated in item.updated_tests)
# The legacy-checkpoint tests read their version list from here.
LEGACY_ROOT = Path("tests") / "legacy"

def _import_pattern(package: str) -> re.Pattern[str]:
    # A whole dotted name only: not `my_lightning.pytorch`, `src/lightning/pytorch`, `lightning.pytorch_x` or an
    # e-mail/URL tail such as `@lightning.pytorch`.
    return re.compile(rf"(?<![\w./@]){re.escape(package)}(?![\w/])")


_IMPORT_PATTERNS = tuple((_import_pattern(source), target) for source, target in IMPORT_MAPPING)


def rewrite_imports(text: str) -> str:
    """Name the standalone packages wherever the text names the unified package's modules."""
    for pattern, target in _IMPORT_PATTERNS:
        text = pattern.sub(target, text)
    return text


def copy_rewritten(source: Path, destination: Path) -> int:
    """Copy a directory tree, rewriting the imports of every text file; returns how many files changed."""
    changed = 0
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # checkpoints, images: copied as they are
            shutil.copy2(path, target)
            continue
        rewritten = rewrite_imports(text)
        changed += rewritten != text
        target.write_text(rewritten, encoding="utf-8")
    return changed


def prepare_tree(checkout: Path, destination: Path, with_stack_tests: bool = False) -> int:
    """Lay out the checkout's tests under ``destination`` as the repository does, with the imports rewritten, and the
    tests the stack adds (``patch/tests_pytorch``) among them where ``with_stack_tests``, with Lightning's tests the
    stack updates (each item's ``updated_tests``) updated as its commits update them.

    ``tests/`` has no ``__init__.py``, so pytest puts it on ``sys.path`` and ``tests_pytorch.helpers`` imports; the
    checkout's ``pyproject.toml`` carries Lightning's pytest options (strict markers, warning filters, strict xfail).
    """
    changed = copy_rewritten(checkout / TEST_ROOT, destination / TEST_ROOT)
    if with_stack_tests:
        changed += copy_rewritten(TESTS_HERE, destination / TEST_ROOT)
        for updated in UPDATED_TESTS:
            path = destination / TEST_ROOT / updated.module
            updated.edit(ModuleSource(path, updated.module))
            # an update is written as the repository's tests are: with its imports
            path.write_text(rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
    if (checkout / LEGACY_ROOT).is_dir():
        changed += copy_rewritten(checkout / LEGACY_ROOT, destination / LEGACY_ROOT)
    shutil.copy2(checkout / "pyproject.toml", destination / "pyproject.toml")
    return changed


def versions_with_checkpoints(listed: list[str], checkpoints: Path) -> tuple[list[str], list[str]]:
    """Split the legacy versions listed into those with a ``.ckpt`` under ``checkpoints/<version>`` and the rest."""
    present = [version for version in listed if any((checkpoints / version).glob("*.ckpt"))]
    return present, [version for version in listed if version not in present]


def prepare_legacy_checkpoints(python: str, tree: Path) -> dict:
    """Write the "local" legacy checkpoint with ``python`` and list only the versions whose checkpoints exist.

    Lightning's CI downloads its archive of checkpoints saved by past releases and trains the "local" one with the
    package under test. Without the archive, ``checkpointing/test_legacy_checkpoints.py`` would fail once per listed
    release on the missing file, so those releases are dropped from the copied list (and named in the report). The
    local checkpoint is written by the stock interpreter once, so a patched run loads and resumes stock's checkpoint.
    """
    legacy = tree / LEGACY_ROOT
    listed_file = legacy / "back-compatible-versions.txt"
    if not listed_file.exists():
        return {}
    checkpoints = legacy / "checkpoints"
    present, absent = versions_with_checkpoints(listed_file.read_text(encoding="utf-8").split(), checkpoints)
    listed_file.write_text("".join(f"{version}\n" for version in present), encoding="utf-8")
    local = checkpoints / "local"
    training = legacy / "simple_classif_training.py"
    env = {**os.environ, "PYTHONPATH": str(tree / "tests")}  # for `import tests_pytorch`, as Lightning's script sets
    subprocess.run([python, training, "local"], cwd=tree, env=env, check=True, capture_output=True)
    for checkpoint in (local / "lightning_logs").glob("version_*/checkpoints/*.ckpt"):
        checkpoint.rename(local / checkpoint.name)
    shutil.rmtree(local / "lightning_logs")
    shutil.copy2(training, local)  # the checkpoint's test imports the model's module from beside it
    return {"local_written_by": python, "versions_with_checkpoints": present, "versions_without_checkpoints": absent}
