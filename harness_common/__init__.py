"""What the conformance suite (``tests/``), the benchmarks (``benchmarks/``) and the RFC renderer (``rfc/``) share.

- **Design selection**: ``select_designs(spec)`` turns an ``--design`` value into the designs (and variants) a run
  covers, from the registry, from an installed package's entry point, or from ``package.module:ATTR``.
- **Provenance**: where a results file comes from (versions, the commit of the measured code, a digest of each group
  of measured sources, when), written into every results file's ``setup``; ``SETUP_LABELS`` is how the RFC shows it.
- **The ratio rule**: ``RATIO_TOLERANCE``, how far a measured L/C or M/C may sit from its nominal value before a
  benchmark point is not judged (the benchmarks judge by it, the RFC flags by it).
- **The quiet Trainer**: ``QUIET``, the Trainer defaults every test and benchmark builds its Trainers with.
- **The rendezvous** (``harness_common.rendezvous``): the store a local launch of DDP ranks listens on before any
  rank starts, and how a rank joins it.
- **The terminal** (``harness_common.terminal``): lines of marked-up text fitted to a width, written at the end of a
  run (the conformance matrix, the benchmarks' verdicts).

Why a top-level package of its own: each of the three imported these from another (the suite its provenance from
the benchmarks, the benchmarks their selection from the suite), which tied them in a cycle; and ``prototypes`` is
the designs' package, which a maintainer would lift into Lightning without any of this. It imports only
``prototypes`` (the registry) and the standard library, never ``tests``, ``benchmarks`` or ``rfc``
(``tests/test_import_layers.py`` checks that the three import each other in no cycle).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import operator
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prototypes.common import Design
from prototypes.patched import SERIES_MODULES, installed_series

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINT_GROUP = "dataloader_iter_designs"

# A benchmark point is judged only when its measured ratio (L/C in S1, M/C in S6) is within this share of the nominal
# one; otherwise it measured something else.
RATIO_TOLERANCE = 0.10

# The Trainer defaults of every test and benchmark: one CPU device, nothing logged, checkpointed or printed.
QUIET = dict(
    accelerator="cpu",
    devices=1,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    num_sanity_val_steps=0,
    max_epochs=1,
)


# ------------------------------------------------------------------------------------------------ design selection
class SelectionError(Exception):
    """An ``--design`` value that names no design, or a design that cannot be loaded; the message names the fix."""


def _split_top_level(spec: str) -> list[str]:
    """Split on commas outside brackets: ``a,b[x=1,y=2]`` -> ``["a", "b[x=1,y=2]"]``."""
    return [part.strip() for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", spec) if part.strip()]


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text.strip("'\"")


def installed_designs() -> dict[str, importlib.metadata.EntryPoint]:
    """The designs installed packages declare in the ``dataloader_iter_designs`` entry-point group, by name."""
    from prototypes import DESIGNS  # Why here: tests replace the registry for a run

    points = {point.name: point for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    clashes = [f"{name} = {points[name].value}" for name in sorted(set(points) & set(DESIGNS))]
    if clashes:
        raise SelectionError(
            f"entry points in group {ENTRY_POINT_GROUP!r} take the names of designs in this repository "
            f"({'; '.join(clashes)}); rename each entry point and its Design in the package that declares it"
        )
    return points


def _as_design(source: str, value: object) -> Design:
    if not isinstance(value, Design):
        raise SelectionError(
            f"--design {source}: {type(value).__name__} is not a prototypes.common.Design; point it at an object "
            "built with Design(name=..., summary=..., make_trainer=...)"
        )
    return value


def _design_at(path: str) -> Design:
    """The design ``package.module:ATTR`` names."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SelectionError(
            f"--design {path}: cannot import {module_name!r} ({error}); install the package that defines it "
            "or put its directory on PYTHONPATH"
        ) from None
    try:
        value = operator.attrgetter(attribute)(module)
    except AttributeError:
        designs = sorted(name for name, value in vars(module).items() if isinstance(value, Design))
        raise SelectionError(
            f"--design {path}: module {module_name!r} has no attribute {attribute!r}; "
            f"the Designs it defines: {', '.join(designs) or 'none'}"
        ) from None
    design = _as_design(path, value)
    from prototypes import DESIGNS

    if DESIGNS.get(design.name, design) is not design:
        raise SelectionError(
            f"--design {path}: its name {design.name!r} is taken by a design in this repository; "
            "give the outside design another Design(name=...)"
        )
    return design


