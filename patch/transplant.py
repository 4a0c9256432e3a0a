"""Code written in the prototypes, carried into Lightning's modules: one definition, written once, in both places.

Where a piece of the recommended design needs nothing of the loops it lives in (a check, a rule, a message), the
prototype's own definition is what the patch inserts: read from its module with ``inspect``, renamed to Lightning's
private spelling, with the prototype's module-level constants spelled out and its references to the suite's clauses
left behind (Lightning's readers do not have the suite), so that the suite's verdict on the
prototype is a verdict on the patch's code too.
"""

from __future__ import annotations

import ast
import functools
import inspect
import io
import re
import textwrap
import tokenize
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from patch.edits import import_statement


def definition_source(
    obj: Callable[..., Any] | type, *, name: str, constants: Mapping[str, str] = {},
    substitutions: Mapping[str, str] = {},
) -> str:
    """The source of ``obj``'s definition, dedented, renamed ``name``, each constant replaced by its literal, and
    each text of ``substitutions`` replaced as given (what the prototype needs where Lightning's loops do not)."""
    source = _substituted(textwrap.dedent(inspect.getsource(obj)), substitutions, obj.__name__)
    source = re.sub(rf"^(\s*(?:def|class)\s+){re.escape(obj.__name__)}\b", rf"\g<1>{name}", source, count=1, flags=re.M)
    for constant, literal in constants.items():
        source = re.sub(rf"\b{re.escape(constant)}\b", literal, source)
    return for_lightning(source)


def assignment_source(module: ModuleType, name: str) -> str:
    """The top-level assignment of ``name`` in ``module`` (a constant), as written there."""
    source = inspect.getsource(module)
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and name in _defined_names(node):
            return for_lightning("".join(source.splitlines(keepends=True)[node.lineno - 1:node.end_lineno]))
    raise LookupError(f"{module.__name__} assigns no top-level {name}")


def module_source(
    module: ModuleType,
    *,
    imports: Mapping[str, str],
    names: Mapping[str, str] = {},
    keep: Iterable[str] | None = None,
    drop: Iterable[str] = (),
    docstring: str | None = None,
    replacements: Mapping[str, str] = {},
) -> str:
    """A prototype module as a module of Lightning's: its imports of ``prototypes`` modules rewritten by ``imports``
    (prototype module -> Lightning module, longest prefix first), identifiers renamed by ``names``, only the
    top-level definitions in ``keep`` (all by default) less those in ``drop``, each definition named in
    ``replacements`` written as given there (a ``class_source``), the imports nothing uses any more left out, and the
    module's docstring replaced by ``docstring`` (written for Lightning's readers) when given."""
    tree = ast.parse(inspect.getsource(module))
    keep = set(keep) if keep is not None else None
    kept: list[tuple[int, ast.stmt]] = []
    for index, node in enumerate(tree.body):
        if index == 0 and docstring is not None and isinstance(node, ast.Expr):
            continue
        defined = _defined_names(node)
        if defined and (defined & set(drop) or (keep is not None and not defined & keep)):
            continue
        kept.append((index, node))
    replaced = {index: replacements[name] for index, node in kept if (name := _single_name(node)) in replacements}
    tree.body = [ast.parse(replaced[index]).body[0] if index in replaced else node for index, node in kept]
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | _names_in_strings(tree)
    lines = inspect.getsource(module).splitlines(keepends=True)
    pieces, previous_end, previous_index = [], 0, -1
    for index, node in kept:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        gap = lines[previous_end:start - 1]
        if index != previous_index + 1:  # definitions left out in between: keep only the comments above this one
            comments = []
            for line in reversed(gap):
                if not line.lstrip().startswith("#"):
                    break
                comments.insert(0, line)
            gap = ["\n", "\n", *comments]
        pieces.append("".join(gap))
        text = "".join(lines[start - 1:node.end_lineno])
        if index in replaced:
            text = replaced[index]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            text = _rewritten_import(node, used, imports)
        pieces.append(text)
        previous_end, previous_index = node.end_lineno, index
    source = re.sub(r"\n{3,}(?=(?:from|import) )", "\n\n", "".join(pieces))
    if docstring is not None:
        source = '"""' + docstring.strip() + '"""\n\n' + source.lstrip("\n")
    return for_lightning(renamed(source, names)).rstrip("\n") + "\n"


