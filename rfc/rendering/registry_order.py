"""The order every rendered page lists designs in: the registry's, as the terminal shows them.

Designs come in ``prototypes.DESIGNS`` order; within a design, what it ships (its ``options``) first, then its
``Design.suite_variants`` in order, then any other variant a results file holds (another prefetch depth) in natural
order. A benchmark entry that adds to a variant (``prefetcher[depth='auto']+workers``) follows that variant, and a
name the registry does not know (a design from outside this repository) follows every registered design.
"""

from __future__ import annotations

import re
from typing import Any

from prototypes import DESIGNS


def natural_key(text: str) -> list[Any]:
    """``name[depth=2]`` before ``name[depth=10]``."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", text)]


def _registered_variants(name: str) -> list[str]:
    design = DESIGNS[name]
    return [design.id, *(design.variant(**options).id for options in design.suite_variants)]


def registry_key(label: str) -> tuple[Any, ...]:
    """Sort key of a design, a variant id or a benchmark entry of a design in the registry's order."""
    variant, plus, addition = label.partition("+")
    name = variant.split("[", 1)[0]
    if name not in DESIGNS:
        return (len(DESIGNS), natural_key(label))
    registered = _registered_variants(name)
    rank = registered.index(variant) if variant in registered else len(registered)
    return (list(DESIGNS).index(name), rank, natural_key(variant), plus, natural_key(addition))


def in_registry_order(labels: list[str]) -> list[str]:
    return sorted(labels, key=registry_key)
