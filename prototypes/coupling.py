"""What each design uses of Lightning's private API, read from its source: the RFC's coupling lists are generated
from here, never typed by hand.

A design's source is its module (or package) plus the shared ``prototypes`` modules it imports; the lists keep the
two apart (``DesignCoupling.shared`` and ``.own``), since what the shared modules use is one change to Lightning
however many designs import them. A name counts as Lightning's private API when it starts with one underscore and
Lightning defines it (a module, class, function, method or attribute of ``pytorch_lightning``, ``lightning``,
``lightning_fabric`` or ``lightning_utilities``), or it is imported from a private Lightning module, and the design

- imports it (``from pytorch_lightning.loops.fit_loop import _FitLoop``),
- reads or writes it on an object (``trainer._logger_connector``, ``self._data_fetcher`` in a loop subclass), or
- overrides it (``def _should_check_val_fx`` in a subclass of a Lightning loop).

Private names the design defines for itself (and Lightning does not) are not coupling. ``private_uses`` is the one
scanner (the ``callback`` design's public-API test reads it too); ``python -m prototypes.coupling`` prints every
design's list.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LIGHTNING_PACKAGES = ("pytorch_lightning", "lightning", "lightning_fabric", "lightning_utilities")
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


def design_sources(module_name: str) -> tuple[list[Path], list[Path]]:
    """The files of a design (module or package), and those of the shared ``prototypes`` modules they import
    (directly or through another shared module)."""
    own = _module_files(module_name)
    shared: list[Path] = []
    pending = list(own)
    while pending:
        tree = ast.parse(pending.pop(0).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if not module.startswith("prototypes."):
                    continue  # the registry (``prototypes`` itself) is not a design's code
                for path in _module_files(module):
                    if path not in own and path not in shared:
                        shared.append(path)
                        pending.append(path)
    return own, shared


def _module_files(module_name: str) -> list[Path]:
    """A module's file, or every file of a package."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        raise ValueError(f"no module {module_name!r}")
    origin = Path(spec.origin)
    return sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]


@dataclass(frozen=True)
class Use:
    """One use of a private Lightning name: ``imported``, ``overridden`` or ``accessed``, on line ``line``."""

    kind: str
    name: str
    line: int


KINDS = ("imported", "overridden", "accessed")


def private_uses(trees: dict[Any, ast.Module]) -> dict[Any, list[Use]]:
    """Each tree's uses of Lightning's private API, the trees read as one program (a class in one may extend a
    Lightning class through a class in another). The one scanner of private Lightning names: the coupling lists and
    the public-API rule of the ``callback`` design (``tests/designs/test_callback.py``) both read it."""
    lightning = lightning_private_names()
    nodes = {key: list(ast.walk(tree)) for key, tree in trees.items()}
    every = [n for found in nodes.values() for n in found]
    from_lightning: set[str] = set()  # every name imported from Lightning, private or not
    for node in every:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIGHTNING_PACKAGES:
            from_lightning.update(alias.asname or alias.name for alias in node.names)
    classes = [n for n in every if isinstance(n, ast.ClassDef)]
    bases = {c.name: {_base_name(b) for b in c.bases} for c in classes}
    # A class extends Lightning when a base was imported from Lightning or is such a class of the design's own
    extends_lightning: set[str] = set()
    for _ in classes:
        extends_lightning |= {name for name, of in bases.items() if of & (from_lightning | extends_lightning)}
    # A mixin's method counts too: mixed into a Lightning loop, it overrides Lightning's
    mixed_in = {base for name in extends_lightning for base in bases[name]} - from_lightning
    own: set[str] = set()  # private attributes the design's own (non-Lightning) classes define for themselves
    overridden: set[str] = set()
    for cls in classes:
        methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef) and _is_private(n.name)}
        if cls.name in extends_lightning | mixed_in:
            overridden |= methods & lightning
        else:  # Why not a mixin's: what it writes on ``self`` is the Lightning object's
            own |= (methods - lightning) | {
                n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"
            }
    uses: dict[Any, list[Use]] = {}
    for key, found in nodes.items():
        file_uses: list[Use] = []
        for node in found:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIGHTNING_PACKAGES:
                private_module = any(_is_private(part) for part in node.module.split("."))
                file_uses += [Use("imported", f"{node.module}.{alias.name}", node.lineno) for alias in node.names
                              if private_module or _is_private(alias.name)]
            elif isinstance(node, ast.Import):
                file_uses += [Use("imported", alias.name, node.lineno) for alias in node.names
                              if alias.name.split(".")[0] in LIGHTNING_PACKAGES
                              and any(_is_private(part) for part in alias.name.split("."))]
            elif isinstance(node, ast.ClassDef) and node.name in extends_lightning | mixed_in:
                file_uses += [Use("overridden", n.name, n.lineno) for n in node.body
                              if isinstance(n, ast.FunctionDef) and n.name in overridden]
            elif isinstance(node, ast.Attribute) and node.attr in lightning and node.attr not in own | overridden:
                file_uses.append(Use("accessed", node.attr, node.lineno))
        uses[key] = sorted(file_uses, key=lambda use: use.line)
    return uses


def private_uses_in_source(source: str) -> list[Use]:
    """The uses of Lightning's private API in one module's source, read on its own."""
    return private_uses({"source": ast.parse(source)})["source"]


@dataclass(frozen=True)
class Coupling:
    """Uses of Lightning's private API, by kind; each entry a name as written in the source, once."""

    imported: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()
    accessed: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """Every private Lightning name used, once."""
        return tuple(sorted(set(self.imported) | set(self.overridden) | set(self.accessed)))

    @classmethod
    def of(cls, uses: list[Use], leaving_out: Coupling | None = None) -> Coupling:
        """The names of ``uses`` by kind, without those ``leaving_out`` lists under the same kind."""
        return cls(*(
            tuple(sorted({u.name for u in uses if u.kind == kind} - set(getattr(leaving_out or cls(), kind))))
            for kind in KINDS
        ))


@dataclass(frozen=True)
class DesignCoupling:
    """A design's use of Lightning's private API: through the shared ``prototypes`` modules it imports (which every
    design importing them shares), and in its own module or package beyond those."""

    shared: Coupling
    own: Coupling

    @property
    def names(self) -> tuple[str, ...]:
        """Every private Lightning name the design uses, shared or its own, once."""
        return tuple(sorted(set(self.shared.names) | set(self.own.names)))


def coupling_of(module_name: str) -> DesignCoupling:
    """What the design in ``module_name`` uses of Lightning's private API, and the shared modules it imports."""
    own_files, shared_files = design_sources(module_name)
    uses = private_uses({path: ast.parse(path.read_text(encoding="utf-8")) for path in own_files + shared_files})
    shared = Coupling.of([use for path in shared_files for use in uses[path]])
    return DesignCoupling(shared, Coupling.of([use for path in own_files for use in uses[path]], leaving_out=shared))


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def design_module(design) -> str:
    """The module that defines a design's entry point (a package's ``__init__`` for a package)."""
    return design.make_trainer.__module__


if __name__ == "__main__":
    from prototypes import DESIGNS

    for name, design in DESIGNS.items():
        found = coupling_of(design_module(design))
        print(f"{name} ({design_module(design)}): {len(found.names)} private Lightning names")
        for where, coupling in (("through the shared modules", found.shared), ("of its own", found.own)):
            print(f"  {where}: {len(coupling.names)}")
            for kind in KINDS:
                print(f"    {kind}: {', '.join(getattr(coupling, kind)) or '-'}")