def _installed_design(point: importlib.metadata.EntryPoint) -> Design:
    where = f"{point.name} (entry point {point.value!r} in group {ENTRY_POINT_GROUP!r})"
    try:
        value = point.load()
    except (ImportError, AttributeError) as error:
        raise SelectionError(
            f"--design {where}: cannot load it ({error}); fix the entry point or reinstall its package"
        ) from None
    design = _as_design(where, value)
    if design.name != point.name:
        raise SelectionError(
            f"--design {where}: the Design is named {design.name!r}; name the entry point after its Design"
        )
    return design


def _design_named(name: str, installed: dict[str, importlib.metadata.EntryPoint]) -> Design:
    from prototypes import DESIGNS

    if ":" in name:
        return _design_at(name)
    if name in DESIGNS:
        return DESIGNS[name]
    if name in installed:
        return _installed_design(installed[name])
    raise SelectionError(
        f"--design: unknown design {name!r}; valid names: {', '.join(sorted({*DESIGNS, *installed}))}, "
        "or package.module:ATTR for a design defined elsewhere"
    )


def select_designs(spec: str | None) -> list[Design]:
    """The designs and variants an ``--design`` value names, in the order named (every registered design this
    environment can run, with each of its suite variants, when ``spec`` is empty). Raises :class:`SelectionError`
    naming the fix, also for a named design this environment cannot run (``Design.unavailable_reason``)."""
    from prototypes import runnable_designs

    installed = installed_designs()  # a clash is an error even when nothing installed is selected
    if not spec:
        return [v for d in runnable_designs().values() for v in (d, *(d.variant(**o) for o in d.suite_variants))]
    selected, by_name = [], {}
    for part in _split_top_level(spec):
        match = re.fullmatch(r"([\w.]+(?::[\w.]+)?)(?:\[(.*)\])?", part)
        design = _design_named(match.group(1) if match else part, installed)
        reason = design.unavailable_reason()
        if reason is not None:
            raise SelectionError(f"--design {part}: {reason}")
        if by_name.setdefault(design.name, design) is not design:
            raise SelectionError(f"--design: two different designs are named {design.name!r}; rename one")
        if match and match.group(2) is not None:
            options = dict(kv.split("=", 1) for kv in match.group(2).split(",") if kv)
            try:
                selected.append(design.variant(**{k.strip(): _parse_value(v) for k, v in options.items()}))
            except TypeError as error:
                raise SelectionError(f"--design {part}: {error}") from None
        else:
            selected.extend([design, *(design.variant(**o) for o in design.suite_variants)])
    # Why: "prefetcher,prefetcher[depth=4]" names depth 4 twice (once among the suite's variants); one test per
    # variant, in the order first named
    return list({design.id: design for design in selected}.values())


# ------------------------------------------------------------------------------------------------ provenance
RESULT_PATHS = ("rfc/results", "rfc/generated")  # written by measuring runs and the render tool

# The ``setup`` keys a results file may carry, in the order the RFC shows them, with their labels; the RFC hides
# ``SETUP_HIDDEN`` (or shows them its own way) and shows any other key by its name.
SETUP_LABELS = [
    ("machine", "machine"),
    ("cpu_count", "CPUs"),
    ("torch_threads", "torch threads"),
    ("python", "Python"),
    ("torch", "torch"),
    ("pytorch_lightning", "pytorch-lightning"),
    ("torchdata", "torchdata"),
    ("pytest_benchmark", "pytest-benchmark"),
]
SETUP_HIDDEN = {"git_commit", "git_dirty", "sources", "generated_at", "machine_kind"}

