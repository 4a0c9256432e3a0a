"""Edits to Lightning's source, addressed by what they change (a module, a class, a method), never by Lightning's text.

The patch series is generated: the repository holds the code that goes into Lightning and where it goes, not a copy
of Lightning's source or of a diff's context lines. An edit names its place by the dotted module and the qualified
name of a definition (``"loops.fetchers"``, ``"_DataLoaderIterDataFetcher.__next__"``); where it must reach inside a
body, by the statement's structure (an assignment to a name, a call of a name; ``patch.statements``), read with
``ast``. Lightning's own lines are only ever kept, moved or removed, never written by this code.

Every edit re-parses the module it changes, so edits compose in any order, and an edit whose place is missing (a
Lightning release that moved the code) stops with an error that names the place.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

from patch.statements import Predicate, reads_name

LINE_LENGTH = 120  # Lightning's line length (its pyproject.toml)


def import_statement(line: str) -> str:
    """An import as Lightning's formatter writes it: on one line, or, where that passes ``LINE_LENGTH``, its names in
    parentheses, one per line, with a trailing comma."""
    node = ast.parse(line.strip()).body[0]
    text = ast.unparse(node)
    if len(text) <= LINE_LENGTH or not isinstance(node, ast.ImportFrom):
        return text + "\n"
    names = "".join(f"    {ast.unparse(alias)},\n" for alias in node.names)
    return f"from {'.' * node.level}{node.module} import (\n{names})\n"


def _split_parameters(text: str) -> list[str]:
    """A parameter list's parameters, split at its top-level commas (not those inside brackets or strings)."""
    parts, depth, quote, current = [], 0, "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += char
    return [part for part in [*parts, current.strip()] if part]


class PlaceNotFound(LookupError):
    """The place an edit names is not in the source: the release under patch differs from the one it was written for."""


LICENSE_HEADER = """\
# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""


class LightningSource:
    """The source tree of one Lightning package (``root`` holds ``loops/``, ``trainer/``...), edited in place."""

    def __init__(self, root: Path, package: str) -> None:
        self.root, self.package = root, package

    def module(self, dotted: str) -> ModuleSource:
        """``dotted`` relative to the package, e.g. ``"loops.fetchers"``."""
        path = self.root.joinpath(*dotted.split(".")).with_suffix(".py")
        if not path.is_file():
            raise PlaceNotFound(f"{self.package}.{dotted}: no module at {path}")
        return ModuleSource(path, f"{self.package}.{dotted}")

    def add_module(self, dotted: str, text: str) -> None:
        """A new module of ``text``, under the license header every module of Lightning's opens with."""
        path = self.root.joinpath(*dotted.split(".")).with_suffix(".py")
        if path.exists():
            raise FileExistsError(f"{self.package}.{dotted} exists already; edit it instead")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(LICENSE_HEADER + text)

    def add_changelog_entry(self, section: str, entry: str) -> None:
        """Add ``entry`` under ``### section`` of the package's ``CHANGELOG.md``, in its unreleased release: in place of
        the section's placeholder (a lone ``-``), or after its last entry, one blank line between entries."""
        path = self.root / "CHANGELOG.md"
        lines = path.read_text().splitlines(keepends=True)
        unreleased = next((i for i, line in enumerate(lines) if line.startswith("## [unreleased]")), None)
        if unreleased is None:
            raise PlaceNotFound(f"{path}: no '## [unreleased]' release")
        end = next((i for i in range(unreleased + 1, len(lines)) if lines[i].startswith(("## ", "---"))), len(lines))
        heading = next((i for i in range(unreleased, end) if lines[i].strip() == f"### {section}"), None)
        if heading is None:
            raise PlaceNotFound(f"{path}: the unreleased release has no '### {section}' section")
        stop = next((i for i in range(heading + 1, end) if lines[i].startswith("### ")), end)
        body = [i for i in range(heading + 1, stop) if lines[i].strip()]
        text = f"- {' '.join(entry.split())}\n"
        if [lines[i].strip() for i in body] == ["-"]:
            lines[body[0]] = text
        else:
            lines.insert(body[-1] + 1, "\n" + text)
        path.write_text("".join(lines))


