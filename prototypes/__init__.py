"""Competing designs for ``training_step(self, dataloader_iter)`` behind one registry.

``DESIGNS`` maps a design's name to its :class:`~prototypes.common.Design`; ``trainer(**kwargs)`` on an
entry returns a ``pytorch_lightning.Trainer`` configured for that design. Adding a design is one module in this
package that defines ``DESIGN`` plus one line in ``_DESIGN_MODULES``. ``runnable_designs()`` leaves out those this
environment cannot run (``Design.unavailable_reason``: ``patched`` needs the patched Lightning installed).
"""

from __future__ import annotations

import importlib

from prototypes.common import Design

_DESIGN_MODULES = (
    "prototypes.upstream",
    "prototypes.prefetcher",
    "prototypes.batch_processor",
    "prototypes.callback",
    "prototypes.patched",
)

DESIGNS: dict[str, Design] = {
    design.name: design for design in (importlib.import_module(m).DESIGN for m in _DESIGN_MODULES)
}


# The design the RFC recommends: the stack of pull requests to Lightning, run as a plain Trainer of the patched
# Lightning. The prototypes are the comparison it was chosen from.
RECOMMENDED = "patched"


def runnable_designs() -> dict[str, Design]:
    """The registered designs this environment can run, by name."""
    return {name: design for name, design in DESIGNS.items() if design.unavailable_reason() is None}


__all__ = ["DESIGNS", "RECOMMENDED", "Design", "runnable_designs"]