def top_level_names(module: ModuleType, *, keep: Iterable[str] | None = None, drop: Iterable[str] = ()) -> set[str]:
    """The names of the top-level definitions ``module_source`` takes from ``module`` with ``keep`` and ``drop``."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        defined = _defined_names(node)
        if defined and not (defined & set(drop) or (keep is not None and not defined & set(keep))):
            names |= defined
    return names


def imports_and_body(source: str) -> tuple[list[str], str]:
    """A module's imports, one statement each on one line (``from __future__`` left out), and what follows the last
    of them: its definitions, for a module written into another (its docstring left behind)."""
    tree = ast.parse(source)
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    written = [ast.unparse(node) for node in imports if not (isinstance(node, ast.ImportFrom)
                                                            and node.module == "__future__")]
    return written, "".join(source.splitlines(keepends=True)[imports[-1].end_lineno:]).strip("\n") + "\n"


def renamed(source: str, names: Mapping[str, str]) -> str:
    """``source`` (Python) with each module-level name of ``names`` spelled as it maps it (a prototype's name ->
    Lightning's): where the code refers to it (a name no enclosing function binds, a top-level definition, an imported
    name), not an attribute or a keyword of the same spelling; and in its docstrings, strings and comments, where the
    prose names it: a name that is one plain word (``vote``, ``drain``) only between backticks and not as the
    parameter or field a colon describes there, any other wherever it stands as a whole word, not after a dot."""
    if not names:
        return source
    lines = source.splitlines(keepends=True)
    spans: dict[tuple[int, int], tuple[int, str]] = {}  # (line, start column) -> (end column, new), columns in str

    def at(node: ast.AST, line: int, start: int, name: str) -> None:
        text = lines[line - 1]
        column = len(text.encode("utf-8")[:start].decode("utf-8"))  # the AST counts bytes
        if text[column:column + len(name)] != name:
            raise ValueError(f"renamed: {name!r} is not where the AST puts it ({ast.dump(node)[:80]})")
        spans[line, column] = (column + len(name), names[name])

    for node, scopes in _walk_scopes(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in names and not any(node.id in bound for bound in scopes):
            at(node, node.lineno, node.col_offset, node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not scopes:
            if node.name in names:
                line = node.lineno
                keyword = re.match(r"\s*(?:async\s+)?(?:def|class)\s+", lines[line - 1])
                at(node, line, len(lines[line - 1][:keyword.end()].encode("utf-8")), node.name)
        elif isinstance(node, ast.alias) and node.name in names:
            at(node, node.lineno, node.col_offset, node.name)
    code = [(line, start, end) for (line, start), (end, _) in spans.items()]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        (first, first_column), (last, last_column) = token.start, token.end
        for number in range(first, last + 1):
            start = first_column if number == first else 0
            end = last_column if number == last else len(lines[number - 1])
            for match in _prose_names(names).finditer(lines[number - 1], start, end):
                if not any(line == number and s < match.end() and match.start() < e for line, s, e in code):
                    spans[number, match.start()] = (match.end(), names[match.group()])
    for (line, start), (end, new) in sorted(spans.items(), reverse=True):
        text = lines[line - 1]
        lines[line - 1] = text[:start] + new + text[end:]
    return "".join(lines)


@functools.cache
def _prose_names_of(items: tuple[tuple[str, str], ...]) -> re.Pattern[str]:
    words = [re.escape(old) for old, _ in items if re.fullmatch(r"[A-Za-z][a-z]*", old)]
    others = [re.escape(old) for old, _ in items if not re.fullmatch(r"[A-Za-z][a-z]*", old)]
    # a plain word between backticks and then a colon describes a parameter or a field of that spelling (``drain``:)
    alternatives = [f"(?<=`)(?:{'|'.join(words)})\\b(?!`+:)"] if words else []
    if others:
        alternatives.append(f"(?<![\\w.])(?:{'|'.join(sorted(others, key=len, reverse=True))})\\b")
    return re.compile("|".join(alternatives))


def _prose_names(names: Mapping[str, str]) -> re.Pattern[str]:
    return _prose_names_of(tuple(sorted(names.items())))


_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                    ast.GeneratorExp)


def _walk_scopes(node: ast.AST) -> Iterator[tuple[ast.AST, tuple[set[str], ...]]]:
    """Every node under ``node``, with the names each enclosing scope binds: a name none of them binds is the
    module's. A function, a lambda and a comprehension are scopes; a class body is one only for what stands in it
    directly (its methods do not see its names)."""
    for child in ast.iter_child_nodes(node):
        yield from _visit(child, (), None)


def _visit(
    node: ast.AST, scopes: tuple[set[str], ...], class_body: set[str] | None
) -> Iterator[tuple[ast.AST, tuple[set[str], ...]]]:
    yield node, scopes if class_body is None else (*scopes, class_body)
    if isinstance(node, _FUNCTION_SCOPES):
        inner = (*scopes, _bound_in(node))
        for child in ast.iter_child_nodes(node):
            yield from _visit(child, inner, None)
    elif isinstance(node, ast.ClassDef):
        for part in [*node.decorator_list, *node.bases, *node.keywords]:
            yield from _visit(part, scopes, class_body)
        own = _bound_in(node)
        for statement in node.body:
            yield from _visit(statement, scopes, own)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _visit(child, scopes, class_body)


def _bound_in(scope: ast.AST) -> set[str]:
    """The names a function (a lambda, a comprehension) binds: its parameters and what its own body assigns."""
    bound: set[str] = set()
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        arguments = scope.args
        bound |= {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
        bound |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    declared: set[str] = set()
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
        if isinstance(node, (*_FUNCTION_SCOPES, ast.ClassDef)) and node is not scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                pending.extend([*node.decorator_list, *getattr(node, "bases", ())])
            continue  # its own scope
        pending.extend(ast.iter_child_nodes(node))
    return bound - declared


def for_lightning(source: str) -> str:
    """Prototype source as Lightning's readers get it: without the references to the suite's clauses and without the
    ``[RFC n]`` tags that point the RFC's list at the code (a comment that is only a tag goes)."""
    source = re.sub(r" \((?:clause )?C\d+[^)]*\)", "", source)
    source = re.sub(r"^[ \t]*# \[RFC \d+\][^\S\n]*\n", "", source, flags=re.M)
    return re.sub(r"\[RFC \d+\] ?", "", source)