class ModuleSource:
    """One module's text, with edits addressed by qualified names."""

    def __init__(self, path: Path, name: str) -> None:
        self.path, self.name = path, name

    # ---- reading
    @property
    def lines(self) -> list[str]:
        return self.path.read_text().splitlines(keepends=True)

    def _tree(self) -> ast.Module:
        return ast.parse(self.path.read_text())

    def definition(self, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef:
        scope: ast.AST = self._tree()
        for part in qualname.split("."):
            found = [
                node for node in getattr(scope, "body", [])
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part
            ]
            if not found:
                raise PlaceNotFound(f"{self.name}: no definition {qualname!r}")
            scope = found[-1]  # the last wins, as at run time (a property's setter follows its getter)
        return scope  # type: ignore[return-value]

    def statement(self, qualname: str, matches: Predicate, nth: int | None = None) -> ast.stmt:
        """The one statement of ``qualname``'s body, at any depth, that ``matches``; with ``nth``, the nth of those
        that match, in the order they are written (from 0)."""
        found = [node for node in ast.walk(self.definition(qualname)) if isinstance(node, ast.stmt) and matches(node)]
        found = sorted((node for node in found if node is not self.definition(qualname)), key=lambda n: n.lineno)
        if nth is not None:
            if nth >= len(found):
                raise PlaceNotFound(f"{self.name}: {len(found)} statements of {qualname!r} match, expected {nth + 1}")
            return found[nth]
        if len(found) != 1:
            raise PlaceNotFound(f"{self.name}: {len(found)} statements of {qualname!r} match, expected one")
        return found[0]

    # ---- writing
    def _splice(self, start: int, end: int, text: str) -> None:
        """Replace lines ``start``..``end`` (1-based, inclusive; ``end = start - 1`` inserts before ``start``)."""
        lines = self.lines
        lines[start - 1:end] = [text] if text else []
        self.path.write_text("".join(lines))
        ast.parse(self.path.read_text(), filename=str(self.path))  # an edit never leaves a module that fails to parse

    @staticmethod
    def _indented(code: str, indent: str) -> str:
        code = textwrap.dedent(code).strip("\n")
        if not code:
            return ""
        return textwrap.indent(code, indent, lambda line: bool(line.strip())) + "\n"

    def _start_line(self, node: ast.stmt) -> int:
        decorators = getattr(node, "decorator_list", [])
        return min([node.lineno, *(d.lineno for d in decorators)])

    def _indent_of(self, node: ast.stmt) -> str:
        line = self.lines[node.lineno - 1]
        return line[: len(line) - len(line.lstrip())]

    def replace(self, qualname: str, code: str) -> None:
        """Replace a whole definition (decorators included) with ``code``."""
        node = self.definition(qualname)
        self._splice(self._start_line(node), node.end_lineno, self._indented(code, self._indent_of(node)))

    def remove(self, qualname: str) -> None:
        node = self.definition(qualname)
        start, end = self._start_line(node), node.end_lineno
        lines = self.lines
        # and the blank lines that separated it from the next (PEP 8: two at the top level, one in a class), so the
        # definitions around it keep their separation
        for _ in range(1 if self._indent_of(node) else 2):
            if end < len(lines) and not lines[end].strip():
                end += 1
        self._splice(start, end, "")

    def insert(
        self, code: str, *, after: str | None = None, before: str | None = None, into: str | None = None
    ) -> None:
        """Insert definitions next to the one named ``after``/``before``, or at the end of the class ``into``, or at
        the end of the module (separated as PEP 8 separates them)."""
        if after or before:
            node = self.definition(after or before)  # type: ignore[arg-type]
            indent = self._indent_of(node)
            blank = "\n\n" if not indent else "\n"
            text = self._indented(code, indent)
            if after:
                self._splice(node.end_lineno + 1, node.end_lineno, blank + text)
            else:
                self._splice(self._start_line(node), self._start_line(node) - 1, text + blank)
            return
        if into:
            node = self.definition(into)
            indent = self._indent_of(node.body[0])
            self._splice(node.end_lineno + 1, node.end_lineno, "\n" + self._indented(code, indent))
            return
        self._splice(len(self.lines) + 1, len(self.lines), "\n\n" + self._indented(code, ""))

    def insert_in_body(
        self, qualname: str, code: str, *, at_start: bool = False, at_end: bool = False,
        before: Predicate | None = None, after: Predicate | None = None, nth: int | None = None,
    ) -> None:
        """Insert statements into ``qualname``'s body: first (after its docstring), last, or before/after the one
        statement that the predicate matches."""
        definition = self.definition(qualname)
        if at_end:
            last = definition.body[-1]
            self._splice(last.end_lineno + 1, last.end_lineno, self._indented(code, self._indent_of(last)))
            return
        if at_start:
            body = definition.body
            has_docstring = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
            anchor = body[1] if has_docstring and len(body) > 1 else body[0]
            if has_docstring and len(body) == 1:
                self._splice(body[0].end_lineno + 1, body[0].end_lineno, self._indented(code, self._indent_of(body[0])))
                return
            self._splice(anchor.lineno, anchor.lineno - 1, self._indented(code, self._indent_of(anchor)))
            return
        node = self.statement(qualname, before or after, nth)  # type: ignore[arg-type]
        text = self._indented(code, self._indent_of(node))
        if before:
            self._splice(self._start_line(node), self._start_line(node) - 1, text)
        else:
            self._splice(node.end_lineno + 1, node.end_lineno, text)

    def replace_statement(
        self, qualname: str, matches: Predicate, code: str, *, comments_above: bool = False, nth: int | None = None
    ) -> None:
        """Replace the one statement of ``qualname`` that ``matches`` (the ``nth``, as ``statement``) with ``code``;
        with ``comments_above``, the comment lines right above it too (a comment that describes what the statement
        did)."""
        node = self.statement(qualname, matches, nth)
        start = self._start_line(node)
        if comments_above:
            lines = self.lines
            while start > 1 and lines[start - 2].lstrip().startswith("#"):
                start -= 1
        self._splice(start, node.end_lineno, self._indented(code, self._indent_of(node)))

    def remove_statement(
        self, qualname: str, matches: Predicate, *, comments_above: bool = False, nth: int | None = None
    ) -> None:
        """Remove the statement ``replace_statement`` would replace."""
        self.replace_statement(qualname, matches, "", comments_above=comments_above, nth=nth)

    def remove_comment(self, qualname: str, words: str) -> None:
        """Remove the one comment line of ``qualname`` that holds ``words`` (a comment the change makes untrue)."""
        node = self.definition(qualname)
        lines = self.lines
        found = [number for number in range(self._start_line(node), node.end_lineno + 1)
                 if lines[number - 1].lstrip().startswith("#") and words in lines[number - 1]]
        if len(found) != 1:
            raise PlaceNotFound(f"{self.name}: {len(found)} comment lines of {qualname!r} hold {words!r}, expected one")
        self._splice(found[0], found[0], "")

    def substitute(self, qualname: str, pattern: str, replacement: str | Callable[[re.Match], str]) -> None:
        """``re.sub`` over the lines of ``qualname``'s definition, each line on its own (``^`` and ``$`` are its
        ends); the pattern must match at least once."""
        node = self.definition(qualname)
        start, end = self._start_line(node), node.end_lineno
        lines = self.lines
        changed, count = [], 0
        for line in lines[start - 1:end]:
            text, ending = (line[:-1], "\n") if line.endswith("\n") else (line, "")
            text, n = re.subn(pattern, replacement, text)
            changed.append(text + ending)
            count += n
        if not count:
            raise PlaceNotFound(f"{self.name}: nothing in {qualname!r} matches {pattern!r}")
        self._splice(start, end, "".join(changed))

    def add_parameters(self, qualname: str, parameters: str) -> None:
        """Add keyword parameters (``"progress: Optional[_Progress] = None"``) after a function's last parameter."""
        function = self.definition(qualname)
        last = (function.args.kwonlyargs or function.args.args)[-1]  # type: ignore[union-attr]
        end = last.annotation if last.annotation is not None else last
        lines = self.lines
        line = lines[end.end_lineno - 1]
        line = line[: end.end_col_offset] + ", " + parameters + line[end.end_col_offset:]
        if len(line.rstrip("\n")) > LINE_LENGTH and function.lineno == end.end_lineno:
            # one parameter per line, as Lightning's formatter writes a signature that does not fit
            opening = line.index("(", line.index(f"def {function.name}"))
            closing = line.rindex(")")
            indent = line[: len(line) - len(line.lstrip())]
            parameters_text = "".join(f"{indent}    {p},\n" for p in _split_parameters(line[opening + 1 : closing]))
            line = f"{line[: opening + 1]}\n{parameters_text}{indent}{line[closing:]}"
        lines[end.end_lineno - 1] = line
        self.path.write_text("".join(lines))
        ast.parse(self.path.read_text(), filename=str(self.path))

    def replace_condition(self, qualname: str, reads: str, code: str) -> None:
        """Replace the test of the one ``if`` statement in ``qualname`` whose test reads ``reads`` (a dotted name)."""
        node = self.statement(qualname, lambda n: isinstance(n, ast.If) and reads_name(n.test, reads))
        test = node.test  # type: ignore[attr-defined]
        lines = self.lines
        if test.lineno != test.end_lineno:
            raise PlaceNotFound(f"{self.name}: the condition reading {reads!r} in {qualname!r} spans several lines")
        line = lines[test.lineno - 1]
        lines[test.lineno - 1] = line[: test.col_offset] + code.strip() + line[test.end_col_offset:]
        self.path.write_text("".join(lines))
        ast.parse(self.path.read_text(), filename=str(self.path))

    def extend_docstring(self, qualname: str, text: str, *, before_section: str | None = None) -> None:
        """Add a paragraph to ``qualname``'s docstring: before the line that opens the section ``before_section``
        (``"Raises:"``), or at its end."""
        docstring = self.definition(qualname).body[0]
        if not (isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)):
            raise PlaceNotFound(f"{self.name}: {qualname!r} has no docstring")
        indent = self._indent_of(docstring)
        paragraph = self._indented(text, indent) + "\n"
        if docstring.lineno == docstring.end_lineno:  # one line: its closing quotes go on a line of their own
            line = self.lines[docstring.lineno - 1]
            closing = line.rindex(line.rstrip()[-3:])
            self._splice(docstring.lineno, docstring.lineno,
                         line[:closing] + "\n\n" + paragraph.rstrip("\n") + "\n" + indent + line[closing:])
            return
        if before_section is None:
            self._splice(docstring.end_lineno, docstring.end_lineno - 1, "\n" + paragraph.rstrip("\n") + "\n")
            return
        for number in range(docstring.lineno, docstring.end_lineno + 1):
            if self.lines[number - 1].strip() == before_section:
                self._splice(number, number - 1, paragraph)
                return
        raise PlaceNotFound(f"{self.name}: the docstring of {qualname!r} has no section {before_section!r}")

    def remove_imported_name(self, name: str) -> None:
        """Drop ``name`` from the module's ``from ... import`` statement (the whole statement if it was the last)."""
        for node in self._tree().body:
            if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
                kept = [alias for alias in node.names if alias.name != name]
                text = "" if not kept else ast.unparse(ast.ImportFrom(node.module, kept, node.level)) + "\n"
                self._splice(node.lineno, node.end_lineno, text)
                return
        raise PlaceNotFound(f"{self.name}: no `from ... import {name}`")

    def add_import(self, line: str) -> None:
        """Add an import statement after the module's last top-level import."""
        last = [node for node in self._tree().body if isinstance(node, (ast.Import, ast.ImportFrom))][-1]
        self._splice(last.end_lineno + 1, last.end_lineno, import_statement(line))
