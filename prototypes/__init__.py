"""Competing designs for ``training_step(self, dataloader_iter)`` behind one registry.

``DESIGNS`` maps a design's name to its :class:`~prototypes.common.Design`; ``trainer(**kwargs)`` on an
entry returns a ``pytorch_lightning.Trainer`` configured for that design. Adding a design is one module in this
package that defines ``DESIGN`` plus one line in ``_DESIGN_MODULES``.
"""

from __future__ import annotations

import importlib

from prototypes.common import Design

_DESIGN_MODULES = (
    "prototypes.upstream",
    "prototypes.prefetcher",
    "prototypes.batch_processor",
    "prototypes.callback",
)

DESIGNS: dict[str, Design] = {
    design.name: design for design in (importlib.import_module(m).DESIGN for m in _DESIGN_MODULES)
}

__all__ = ["DESIGNS", "Design"]