# The sources a record may have measured, in groups (git pathspecs from the repository's top): every results file
# carries each group's digest (``source_digests``), and the renderer's check fails where a group that a file's record
# measured has changed since. The harness's own unit tests are left out: editing them changes no measurement. The
# patch is two groups, so that editing a tool that runs Lightning's tests does not outdate what the suite measured:
# what the patched package is made of (``prototypes.patched.patch_sources``), and the rest (the stack's tests for
# Lightning, the tools that build, run and judge it). The patch's cost is a group of its own beside the benchmarks.
MEASURED_SOURCES = {
    "designs": (":(top,glob)prototypes/**",),
    "patch": (*(f":(top)patch/{name}.py" for name in SERIES_MODULES), ":(top,glob)patch/items/**/*.py"),
    "patch-checks": (":(top,glob)patch/**/*.py", ":(top,glob,exclude)patch/items/**",
                     *(f":(top,exclude)patch/{name}.py" for name in SERIES_MODULES)),
    "suite": (":(top,glob)tests/conformance/**", ":(top)tests/test_drain_rules.py",
              ":(top)tests/test_defect_catalogue.py"),
    "benchmarks": (":(top,glob)benchmarks/*.py", ":(top,exclude)benchmarks/test_harness_unit.py",
                   ":(top,exclude)benchmarks/test_summary.py", ":(top,exclude)benchmarks/patch_cost.py"),
    "patch-cost": (":(top)benchmarks/patch_cost.py",),
    "harness": (":(top,glob)harness_common/**/*.py",),
}


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    """``git ARGS`` in ``cwd``: its output, or "unknown" where git or the repository is missing."""
    try:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def code_revision(root: Path = REPO_ROOT) -> dict[str, Any]:
    """``git_commit`` (HEAD), ``git_dirty``: whether tracked files outside ``RESULT_PATHS`` differ from it, and
    ``sources``: ``source_digests``.

    Why those excluded: writing ``rfc/results/`` and re-rendering ``rfc/generated/`` is what a measuring run does,
    not a change to what was measured.
    """
    excluded = [f":(exclude){path}" for path in RESULT_PATHS]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded, cwd=root)
    return {"git_commit": git("rev-parse", "HEAD", cwd=root), "git_dirty": changed != "",
            "sources": source_digests(root)}


def source_digests(root: Path = REPO_ROOT) -> dict[str, str]:
    """Per group of ``MEASURED_SOURCES``, the sha256 of its tracked files as they are in the working tree (paths and
    contents, in path order); empty where git or the repository is missing."""
    top = git("rev-parse", "--show-toplevel", cwd=root)
    if top == "unknown":
        return {}
    digests = {}
    for group, pathspecs in MEASURED_SOURCES.items():
        digest = hashlib.sha256()
        for name in sorted(git("ls-files", "--full-name", "--", *pathspecs, cwd=root).splitlines()):
            path = Path(top, name)
            digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(deleted)") + b"\0")
        digests[group] = digest.hexdigest()
    return digests


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown cpu"


def _machine() -> tuple[str, str, int]:
    """What names the machine a results file describes: architecture, operating system, CPUs."""
    return platform.machine(), platform.system(), os.cpu_count() or 0


def machine_label() -> str:
    """The machine as every results file's ``setup`` names it: ``x86_64 Linux, 2 CPUs``."""
    architecture, system, cpus = _machine()
    return f"{architecture} {system}, {cpus} CPUs"


def machine_file_name() -> str:
    """The same machine in a file name: ``x86_64-linux-2cpu`` (``rfc/results/benchmarks-x86_64-linux-2cpu.json``)."""
    architecture, system, cpus = _machine()
    return re.sub(r"[^a-z0-9_]+", "-", f"{architecture} {system} {cpus}cpu".lower())


def provenance() -> dict[str, Any]:
    """Python and library versions, the code revision and the time: the part of ``setup`` every results file has."""
    return {
        "python": platform.python_version(),
        "torch": version("torch"),
        "pytorch_lightning": version("pytorch-lightning"),
        "torchdata": version("torchdata"),
        **code_revision(),
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def conformance_setup() -> dict[str, Any]:
    """The ``setup`` of a conformance or defect-catalogue results file: the machine, then ``provenance()``."""
    setup = dict(machine=machine_label(), **provenance())
    marker = installed_series()
    return setup if marker is None else {**setup, "patch_series": marker.SERIES}