def class_source(
    cls: type, *, name: str, bases: str, drop: Iterable[str] = (), substitutions: Mapping[str, str] = {},
    within: str = "prototypes.",
) -> str:
    """``cls`` as one class of Lightning's, named ``name``, with ``bases``: a prototype's class together with the
    prototype classes it inherits from (those of its MRO defined under ``prototypes``), flattened, so that Lightning's
    reader meets one class and no mixin. Its docstring, then each member's most derived definition, the class's own
    first and then those of its bases in MRO order, less ``drop`` (a base's member the class makes unreachable). A
    base's class-level annotations (the attributes it expects its host to set) are left out. A ``super().__init__``
    call whose next ``__init__`` is a flattened base's is replaced by that body, its parameters bound to the call's
    arguments; any other ``super()`` call must reach a class outside the flattened ones. ``substitutions``: exact text
    replaced in the result. ``within``: the package whose classes are flattened."""
    flattened = [c for c in cls.__mro__ if c.__module__.startswith(within)]
    outside = [c for c in cls.__mro__ if c not in flattened]
    seen, attributes, members = set(drop), [], []
    for owner in flattened:
        written = textwrap.dedent(inspect.getsource(owner))
        body, lines = ast.parse(written).body[0], written.splitlines(keepends=True)
        if owner is cls:
            docstring = ast.get_docstring(body, clean=False)
        for node in body.body:
            member = _member_key(node)
            if member is None or member in seen or (isinstance(node, ast.AnnAssign) and node.value is None):
                continue
            seen.add(member)
            start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            while start > 1 and lines[start - 2].lstrip().startswith("#"):  # the comments that say why
                start -= 1
            text = _without_super_init("".join(lines[start - 1:node.end_lineno]), owner, flattened)
            if not any(member.split(".")[0] in c.__dict__ for c in outside):  # it overrides nothing any more
                text = re.sub(r"^ *@override\n", "", text, flags=re.M)
            (attributes if isinstance(node, (ast.Assign, ast.AnnAssign)) else members).append(text)
    heading = f"class {name}({bases}):" if bases else f"class {name}:"
    source = f'{heading}\n    """{docstring}"""\n\n' + "".join(f"{text}\n" for text in attributes) + "\n".join(members)
    return for_lightning(_substituted(source, substitutions, f"the flattened {cls.__name__}"))


def _substituted(source: str, substitutions: Mapping[str, str], where: str) -> str:
    for old, new in substitutions.items():
        if old not in source:
            raise ValueError(f"{old!r} is not in {where}")
        source = source.replace(old, new)
    return source


