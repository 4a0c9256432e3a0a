"""``upstream``: stock Lightning 2.6, its built-in ``dataloader_iter`` flavour, unmodified (the baseline).

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            loss = self.model(batch).mean()
            self.log("loss", loss, batch_size=len(batch))  # upstream needs batch_size=
            return loss

    trainer = DESIGNS["upstream"].trainer(max_epochs=1)
    trainer.fit(Model(), train_dataloaders=loader)

Lightning selects its ``_DataLoaderIterDataFetcher`` when the step has a parameter named ``dataloader_iter``.
Nothing here changes it: the conformance suite's expected failures for this entry are what Lightning 2.6
itself does.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from prototypes.common import Design


def _stock_trainer(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    return pl.Trainer(**trainer_kwargs)


DESIGN = Design(
    name="upstream",
    summary="stock Lightning 2.6: its built-in dataloader_iter flavour, unmodified (the baseline)",
    make_trainer=_stock_trainer,
)
