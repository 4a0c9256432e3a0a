"""The import structure of ``prototypes/``, read from source: no module imports itself through others, and no
design imports another design.

Every import counts, wherever it is written: at module level, under ``if TYPE_CHECKING:`` and inside function
bodies. Why type-only imports too: a cycle that only type checkers follow still means the two modules cannot be
understood, or lifted into Lightning, one without the other.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import prototypes
from prototypes import IMPLEMENTATIONS
from prototypes.coupling import design_module

PACKAGE_ROOT = Path(prototypes.__file__).parent


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, importer: str, is_package: bool) -> set[str]:
    """Every module ``importer``'s source names in an import statement, relative imports resolved; for
    ``from package import name`` both ``package`` and ``package.name`` (the name may be a submodule)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = importer.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules under ``root`` (a package directory) it imports."""
    sources = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in sources.items():
        imported = imported_modules(path.read_text(), name, path.name == "__init__.py")
        # Why drop a package's import of its own submodules: importing them is what a package does
        graph[name] = {m for m in imported if m in sources and m != name and not m.startswith(name + ".")}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules that import each other, as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def connect(module: str) -> None:  # Tarjan's algorithm
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                connect(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            connect(module)
    return [_cycle_through(group, graph) for group in groups]


def _cycle_through(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A path from the group's first module back to itself, inside the group (breadth first: the shortest)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in sorted(graph[module] & members):
                if imported == start:
                    return [*paths[module], start]
                if imported not in paths:
                    paths[imported] = [*paths[module], imported]
                    following.append(imported)
        frontier = following
    raise AssertionError(f"{group} is not a cycle")


def cross_design_imports(graph: dict[str, set[str]], design_packages: set[str]) -> list[str]:
    """``importer -> imported`` for each module under one design's package importing another design's module."""

    def design_of(module: str) -> str | None:
        return next((p for p in design_packages if module == p or module.startswith(p + ".")), None)

    return sorted(
        f"{importer} -> {imported}"
        for importer, imports in graph.items()
        for imported in imports
        if design_of(importer) is not None and design_of(imported) not in (None, design_of(importer))
    )


def test_no_import_cycle_in_prototypes():
    cycles = import_cycles(import_graph(PACKAGE_ROOT))
    assert not cycles, "import cycles in prototypes/: " + "; ".join(" -> ".join(cycle) for cycle in cycles)


def test_no_design_imports_another_design():
    packages = {design_module(design) for design in IMPLEMENTATIONS.values()}
    crossing = cross_design_imports(import_graph(PACKAGE_ROOT), packages)
    assert not crossing, "a design imports another design: " + "; ".join(crossing)


def _write_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "probe"
    for relative, source in files.items():
        path = package / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return package


def test_a_type_only_import_cycle_is_found_and_named(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "shared.py": "",
        "design/__init__.py": "from probe.design.loops import Loop\n",
        "design/loops.py": "from probe.design.fetcher import Fetcher\nfrom probe import shared\n",
        "design/fetcher.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .loops import Loop
        """,
    })
    assert import_cycles(import_graph(package)) == [
        ["probe.design.fetcher", "probe.design.loops", "probe.design.fetcher"]
    ]


def test_an_import_inside_a_function_counts(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "def f():\n    from probe import b\n",
        "b.py": "import probe.a\n",
    })
    assert import_cycles(import_graph(package)) == [["probe.a", "probe.b", "probe.a"]]


def test_a_module_importing_another_designs_package_is_named(tmp_path):
    package = _write_package(tmp_path, {
        "__init__.py": "",
        "common.py": "",
        "first/__init__.py": "from probe import common\n",
        "second/__init__.py": "",
        "second/loops.py": "from probe.first import common as theirs\n",
    })
    graph = import_graph(package)
    assert import_cycles(graph) == []
    assert cross_design_imports(graph, {"probe.first", "probe.second"}) == ["probe.second.loops -> probe.first"]
