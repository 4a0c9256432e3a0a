"""The RFC's list "What Lightning has to change", item by item, as edits to Lightning's source (``patch.edits``).

``ITEMS`` is in the RFC's order; ``python -m patch.series`` makes one commit, and so one patch, of each.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patch.edits import LightningSource, ModuleSource

ISSUES = "https://github.com/Lightning-AI/pytorch-lightning/issues/"


def issue(number: int) -> str:
    """A link to one of Lightning's issues, as its CHANGELOG writes one."""
    return f"[#{number}]({ISSUES}{number})"


# the items' tests, at the paths they take under Lightning's tests/tests_pytorch
TESTS_HERE = Path(__file__).resolve().parent.parent / "tests_pytorch"


@dataclass(frozen=True)
class UpdatedTest:
    """One of Lightning's tests that asserts what an item changes: ``test`` in ``module`` (a path under
    ``tests/tests_pytorch``), ``why`` its assertion changes (the commit message says it), and ``edit``, which updates
    it in that module's source (as ``apply_edits`` edits Lightning's package)."""

    module: str
    test: str
    why: str
    edit: Callable[[ModuleSource], None]


@dataclass(frozen=True)
class Item:
    """One item of the RFC's change list: its number, its title (the patch's subject) and the edits that make it.

    ``why`` is the commit message's body: what the change does for the flavour and what a user of today's flavour
    notices. ``apply_edits`` is None for an item whose change is not in Lightning's code; ``why`` then says so.
    ``part`` names what the patch makes when it makes only part of the item (the RFC's list says so beside it).
    ``changelog``: the item's entries in Lightning's ``CHANGELOG.md``, each ``(section, entry)`` (``"Added"``,
    ``"Changed"``, ``"Fixed"``), what a user reads in the release notes. ``tests``: the test modules the item adds to
    Lightning's ``tests/tests_pytorch`` (paths under it), written here in ``patch/tests_pytorch/`` at the same paths;
    they go where Lightning's tests are, so into the stack made on Lightning's repository (the sdist has none), as do
    ``updated_tests``, Lightning's own tests that assert what the item changes, updated in the item's commit.
    ``docs``: sections of Lightning's documentation, each ``(page, text)``, a page under ``docs/source-pytorch`` and
    the reStructuredText appended to it (the first creates it); like the tests, only a repository has them."""

    number: int
    title: str
    why: str
    apply_edits: Callable[[LightningSource], None] | None = None
    part: str = ""
    changelog: tuple[tuple[str, str], ...] = ()
    tests: tuple[str, ...] = ()
    updated_tests: tuple[UpdatedTest, ...] = ()
    docs: tuple[tuple[str, str], ...] = ()

    def apply(self, source: LightningSource, tests_root: Path | None = None) -> None:
        """The item's edits and CHANGELOG entries; its tests and its updates of Lightning's tests too where
        ``tests_root`` (the tree's ``tests/tests_pytorch``) is given."""
        if self.apply_edits is not None:
            self.apply_edits(source)
        for section, entry in self.changelog:
            source.add_changelog_entry(section, entry)
        for test in self.tests if tests_root is not None else ():
            (tests_root / test).parent.mkdir(parents=True, exist_ok=True)
            (tests_root / test).write_text((TESTS_HERE / test).read_text())
        for updated in self.updated_tests if tests_root is not None else ():
            dotted = updated.module.removesuffix(".py").replace("/", ".")
            updated.edit(ModuleSource(tests_root / updated.module, f"tests_pytorch.{dotted}"))
        for page, text in self.docs if tests_root is not None else ():
            path = tests_root.parent.parent / "docs" / "source-pytorch" / page
            path.parent.mkdir(parents=True, exist_ok=True)
            before = path.read_text() + "\n" if path.exists() else ""
            path.write_text(before + textwrap.dedent(text).strip("\n") + "\n")

    def body(self) -> str:
        """What a commit of this item says below its subject: ``why``, then the Lightning tests it updates and why."""
        if not self.updated_tests:
            return self.why.strip()
        updates = "\n".join(
            textwrap.fill(f"- `{u.module}::{u.test}`: {u.why}", width=120, subsequent_indent="  ")
            for u in self.updated_tests
        )
        return (f"{self.why.strip()}\n\nIn Lightning's repository this also updates the tests that asserted the old"
                f" behaviour:\n{updates}")

    def commit_message(self) -> str:
        return f"[RFC {self.number}] {self.title}\n\n{self.body()}\n"



def _items() -> tuple[Item, ...]:
    # Why imported here: each item module imports `Item` from this package
    from patch.items import callbacks, draining, evaluation, look_ahead, lr_finder, ranks

    return tuple(module.ITEM for module in (look_ahead, evaluation, ranks, draining, callbacks, lr_finder))


ITEMS: tuple[Item, ...] = _items()
