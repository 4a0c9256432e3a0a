"""Every class in ``prototypes/`` fits on a screen: at most ``MAX_CLASS_LINES`` lines, from its ``class`` statement to
its last line, docstring included (the rule in ``docs/adding-a-design.md``).

Why a test: a reviewer reads a class whole; one that needs scrolling mixes ideas (a Lightning seam, a hand-out, a
thread's lifecycle) that a reader should meet one at a time, and the class a method is in should say which thread
runs it. Read from source (``ast``), so nested classes count on their own too.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import prototypes

MAX_CLASS_LINES = 100
PROTOTYPES = Path(prototypes.__file__).parent


def class_lengths(source: str) -> dict[str, int]:
    """Each class in ``source`` (nested ones as ``Outer.Inner``): its lines, ``class`` statement to last line."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = f"{prefix}{child.name}"
                lengths[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


def test_the_count_runs_from_the_class_statement_to_its_last_line() -> None:
    source = textwrap.dedent('''
        @decorated
        class Outer:
            """Doc."""

            class Inner:
                x = 1

            def method(self):
                return 2
        ''')
    assert class_lengths(source) == {"Outer": 8, "Outer.Inner": 2}


def test_every_class_in_prototypes_fits_on_a_screen() -> None:
    files = sorted(PROTOTYPES.rglob("*.py"))
    assert len(files) > 10, f"found {len(files)} modules under {PROTOTYPES}: the check reads nothing"
    too_long = [
        f"{path.relative_to(PROTOTYPES.parent)} {name}: {length} lines"
        for path in files
        for name, length in class_lengths(path.read_text(encoding="utf-8")).items()
        if length > MAX_CLASS_LINES
    ]
    assert not too_long, (
        f"classes over {MAX_CLASS_LINES} lines (cut each along its ideas: docs/adding-a-design.md):\n"
        + "\n".join(too_long)
    )
