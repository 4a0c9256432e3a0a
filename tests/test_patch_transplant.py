"""``patch.transplant``: a class and the bases it mixes in, written as one class for Lightning; a module's constant
as its module writes it."""

from __future__ import annotations

import ast
import io
import sys

import pytest
from typing_extensions import override

from patch.transplant import assignment_source, class_source, imports_and_body

# the constant the assignment test reads
MESSAGE = (
    "one line, "
    "and the next"
)


class _Base:
    greeting = "hello"

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def _take(self) -> int:
        raise NotImplementedError

    def shared(self) -> str:
        return "base"


class _Mixin:
    host_sets: int  # what the mixin expects its host to set

    # why the mixin's method exists
    def mixed_in(self) -> int:
        return self.host_sets

    @property
    def value(self) -> int:
        return 1

    @value.setter
    def value(self, value: int) -> None:
        self.host_sets = value


class _Flattened(_Mixin, _Base, io.StringIO):  # io.StringIO: a class outside the flattened ones
    """The class the reader meets."""

    def __init__(self, fetcher: str) -> None:
        super().__init__(fetcher.upper())
        self._take = len

    def shared(self) -> str:
        return "derived"

    @override
    def close(self) -> None:
        super().close()


def _flattened(**options) -> str:
    return class_source(_Flattened, name="_Written", bases="io.StringIO", within=__name__, **options)


def test_the_class_its_mixins_and_bases_become_one_class_with_the_most_derived_members():
    source = _flattened(drop=("_take",))
    body = ast.parse(source).body[0]
    assert body.name == "_Written" and [ast.unparse(b) for b in body.bases] == ["io.StringIO"]
    members = [node.name if not isinstance(node, ast.Assign) else node.targets[0].id for node in body.body[1:]]
    assert members == ["greeting", "__init__", "shared", "close", "mixed_in", "value", "value"]
    assert 'return "derived"' in source and 'return "base"' not in source
    assert "host_sets: int" not in source and "# why the mixin's method exists" in source
    assert "@value.setter" in source
    assert ast.get_docstring(body) == "The class the reader meets."


def test_a_super_init_into_a_flattened_base_is_inlined_with_its_arguments_and_other_super_calls_stay():
    source = _flattened(drop=("_take",))
    assert "self.name = fetcher.upper()\n        self.closed = False\n        self._take = len" in source
    assert "super().__init__" not in source
    assert "@override\n    def close(self) -> None:\n        super().close()" in source


def test_substitutions_apply_and_one_that_finds_nothing_is_refused():
    assert "self.done = True" in _flattened(substitutions={"self.closed = False": "self.done = True"})
    with pytest.raises(ValueError, match="is not in the flattened _Flattened"):
        _flattened(substitutions={"absent text": "x"})


def test_a_constant_is_written_as_its_module_writes_it_and_a_missing_one_is_refused():
    written = assignment_source(sys.modules[__name__], "MESSAGE")
    assert written == 'MESSAGE = (\n    "one line, "\n    "and the next"\n)\n'
    assert ast.literal_eval(ast.parse(written).body[0].value) == MESSAGE
    with pytest.raises(LookupError, match="assigns no top-level ABSENT"):
        assignment_source(sys.modules[__name__], "ABSENT")


def test_a_module_written_into_another_gives_its_imports_on_one_line_each_and_what_follows_them():
    module = (
        '"""Its docstring."""\n\nfrom __future__ import annotations\n\nimport os\nfrom typing import (\n'
        "    Any,\n    NamedTuple,\n)\n\n\n# why it exists\nclass Pair(NamedTuple):\n    first: Any\n"
    )
    imports, body = imports_and_body(module)
    assert imports == ["import os", "from typing import Any, NamedTuple"]
    assert body == "# why it exists\nclass Pair(NamedTuple):\n    first: Any\n"
