"""[RFC 13] ``trainer.estimated_stepping_batches`` documented for the flavour."""

from patch.edits import LightningSource
from patch.items import Item


def _document(source: LightningSource) -> None:
    source.module("trainer.trainer").extend_docstring(
        "Trainer.estimated_stepping_batches",
        """
        With ``training_step(self, dataloader_iter)`` the value is the regular flavour's (batches divided by
        ``accumulate_grad_batches``, times the epochs): exact when each step call takes one batch, an upper bound
        otherwise, since no loop can know before a step runs how many batches it takes.
        """,
        before_section="Raises:",
    )


ITEM = Item(
    13,
    "trainer.estimated_stepping_batches documented for the dataloader_iter flavour",
    """
`estimated_stepping_batches` counts batches, and a step that takes several batches per call steps the optimizer
fewer times: a schedule sized with it (such as `OneCycleLR`) would never reach its end. The docstring now says what
the value is for the flavour.
""",
    _document,
    changelog=(
        ("Changed", (
            "Documented what `Trainer.estimated_stepping_batches` is for a step taking `dataloader_iter`: "
            "exact when each call takes one batch, an upper bound otherwise"
        )),
    ),
)
