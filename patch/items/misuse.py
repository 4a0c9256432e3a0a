"""[RFC 10] Misuse is refused with a message that names the fix."""

import json

from patch.edits import LightningSource, calls
from patch.items import Item
from patch.transplant import definition_source
from prototypes.common import DATALOADER_ITER, refuse_mixed_step_signature


def _refuse_misuse(source: LightningSource) -> None:
    utilities = source.module("loops.utilities")
    utilities.insert(
        definition_source(
            refuse_mixed_step_signature,
            name="_refuse_mixed_step_signature",
            constants={"DATALOADER_ITER": json.dumps(DATALOADER_ITER)},
        ),
        before="_select_data_fetcher",
    )
    # before Lightning's experimental-flavour warning, as the first thing the flavour's selection does
    utilities.insert_in_body(
        "_select_data_fetcher", "_refuse_mixed_step_signature(step_fx, step_fx_name)", before=calls("rank_zero_warn")
    )


ITEM = Item(
    10,
    "Misuse of the dataloader_iter flavour is refused with a message that names the fix",
    """
A step taking both a batch and `dataloader_iter`, such as `training_step(self, batch, dataloader_iter)`, was
selected for the flavour by its parameter name and then called with the iterator alone, failing with Python's
"missing 1 required positional argument", which names neither the conflict nor the fix. The selection now refuses it
with a TypeError that names both ways to write the step.
""",
    _refuse_misuse,
    part="the refusal of a step taking both a batch and the iterator",
)
