"""The Trainers the suite runs: a design's, or stock Lightning's, with the quiet defaults every test shares."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from torch.utils.data import DataLoader

from harness_common import QUIET
from prototypes.common import Design


def make_trainer(design: Design, **overrides: Any) -> pl.Trainer:
    """``design.trainer(...)`` with quiet defaults; tests override what they are about."""
    return design.trainer(**{**QUIET, **overrides})


def stock_trainer(**overrides: Any) -> pl.Trainer:
    return pl.Trainer(**{**QUIET, **overrides})


def fit(design: Design, module: pl.LightningModule, loader: DataLoader, val_loader: DataLoader | None = None,
        **overrides: Any) -> pl.Trainer:
    """Fit ``module`` through ``design`` and return the trainer for inspection."""
    trainer = make_trainer(design, **overrides)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val_loader)
    return trainer
