"""[RFC 13] ``trainer.estimated_stepping_batches`` documented for the flavour."""

from patch.edits import LightningSource
from patch.items import Item


def _document(source: LightningSource) -> None:
    source.module("trainer.trainer").extend_docstring(
        "Trainer.estimated_stepping_batches",
        """
        With ``training_step(self, dataloader_iter)`` the value is the regular flavour's (batches divided by
        ``accumulate_grad_batches``, times the epochs): exact when each step call takes one batch, an upper bound
        otherwise, since no loop can know before a step runs how many batches it takes. A step taking ``k`` batches
        per call makes ``ceil(batches / k)`` calls per epoch when its last call trains the batches left (sized with
        ``dataloader_iter.has_batches(k)``), ``batches // k`` when that call is cut short; a schedule such as
        ``OneCycleLR`` is sized with those calls divided by ``accumulate_grad_batches`` (rounded up), times the
        epochs. Dividing this estimate by ``k`` falls short whenever ``k`` does not divide an epoch.
        """,
        before_section="Raises:",
    )


ITEM = Item(
    13,
    "trainer.estimated_stepping_batches documented for the dataloader_iter flavour",
    """
`estimated_stepping_batches` counts batches, and a step that takes several batches per call steps the optimizer
fewer times: a schedule sized with it (such as `OneCycleLR`) would never reach its end. The docstring now says what
the value is for the flavour, and how such a step counts the optimizer steps a schedule is sized with.
""",
    _document,
    changelog=(
        ("Changed", (
            "Documented what `Trainer.estimated_stepping_batches` is for a step taking `dataloader_iter`: "
            "exact when each call takes one batch, an upper bound otherwise"
        )),
    ),
)
