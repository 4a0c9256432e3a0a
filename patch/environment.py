"""A virtual environment whose pytorch_lightning is 2.6.6 with the RFC's patch series applied.

    python -m patch.environment --venv PATH [--tree DIR] [--sdist-cache DIR]
    python -m patch.environment --venv PATH --stock

``--stock`` builds the same environment with stock pytorch_lightning 2.6.6 left in place (reinstalled where a
patched one was there): a second build of the stock side for ``benchmarks.patch_cost``, which pairs several builds
of each environment.

Installs what ``.ci/run`` installs, in its order (the local CPU build of torch first: an unpinned torch pulls a CUDA
build; then this project, editable, with its ``dev`` and ``clients`` extras; then TorchRec without its declared
dependencies), and then replaces the stock pytorch_lightning that the project's requirements brought with the
patched one of the same version, built from ``--tree`` (a tree ``python -m patch.series --tree`` kept) or, without
it, from a series generated now. An existing environment at PATH is reused: pip leaves what is installed in place.

The patched tree carries the marker module ``pytorch_lightning._rfc_patch_series`` (see ``patch.series``), which
the ``patched`` registry entry (``prototypes.patched``) reads. The marker is a module of the installed distribution,
so reinstalling stock pytorch-lightning removes it with the patched files. At the end, the environment's own Python
imports pytorch_lightning, checks that it is the installed copy carrying this series, and asks the registry whether
``patched`` can run there.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from patch.series import DEFAULT_CACHE, PACKAGE_IN_SDIST, RELEASE, keep_tree, patched_tree
from prototypes.patched import SERIES_MODULE, patch_sources_digest

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
TORCHREC = "torchrec==1.8.0"
# The sdist's setup.py builds the standalone package when src/ holds exactly these two; with a third directory it
# takes the tree for a repository checkout and builds whatever PACKAGE_NAME names (``lightning`` when unset).
SDIST_PACKAGES = {"lightning_fabric", "pytorch_lightning"}

_CHECK_SCRIPT = f"""
import json, pytorch_lightning
from pytorch_lightning import {SERIES_MODULE} as marker
from prototypes.patched import unavailable_reason
print(json.dumps({{"file": pytorch_lightning.__file__, "version": pytorch_lightning.__version__,
                  "series": marker.SERIES, "patches": marker.PATCHES, "unavailable": unavailable_reason()}}))
"""


STOCK_LIGHTNING = f"pytorch-lightning=={RELEASE}"
_STOCK_CHECK_SCRIPT = f"""
import importlib.util, pytorch_lightning
assert importlib.util.find_spec("pytorch_lightning.{SERIES_MODULE}") is None, "a patched pytorch_lightning is installed"
print(pytorch_lightning.__version__)
"""


class BuildError(RuntimeError):
    """The environment cannot be built as asked; the message names the fix."""


def marker_series(tree: Path) -> str:
    """The series a patched tree carries (``SERIES`` of its marker module), checked before any install: the tree was
    generated from this checkout's ``patch/`` sources, or the registry would refuse the environment built from it."""
    marker = tree / PACKAGE_IN_SDIST / f"{SERIES_MODULE}.py"
    regenerate = "pass a tree written by `python -m patch.series --out DIR --tree TREE`, or leave --tree out"
    if not marker.is_file():
        raise BuildError(f"{tree} has no {marker.relative_to(tree)}: {regenerate} to generate one")
    written = runpy.run_path(str(marker))
    if written["SOURCES"] != patch_sources_digest():
        raise BuildError(f"{tree} was generated from other patch/ sources than this checkout's: {regenerate}")
    return written["SERIES"]


def check_sdist_layout(tree: Path) -> None:
    packages = {path.name for path in (tree / "src").iterdir() if path.is_dir() and not path.name.endswith(".egg-info")}
    if packages != SDIST_PACKAGES:
        raise BuildError(
            f"{tree}/src holds {sorted(packages)}, not the sdist's {sorted(SDIST_PACKAGES)}: Lightning's setup.py "
            "would build another package; regenerate the tree with `python -m patch.series --out DIR --tree TREE`"
        )


def pip(python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    command = [str(python), "-m", "pip", "install", "--quiet", *args]
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, env=env)


def install_patched(python: Path, tree: Path) -> None:
    """Build and install the patched package from a copy of ``tree`` (a build in place would leave ``build/`` there,
    whose stale files a later build of another series would pack)."""
    check_sdist_layout(tree)
    env = {key: value for key, value in os.environ.items() if key != "PACKAGE_NAME"}
    with tempfile.TemporaryDirectory() as scratch:
        source = Path(scratch) / tree.name
        shutil.copytree(tree, source)
        pip(python, "--no-deps", "--force-reinstall", str(source), env=env)


def verify(python: Path, venv: Path, series: str) -> dict:
    """What the environment's Python imports: the installed patched package carrying ``series``, runnable."""
    output = subprocess.run([str(python), "-c", _CHECK_SCRIPT], check=True, capture_output=True, text=True,
                            cwd=REPO_ROOT).stdout
    found = json.loads(output.splitlines()[-1])
    problems = []
    if venv.resolve() not in Path(found["file"]).resolve().parents:
        problems.append(f"pytorch_lightning imports from {found['file']}, outside {venv}")
    if found["series"] != series:
        problems.append(f"the installed marker names series {found['series']}, the tree {series}")
    if found["unavailable"]:
        problems.append(found["unavailable"])
    if problems:
        raise BuildError("; ".join(problems))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the environment to build (reused if present)")
    parser.add_argument("--tree", type=Path, help="a patched tree kept by `python -m patch.series --tree`")
    parser.add_argument("--sdist-cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--stock", action="store_true", help="keep stock pytorch_lightning: a build of the stock side")
    args = parser.parse_args(argv)
    if args.stock and args.tree:
        parser.error("--stock keeps stock pytorch_lightning, --tree installs a patched one: pass one of them")
    venv = args.venv.absolute()
    python = venv / "bin" / "python"
    try:
        tree_series = marker_series(args.tree) if args.tree else None
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip(python, "--upgrade", "pip")
        pip(python, TORCH)
        pip(python, "-e", f"{REPO_ROOT}[dev,clients]")
        pip(python, "--no-deps", TORCHREC)
        if args.stock:
            pip(python, "--no-deps", "--force-reinstall", STOCK_LIGHTNING)
            version = subprocess.run([str(python), "-c", _STOCK_CHECK_SCRIPT], check=True, capture_output=True,
                                     text=True, cwd=REPO_ROOT).stdout.strip()
            print(f"{venv}: stock pytorch_lightning {version}")
            return 0
        with tempfile.TemporaryDirectory() as scratch:
            tree = args.tree or keep_tree(patched_tree(Path(scratch) / "git", args.sdist_cache), Path(scratch) / "tree")
            series = tree_series or marker_series(tree)
            install_patched(python, tree)
        found = verify(python, venv, series)
    except BuildError as error:
        print(f"patch.environment: {error}", file=sys.stderr)
        return 1
    print(f"{venv}: pytorch_lightning {found['version']} with {found['patches']} patches (series {series}) at "
          f"{Path(found['file']).parent}\nrun the suite on it: {python} -m pytest tests/conformance --design patched")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
