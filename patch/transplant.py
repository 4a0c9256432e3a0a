"""Code written in the prototypes, carried into Lightning's modules: one definition, written once, in both places.

Where a piece of the recommended design needs nothing of the loops it lives in (a check, a rule, a message), the
prototype's own definition is what the patch inserts: read from its module with ``inspect``, renamed to Lightning's
private spelling, with the prototype's module-level constants spelled out and its references to the suite's clauses
left behind (Lightning's readers do not have the suite), so that the suite's verdict on the
prototype is a verdict on the patch's code too.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any


def definition_source(obj: Callable[..., Any] | type, *, name: str, constants: Mapping[str, str] = {}) -> str:
    """The source of ``obj``'s definition, dedented, renamed ``name``, each constant replaced by its literal."""
    source = textwrap.dedent(inspect.getsource(obj))
    source = re.sub(rf"^(\s*(?:def|class)\s+){re.escape(obj.__name__)}\b", rf"\g<1>{name}", source, count=1, flags=re.M)
    for constant, literal in constants.items():
        source = re.sub(rf"\b{re.escape(constant)}\b", literal, source)
    return re.sub(r" \((?:clause )?C\d+[^)]*\)", "", source)
