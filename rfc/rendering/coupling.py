"""Each design's coupling to Lightning's private API, computed from its source by ``prototypes.coupling``."""

from __future__ import annotations

from pathlib import Path

from prototypes import DESIGNS
from prototypes.coupling import KINDS, coupling_of, design_module
from rendering.markdown import code
from rendering.results import Inputs

TITLES = {
    "imported": "Imported private names",
    "overridden": "Private methods overridden (in a subclass or a mixin of a Lightning loop)",
    "accessed": "Private attributes read or written",
}


def coupling_block(design: str):
    """The block ``coupling-<design>``: the private Lightning names the design uses, those of the shared modules it
    imports apart from its own, by kind."""

    def block(inputs: Inputs, page_dir: Path) -> str:
        module = design_module(DESIGNS[design])
        found = coupling_of(module)
        split = (f": {len(found.shared.names)} through the shared modules it imports, {len(found.own.names)} of its own"
                 if found.names else "")
        text = [f"`{module}` uses **{len(found.names)}** private Lightning names{split} (read from the source by "
                "`python -m prototypes.coupling`)."]
        for where, coupling in (("Through the shared modules", found.shared), (f"Of `{module}` itself", found.own)):
            if not coupling.names:
                continue
            lines = [f"{where}:", ""]
            for kind in KINDS:
                names = getattr(coupling, kind)
                lines.append(f"- *{TITLES[kind]}* ({len(names)}): " + (", ".join(code(n) for n in names) or "none"))
            text.append("\n".join(lines))
        return "\n\n".join(text)

    return block


def private_names_used(design: str) -> str:
    """The comparison's coupling column: how many private Lightning names a registered design uses, and how many of
    them through the shared modules."""
    found = coupling_of(design_module(DESIGNS[design]))
    return f"{len(found.names)} ({len(found.shared.names)} shared)" if found.shared.names else str(len(found.names))


COUPLING_BLOCKS = {f"coupling-{name}": coupling_block(name) for name in DESIGNS}
