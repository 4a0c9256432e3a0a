"""Predicates naming a statement of Lightning's source by its structure, for ``patch.edits``: where an edit must
reach inside a body, it names the statement by what it assigns, calls, asserts, raises or returns, read with
``ast``, never by its text."""

from __future__ import annotations

import ast
from collections.abc import Callable

Predicate = Callable[[ast.stmt], bool]


def assigns(target: str) -> Predicate:
    """A statement assigning ``target`` (``"self.done"``, ``"batch"``)."""

    def matches(node: ast.stmt) -> bool:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        return isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and any(
            t is not None and ast.unparse(t) == target for t in targets
        )

    return matches


def calls(function: str) -> Predicate:
    """An expression statement, assignment or return whose value is a call of ``function`` (``"self.advance"``)."""

    def matches(node: ast.stmt) -> bool:
        value = getattr(node, "value", None)
        return (
            isinstance(node, (ast.Expr, ast.Assign, ast.Return))
            and isinstance(value, ast.Call)
            and ast.unparse(value.func) == function
        )

    return matches


def asserts(dotted: str) -> Predicate:
    """An ``assert`` statement whose test reads ``dotted`` (``"model.batch_start_ins"``)."""

    def matches(node: ast.stmt) -> bool:
        return isinstance(node, ast.Assert) and reads_name(node.test, dotted)

    return matches


def asserts_exactly(test: str) -> Predicate:
    """The ``assert`` statement whose test is ``test``, as ``ast.unparse`` writes it (where ``asserts`` would match
    several statements reading the same name)."""

    def matches(node: ast.stmt) -> bool:
        return isinstance(node, ast.Assert) and ast.unparse(node.test) == test

    return matches


def raises(exception: str) -> Predicate:
    """A statement (an ``if``, say) whose body raises ``exception``."""

    def matches(node: ast.stmt) -> bool:
        return isinstance(node, (ast.If, ast.With, ast.Try)) and any(
            isinstance(inner, ast.Raise) and inner.exc is not None and reads_name(inner.exc, exception)
            for inner in ast.walk(node)
        )

    return matches


def reads_name(expression: ast.AST, dotted: str) -> bool:
    """Whether ``expression`` reads the name or attribute ``dotted`` anywhere inside it."""
    return any(
        isinstance(node, (ast.Name, ast.Attribute)) and ast.unparse(node) == dotted for node in ast.walk(expression)
    )


def returns(node: ast.stmt) -> bool:
    """A ``return`` statement (where a function has exactly one)."""
    return isinstance(node, ast.Return)