def _without_super_init(member: str, owner: type, flattened: list[type]) -> str:
    """``member`` (a method of ``owner``) with a ``super().__init__(...)`` that reaches a flattened class inlined."""
    later = flattened[flattened.index(owner) + 1:]
    base = next((c for c in owner.__mro__[1:] if "__init__" in c.__dict__), None)
    calls = re.findall(r"super\(\)\.(\w+)\(", member)
    if base not in later or "__init__" not in calls:
        if any(c.__dict__.get(call) for call in calls for c in later):
            raise NotImplementedError(f"{owner.__name__}: a super() call into a flattened base is not inlined")
        return member
    match = re.search(r"^( *)super\(\)\.__init__\((.*)\)\n", member, flags=re.M)
    call = ast.parse(f"f({match.group(2)})").body[0].value
    init = ast.parse(textwrap.dedent(inspect.getsource(base.__init__))).body[0]
    parameters = [a.arg for a in init.args.args[1:]]
    bound = dict(zip(parameters, call.args, strict=True))
    statements = init.body[1:] if ast.get_docstring(init) else init.body
    text = "".join(f"{match.group(1)}{ast.unparse(_Bound(bound).visit(statement))}\n" for statement in statements)
    inlined = member[:match.start()] + text + member[match.end():]
    return _without_super_init(inlined, base, flattened) if "super().__init__(" in text else inlined


class _Bound(ast.NodeTransformer):
    """A function's parameters (names read in its body) replaced by the arguments of a call."""

    def __init__(self, arguments: Mapping[str, ast.expr]) -> None:
        self.arguments = arguments

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return self.arguments.get(node.id, node) if isinstance(node.ctx, ast.Load) else node


def _member_key(node: ast.stmt) -> str | None:
    """A class member's name, ``name.setter`` for a property's setter."""
    setter = any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in getattr(node, "decorator_list", []))
    name = _single_name(node)
    return f"{name}.setter" if setter and name else name


def _single_name(node: ast.stmt) -> str | None:
    names = _defined_names(node)
    return next(iter(names)) if len(names) == 1 else None


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def _names_in_strings(tree: ast.AST) -> set[str]:
    """Names used in string annotations (``from __future__ import annotations`` keeps them as text)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.FunctionDef | ast.AnnAssign):
            annotation = node.returns if isinstance(node, ast.FunctionDef) else node.annotation
            if annotation is not None:
                found |= {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
    return found


def _rewritten_import(node: ast.Import | ast.ImportFrom, used: set[str], imports: Mapping[str, str]) -> str:
    """The import with what nothing uses left out, a ``prototypes`` module replaced by its Lightning module:
    ``imports`` maps a module (or ``"module:name"``, for one name of it) to its Lightning module."""
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return ast.unparse(node) + "\n"
    kept = [a for a in node.names if (a.asname or a.name).split(".")[0] in used]
    if not kept:
        return ""
    if isinstance(node, ast.Import):
        return import_statement(ast.unparse(ast.Import(kept)))
    module = node.module or ""
    if not module.startswith("prototypes"):
        return import_statement(ast.unparse(ast.ImportFrom(module, kept, 0)))
    by_target: dict[str, list[ast.alias]] = {}
    for alias in kept:
        by_target.setdefault(_lightning_module(module, alias.name, imports), []).append(alias)
    return "".join(import_statement(ast.unparse(ast.ImportFrom(target, aliases, 0)))
                   for target, aliases in by_target.items())


def _lightning_module(module: str, name: str, imports: Mapping[str, str]) -> str:
    if f"{module}:{name}" in imports:
        return imports[f"{module}:{name}"]
    for prototype in sorted(imports, key=len, reverse=True):
        if module == prototype or module.startswith(prototype + "."):
            return imports[prototype] + module[len(prototype):]
    raise KeyError(f"no Lightning module given for `from {module} import {name}`: add it to `imports`")


def methods_source(cls: type, names: Iterable[str]) -> str:
    """The definitions of ``cls``'s methods (and properties) ``names``, dedented, in the order given, as a class body
    holds them: the prototype's own methods, for a Lightning class to hold."""
    pieces = []
    for name in names:
        member = cls.__dict__[name]
        function = member.fget if isinstance(member, property) else member
        pieces.append(textwrap.dedent(inspect.getsource(function)))
    return for_lightning("\n".join(pieces))
