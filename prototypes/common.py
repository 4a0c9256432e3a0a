"""What the designs genuinely share: the registry entry type and the test for the flavour.

Designs import this module and nothing else from ``prototypes``; they never import each other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytorch_lightning as pl

DATALOADER_ITER = "dataloader_iter"


def takes_dataloader_iter(step: Callable[..., Any]) -> bool:
    """True when ``step`` declares a parameter named ``dataloader_iter`` (clause C1: selection by name)."""
    try:
        return DATALOADER_ITER in inspect.signature(step).parameters
    except (TypeError, ValueError):  # builtins and C callables have no inspectable signature
        return False


@dataclass(frozen=True)
class Design:
    """One registry entry: a name, a one-line summary, and how to build a configured Trainer.

    ``make_trainer(trainer_kwargs, **options)`` returns a ``pytorch_lightning.Trainer``; ``options`` are the
    design's own knobs (for example a prefetch depth). ``suite_variants`` lists extra option sets the
    conformance suite runs by default besides ``options``.
    """

    name: str
    summary: str
    make_trainer: Callable[..., pl.Trainer]
    options: Mapping[str, Any] = field(default_factory=dict)
    suite_variants: tuple[Mapping[str, Any], ...] = ()

    @property
    def id(self) -> str:
        """``name`` or ``name[key=value,...]``: how reports and ``--impl`` spell this entry."""
        if not self.options:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v!r}' for k, v in sorted(self.options.items()))}]"

    def trainer(self, **trainer_kwargs: Any) -> pl.Trainer:
        """A ``pytorch_lightning.Trainer`` built with ``trainer_kwargs`` and configured for this design."""
        return self.make_trainer(trainer_kwargs, **self.options)

    def variant(self, **options: Any) -> Design:
        """The same design with some options changed, e.g. ``IMPLEMENTATIONS["prefetcher"].variant(depth=4)``."""
        accepted = list(inspect.signature(self.make_trainer).parameters)[1:]
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise TypeError(
                f"design {self.name!r} has no option(s) {unknown}; its options are {accepted or 'none'}"
            )
        return replace(self, options={**self.options, **options})


def every_rank_has_a_batch(trainer: pl.Trainer, has_batch: bool) -> bool:
    """Whether *every* rank can start another step call: the ranks' vote on the end of data.

    Why: under DDP each step call ends in a gradient all-reduce. A rank whose shard ends early (an unevenly
    sharded IterableDataset) and stops would leave its peers blocked in that collective until the process-group
    timeout (the hang of HF Accelerate #2258). One all-reduce(MIN) of a one-element flag per step call makes all
    ranks stop at the same step call. Without a process group it returns ``has_batch`` unchanged.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or trainer.world_size == 1:
        return has_batch
    flag = torch.tensor([int(has_batch)], device=trainer.strategy.root_device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())
