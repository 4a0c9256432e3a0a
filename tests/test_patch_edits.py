"""``patch.edits``: each operation on a small module laid out as a Lightning package, and the errors naming a place
that is not there."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from patch.edits import LICENSE_HEADER, LightningSource, ModuleSource, PlaceNotFound
from patch.statements import asserts, asserts_exactly, assigns, calls

MODULE = textwrap.dedent('''\
    """A loop."""

    import os


    def helper():
        return 1


    class Loop:
        """Runs."""

        def run(self):
            self.done = False
            batch = self.fetch()
            self.advance(batch)
            return self.done

        @property
        def size(self):
            return 1

        @size.setter
        def size(self, value):
            pass

        def only_doc(self):
            """Nothing yet."""
    ''')


@pytest.fixture
def source(tmp_path: Path) -> LightningSource:
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "loop.py").write_text(MODULE)
    return LightningSource(tmp_path, "pkg")


@pytest.fixture
def module(source: LightningSource) -> ModuleSource:
    return source.module("loops.loop")


def test_a_module_is_addressed_by_its_dotted_name_and_a_missing_one_is_named(source):
    assert source.module("loops.loop").name == "pkg.loops.loop"
    with pytest.raises(PlaceNotFound, match=r"pkg\.loops\.fetchers: no module at .*loops/fetchers\.py"):
        source.module("loops.fetchers")


def test_add_module_writes_a_new_module_and_refuses_an_existing_one(source):
    source.add_module("loops.extra", "X = 1\n")
    assert source.module("loops.extra").path.read_text() == LICENSE_HEADER + "X = 1\n"  # as every module of Lightning
    with pytest.raises(FileExistsError, match=r"pkg\.loops\.loop exists already; edit it instead"):
        source.add_module("loops.loop", "Y = 2\n")


def test_a_definition_is_found_by_qualified_name_the_last_of_a_name_winning(module):
    assert module.definition("Loop.run").name == "run"
    setter = module.definition("Loop.size")
    assert [ast_name.attr for ast_name in setter.decorator_list] == ["setter"]
    with pytest.raises(PlaceNotFound, match=re.escape("pkg.loops.loop: no definition 'Loop.missing'")):
        module.definition("Loop.missing")


def test_a_statement_must_match_exactly_once(module):
    assert module.statement("Loop.run", assigns("batch")).lineno == 15
    with pytest.raises(PlaceNotFound, match=re.escape("0 statements of 'Loop.run' match, expected one")):
        module.statement("Loop.run", assigns("self.missing"))
    with pytest.raises(PlaceNotFound, match=re.escape("2 statements of 'Loop.run' match, expected one")):
        module.statement("Loop.run", lambda node: type(node).__name__ == "Assign")


def test_predicates_name_statements_by_structure(module):
    assert module.statement("Loop.run", assigns("self.done")).lineno == 14
    assert module.statement("Loop.run", calls("self.advance")).lineno == 16
    assert module.statement("Loop.run", calls("self.fetch")).lineno == 15  # the call is the assignment's value


def test_replace_swaps_a_whole_definition_with_its_decorators(module):
    module.replace("Loop.size", "def size(self, value):\n    self.value = value\n")
    text = module.path.read_text()
    assert "@size.setter" not in text and "    def size(self, value):\n        self.value = value\n" in text
    assert "@property" in text  # the getter, a definition of its own, stays


def test_remove_drops_a_definition_and_the_blank_lines_that_separated_it(module):
    module.remove("helper")
    module.remove("Loop.run")
    text = module.path.read_text()
    assert "import os\n\n\nclass Loop:" in text
    assert '    """Runs."""\n\n    @property\n' in text


def test_insert_places_definitions_after_before_into_and_at_the_end(module):
    module.insert("def after_helper():\n    pass\n", after="helper")
    module.insert("def before_run(self):\n    pass\n", before="Loop.run")
    module.insert("def last_method(self):\n    pass\n", into="Loop")
    module.insert("END = True\n")
    text = module.path.read_text()
    assert "    return 1\n\n\ndef after_helper():\n    pass\n\n\nclass Loop:" in text
    assert '    """Runs."""\n\n    def before_run(self):\n        pass\n\n    def run(self):' in text
    assert '        """Nothing yet."""\n\n    def last_method(self):\n        pass\n' in text
    assert text.endswith("        pass\n\n\nEND = True\n")


def test_insert_in_body_goes_first_after_the_docstring_or_around_a_statement(module):
    module.insert_in_body("Loop.run", "started = True", at_start=True)
    module.insert_in_body("Loop.only_doc", "return None", at_start=True)
    module.insert_in_body("Loop.run", "self.before()", before=calls("self.advance"))
    module.insert_in_body("Loop.run", "self.after()", after=calls("self.advance"))
    text = module.path.read_text()
    assert "    def run(self):\n        started = True\n        self.done = False\n" in text
    assert "self.fetch()\n        self.before()\n        self.advance(batch)\n        self.after()\n" in text
    assert '        """Nothing yet."""\n        return None\n' in text


def test_replace_statement_and_add_import(module):
    module.replace_statement("Loop.run", assigns("batch"), "batch = next(self.iterator)")
    module.add_import("import sys")
    text = module.path.read_text()
    assert "        batch = next(self.iterator)\n" in text and "self.fetch()" not in text
    assert "import os\nimport sys\n" in text


TEST_MODULE = textwrap.dedent('''\
    def test_counts(tmp_path):
        model = fit(tmp_path)
        # the count of step calls
        # (one per batch)
        assert model.calls == 4
        assert model.batches == 4
        if model.slow:
            model.wait()
        assert model.record["training"]["raised"] == 0
        assert model.record["validation"]["raised"] == 0
''')


@pytest.fixture
def test_module(tmp_path: Path) -> ModuleSource:
    (tmp_path / "test_counts.py").write_text(TEST_MODULE)
    return ModuleSource(tmp_path / "test_counts.py", "tests.test_counts")


def test_an_assert_is_named_by_what_it_reads_and_replaced_with_the_comments_above_it(test_module):
    assert test_module.statement("test_counts", asserts("model.batches")).lineno == 6
    test_module.replace_statement("test_counts", asserts("model.calls"), "assert model.calls == 5  # a drain call",
                                  comments_above=True)
    text = test_module.path.read_text()
    assert "    model = fit(tmp_path)\n    assert model.calls == 5  # a drain call\n    assert model.batches" in text


def test_an_assert_is_named_exactly_where_several_read_the_same_name(test_module):
    with pytest.raises(PlaceNotFound):
        test_module.statement("test_counts", asserts("model.record"))  # both record asserts read it
    exactly = asserts_exactly("model.record['validation']['raised'] == 0")
    assert test_module.statement("test_counts", exactly).lineno == 10


def test_remove_statement_drops_the_one_statement_that_matches(test_module):
    test_module.remove_statement("test_counts", lambda node: type(node).__name__ == "If")
    assert "slow" not in test_module.path.read_text() and "wait" not in test_module.path.read_text()


def test_substitute_rewrites_each_line_of_a_definition_and_refuses_a_pattern_matching_nothing(test_module):
    test_module.substitute("test_counts", r'\["(training|validation)"\]\["raised"\] == 0$',
                           lambda found: f'["{found[1]}"]["raised"] == drains("{found[1]}")')
    text = test_module.path.read_text()
    assert '["training"]["raised"] == drains("training")\n' in text
    assert '["validation"]["raised"] == drains("validation")\n' in text
    with pytest.raises(PlaceNotFound, match=re.escape("nothing in 'test_counts' matches")):
        test_module.substitute("test_counts", r"never there", "")


def test_an_edit_that_leaves_the_module_unparsable_is_an_error(module):
    with pytest.raises(SyntaxError):
        module.replace("helper", "def helper(:\n    pass\n")


def test_extend_docstring_opens_a_one_line_docstring(module):
    module.extend_docstring("Loop.only_doc", "A second paragraph.")
    assert '        """Nothing yet.\n\n        A second paragraph.\n        """\n' in module.path.read_text()


def test_what_does_not_fit_lightnings_line_length_is_wrapped_as_its_formatter_wraps_it(module):
    names = ", ".join(f"name_{i:02}" for i in range(20))
    module.add_import(f"from pkg.loops.somewhere import {names}")
    parameters = ("progress: Optional[dict] = None, drain_dataloader: Optional[Callable[[int], None]] = None,"
                  " depth: int = 0, ahead=False")
    module.add_parameters("Loop.run", parameters)
    text = module.path.read_text()
    assert "from pkg.loops.somewhere import (\n    name_00,\n    name_01,\n" in text and "    name_19,\n)\n" in text
    assert ("    def run(\n        self,\n        progress: Optional[dict] = None,\n"
            "        drain_dataloader: Optional[Callable[[int], None]] = None,\n        depth: int = 0,\n"
            "        ahead=False,\n    ):\n") in text
    assert max(map(len, text.splitlines())) <= 120


CHANGELOG = """# Changelog

---

## [unreleased] - YYYY-MM-DD

### Added

-

### Fixed

- Fixed an older thing

---

## [1.0.0] - 2020-01-01

### Added

- Added the first thing
"""


def test_a_changelog_entry_goes_into_the_unreleased_release_placeholder_first(source):
    path = source.root / "CHANGELOG.md"
    path.write_text(CHANGELOG)
    source.add_changelog_entry("Added", "Added `has_batches(k)`,\n  over two lines")
    source.add_changelog_entry("Added", "Added another")
    source.add_changelog_entry("Fixed", "Fixed a new thing")
    text = path.read_text()
    assert "### Added\n\n- Added `has_batches(k)`, over two lines\n\n- Added another\n\n### Fixed" in text
    assert "- Fixed an older thing\n\n- Fixed a new thing\n\n---" in text
    assert text.endswith("### Added\n\n- Added the first thing\n")  # a released version is never touched
    with pytest.raises(PlaceNotFound, match="no '### Removed' section"):
        source.add_changelog_entry("Removed", "Removed nothing")
