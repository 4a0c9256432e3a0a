"""``harness_common``, what the suite, the benchmarks and the RFC renderer share, and the rule it exists for: the
three import each other in no cycle."""

from __future__ import annotations

import ast
import subprocess
from collections import defaultdict
from pathlib import Path

import harness_common

ROOT = Path(__file__).resolve().parent.parent
# The three tops and the module names their files are imported by (``rfc/render.py`` puts ``rfc/`` on the path, so
# its package is imported as ``rendering``).
TOPS = {"tests": "tests", "benchmarks": "benchmarks", "rfc": "rfc", "rendering": "rfc", "render": "rfc"}


def imports_between_tops(root: Path) -> dict[tuple[str, str], list[str]]:
    """``{(importer, imported): ["file:line", ...]}`` for every import, at any depth of a file (inside functions
    too), from one of ``tests/``, ``benchmarks/``, ``rfc/`` into another."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for top in sorted(set(TOPS.values())):
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    imported = TOPS.get(name.split(".")[0])
                    if imported and imported != top:
                        edges[(top, imported)].append(f"{path.relative_to(root)}:{node.lineno}")
    return edges


def import_cycles(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """Each cycle among the tops, as ``a -> b -> a`` followed by the imports that make each step of it."""
    graph: dict[str, set[str]] = defaultdict(set)
    for importer, imported in edges:
        graph[importer].add(imported)
    found: list[str] = []
    seen: set[frozenset[str]] = set()

    def walk(path: list[str]) -> None:
        for following in sorted(graph[path[-1]]):
            if following == path[0] and frozenset(path) not in seen:
                seen.add(frozenset(path))
                steps = list(zip(path, path[1:] + [path[0]], strict=True))
                found.append(" -> ".join([*path, path[0]]) + ": " + "; ".join(
                    f"{a} -> {b} at {', '.join(edges[(a, b)])}" for a, b in steps))
            elif following not in path:
                walk([*path, following])

    for start in sorted(graph):
        walk([start])
    return found


def test_tests_benchmarks_and_rfc_import_each_other_in_no_cycle():
    cycles = import_cycles(imports_between_tops(ROOT))
    assert not cycles, (
        "tests/, benchmarks/ and rfc/ import each other in a cycle; move what both sides need into harness_common:\n"
        + "\n".join(cycles)
    )


def test_an_import_cycle_is_found_and_named_by_its_imports(tmp_path: Path):
    for path, source in {
        "tests/plugin.py": "def selection():\n    from benchmarks.provenance import provenance\n",
        "benchmarks/conftest.py": "from tests.plugin import selection\n",
        "rfc/rendering/pages.py": "import tests.plugin\n",  # one way only: no cycle of its own
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(source)
    assert import_cycles(imports_between_tops(tmp_path)) == [
        "benchmarks -> tests -> benchmarks: benchmarks -> tests at benchmarks/conftest.py:1; "
        "tests -> benchmarks at tests/plugin.py:2"
    ]


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True, timeout=30)


def test_the_code_counts_as_changed_only_outside_the_results_and_rendered_pages(tmp_path: Path) -> None:
    for path in ("prototypes/design.py", "rfc/results/conformance.json", "rfc/generated/matrix.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("committed\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "measured code")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()

    (tmp_path / "rfc/results/conformance.json").write_text("a new run\n")
    (tmp_path / "rfc/generated/matrix.md").write_text("re-rendered\n")
    assert harness_common.code_revision(tmp_path) == {"git_commit": head, "git_dirty": False}
    (tmp_path / "prototypes/design.py").write_text("changed\n")
    assert harness_common.code_revision(tmp_path) == {"git_commit": head, "git_dirty": True}
