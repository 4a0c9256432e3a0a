"""One defect of the catalogue: a design with one attribute replaced, and the tests that must catch it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from prototypes import DESIGNS
from prototypes.common import Design


@dataclass(frozen=True)
class Defect:
    """One realistic defect: ``broken(original)`` replaces ``patches = (owner, attribute)`` of ``design``."""

    name: str
    clause: str
    design: str
    what: str  # what the broken design does, in a maintainer's words
    patches: tuple[Any, str]
    broken: Callable[[Any], Any]
    tests: tuple[str, ...]  # ``<file>::<test function>`` in tests/conformance
    select: str = ""  # a -k expression narrowing the parametrized cases
    options: Mapping[str, Any] = field(default_factory=dict)  # design options, e.g. a prefetch depth

    @property
    def design_name(self) -> str:
        return f"defect_{self.name}"

    @contextlib.contextmanager
    def applied(self) -> Iterator[Design]:
        """The broken design, registered as ``defect_<name>`` and patched until the block ends."""
        base = DESIGNS[self.design].variant(**self.options)
        design = Design(
            name=self.design_name,
            summary=f"{base.id} that {self.what}",
            make_trainer=base.make_trainer,
            options=base.options,
        )
        owner, attribute = self.patches
        DESIGNS[design.name] = design
        try:
            with mock.patch.object(owner, attribute, self.broken(getattr(owner, attribute))):
                yield design
        finally:
            del DESIGNS[design.name]
