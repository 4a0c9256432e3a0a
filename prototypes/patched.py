"""``patched``: pytorch-lightning 2.6.6 with the RFC's change list written into its own classes (``patch/``).

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            loss = self.model(batch).mean()
            self.log("loss", loss)
            return loss

    trainer = DESIGNS["patched"].trainer(max_epochs=1)  # a plain pytorch_lightning.Trainer
    trainer.fit(Model(), train_dataloaders=loader)

Nothing here changes Lightning: the change is in the installed package, built by ``python -m patch.environment``
from the series ``python -m patch.series`` generates. That package carries a marker module,
``pytorch_lightning._rfc_patch_series``, naming the series (a hash of its patches) and the ``patch/`` sources it was
generated from; this entry runs only where the marker is installed and those sources are this checkout's.
Elsewhere the default selections leave it out and naming it is an error naming the command that builds the
environment: a stock package under this name would report stock Lightning's behaviour as the patch's.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytorch_lightning as pl

from prototypes.common import Design

# The module the environment's patched package carries beside its own, written by ``patch.series``.
SERIES_MODULE = "_rfc_patch_series"
BUILD_COMMAND = "python -m patch.environment --venv PATH"
PATCH_DIR = Path(__file__).resolve().parent.parent / "patch"


# The modules of patch/ that, with its items, decide the patched package: the edit engine and its statement
# predicates, the series writer, the stack's grouping, its pull requests' descriptions and the migration rows they
# carry.
SERIES_MODULES = ("edits", "statements", "series", "stack", "descriptions", "migration")


def patch_sources(patch_dir: Path = PATCH_DIR) -> list[Path]:
    """The sources that decide the patched package: ``SERIES_MODULES`` and the items (the code written into Lightning
    is theirs alone)."""
    return sorted([*(patch_dir / f"{name}.py" for name in SERIES_MODULES), *(patch_dir / "items").rglob("*.py")])


def patch_sources_digest(patch_dir: Path = PATCH_DIR) -> str | None:
    """A hash of ``patch_sources``; None where they are absent (this package installed without its checkout)."""
    sources = patch_sources(patch_dir)
    if not all(path.is_file() for path in sources):
        return None
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.relative_to(patch_dir.parent).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def installed_series() -> ModuleType | None:
    """The installed package's series marker; None for a stock pytorch_lightning."""
    try:
        return importlib.import_module(f"pytorch_lightning.{SERIES_MODULE}")
    except ModuleNotFoundError:
        return None


def unavailable_reason() -> str | None:
    marker = installed_series()
    if marker is None:
        return (f"design 'patched' needs the patched pytorch_lightning, but {Path(pl.__file__).parent} is stock: "
                f"build its environment with `{BUILD_COMMAND}` and run with that environment's python")
    current = patch_sources_digest()
    if current is not None and marker.SOURCES != current:
        return (f"design 'patched': the patched pytorch_lightning at {Path(pl.__file__).parent} was built from other "
                f"patch/ sources than this checkout's; rebuild it with `{BUILD_COMMAND}`")
    return None


def _patched_trainer(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    return pl.Trainer(**trainer_kwargs)  # what ships: a plain Trainer, the patched package's defaults


DESIGN = Design(
    name="patched",
    summary="pytorch-lightning 2.6.6 with the RFC's patch series applied: a plain Trainer of the patched package",
    make_trainer=_patched_trainer,
    # Why no thread options: the series has no prefetch thread
    changes_lightning_loops=True,
    unavailable_reason=unavailable_reason,
)
