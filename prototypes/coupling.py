"""What each design uses of Lightning's private API, read from its source: the RFC's coupling lists are generated
from here, never typed by hand.

A design's source is its module (or package) plus the shared ``prototypes`` modules it imports. A name counts as
Lightning's private API when it starts with one underscore and Lightning defines it (a module, class, function,
method or attribute of ``pytorch_lightning``, ``lightning_fabric`` or ``lightning_utilities``), and the design

- imports it (``from pytorch_lightning.loops.fit_loop import _FitLoop``),
- reads or writes it on an object (``trainer._logger_connector``, ``self._data_fetcher`` in a loop subclass), or
- overrides it (``def _should_check_val_fx`` in a subclass of a Lightning loop).

Private names the design defines for itself (and Lightning does not) are not coupling. ``python -m
prototypes.coupling`` prints every design's list.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning_fabric", "lightning_utilities")
PROTOTYPES = Path(__file__).resolve().parent


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def lightning_private_names() -> frozenset[str]:
    """Every private name Lightning's installed sources define: modules, classes, functions, attributes."""
    names: set[str] = set()
    for package in LIGHTNING_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        for path in Path(spec.origin).parent.rglob("*.py"):
            names.update(part for part in path.with_suffix("").parts if _is_private(part))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _is_private(node.name):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_private(node.attr):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _is_private(node.id):
                    names.add(node.id)
    return frozenset(names)


def design_sources(module_name: str) -> list[Path]:
    """The files of a design (module or package) and of the shared ``prototypes`` modules they import."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no module {module_name!r}")
    origin = Path(spec.origin)
    files = sorted(origin.parent.glob("*.py")) if origin.name == "__init__.py" else [origin]
    seen: list[Path] = []
    while files:
        path = files.pop(0)
        if path in seen:
            continue
        seen.append(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("prototypes."):
                shared = PROTOTYPES / f"{node.module.split('.')[1]}.py"
                if shared.is_file() and shared not in seen:
                    files.append(shared)
    return seen


@dataclass(frozen=True)
class Coupling:
    """A design's use of Lightning's private API, by kind; each entry a name as written in the design's source."""

    imported: tuple[str, ...]
    overridden: tuple[str, ...]
    accessed: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Every private Lightning name used, once."""
        return tuple(sorted(set(self.imported) | set(self.overridden) | set(self.accessed)))


def coupling_of(module_name: str) -> Coupling:
    """What the design in ``module_name`` (and the shared modules it imports) uses of Lightning's private API."""
    lightning = lightning_private_names()
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in design_sources(module_name)]
    imported: set[str] = set()
    from_lightning: set[str] = set()  # every name imported from Lightning, private or not
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIGHTNING_PACKAGES:
            from_lightning.update(alias.asname or alias.name for alias in node.names)
            private_module = any(_is_private(part) for part in node.module.split("."))
            imported.update(
                f"{node.module}.{alias.name}" for alias in node.names if private_module or _is_private(alias.name)
            )
    classes = [n for tree in trees for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    # A class extends Lightning when a base was imported from Lightning or is such a class of the design's own
    extends_lightning: set[str] = set()
    for _ in classes:
        bases = {c.name: {_base_name(b) for b in c.bases} for c in classes}
        extends_lightning |= {name for name, of in bases.items() if of & (from_lightning | extends_lightning)}
    # A mixin's method counts too: mixed into a Lightning loop, it overrides Lightning's
    mixed_in = {base for name in extends_lightning for base in bases[name]} - from_lightning
    overridden: set[str] = set()
    own: set[str] = set()  # private attributes the design's own (non-Lightning) classes define for themselves
    for cls in classes:
        methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and _is_private(n.name)}
        if cls.name in extends_lightning | mixed_in:
            overridden |= methods & lightning
        if cls.name not in extends_lightning:
            own |= (methods - lightning) | {
                n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"
            }
    accessed = {
        n.attr for tree in trees for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in lightning
    } - own - overridden
    return Coupling(tuple(sorted(imported)), tuple(sorted(overridden)), tuple(sorted(accessed)))


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def design_module(design) -> str:
    """The module that defines a design's entry point (a package's ``__init__`` for a package)."""
    return design.make_trainer.__module__


if __name__ == "__main__":
    from prototypes import IMPLEMENTATIONS

    for name, design in IMPLEMENTATIONS.items():
        found = coupling_of(design_module(design))
        print(f"{name} ({design_module(design)}): {len(found.names)} private Lightning names")
        for kind in ("imported", "overridden", "accessed"):
            print(f"  {kind}: {', '.join(getattr(found, kind)) or '-'}")
