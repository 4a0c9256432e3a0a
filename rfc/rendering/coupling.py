"""Each design's coupling to Lightning's private API, computed from its source by ``prototypes.coupling``."""

from __future__ import annotations

from pathlib import Path

from prototypes import IMPLEMENTATIONS
from prototypes.coupling import coupling_of, design_module
from rendering.markdown import code
from rendering.results import Inputs

KINDS = (
    ("imported", "Imported private names"),
    ("overridden", "Private methods overridden (in a subclass or a mixin of a Lightning loop)"),
    ("accessed", "Private attributes read or written"),
)


def coupling_block(design: str):
    """The block ``coupling-<design>``: the private Lightning names the design (and the shared modules it imports)
    uses, by kind."""

    def block(inputs: Inputs, page_dir: Path) -> str:
        module = design_module(IMPLEMENTATIONS[design])
        found = coupling_of(module)
        lines = [f"`{module}` and the shared modules it imports use **{len(found.names)}** private Lightning names "
                 "(read from the source by `python -m prototypes.coupling`)."]
        for kind, title in KINDS:
            names = getattr(found, kind)
            lines.append(f"- *{title}* ({len(names)}): " + (", ".join(code(n) for n in names) or "none"))
        return "\n\n".join(lines[:1]) + "\n\n" + "\n".join(lines[1:])

    return block


def private_names_used(design: str) -> int:
    """How many private Lightning names a registered design uses: the comparison's coupling column."""
    return len(coupling_of(design_module(IMPLEMENTATIONS[design])).names)


COUPLING_BLOCKS = {f"coupling-{name}": coupling_block(name) for name in IMPLEMENTATIONS}
