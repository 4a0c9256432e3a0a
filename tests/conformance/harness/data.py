"""The suite's data: self-identifying items, the datasets and loaders built from them, and reading batches back.

Every item carries its own index, so every batch can be named by the item ids it holds (``ids(batch)``) and a
failure message says which batch went wrong.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate, get_worker_info

FEATURES = 4
BATCH_SIZE = 2
LR = 0.1


def item(i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
    """Item ``i``: its id, 4 features and a target, all a function of ``i`` so any process can rebuild it."""
    # float32 explicitly: under precision="64-true" Lightning makes float64 the default dtype during fit, and
    # converting the input is the design's job (C4), not the dataset's.
    x = torch.tensor([math.sin(i), math.cos(i), (i % 7) / 7.0, 1.0], dtype=torch.float32)
    return i, x, x.sum(0, keepdim=True) * 0.5


class SizedItems(Dataset):
    """Map-style dataset of ``n`` self-identifying items."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return item(i)


class UnsizedItems(IterableDataset):
    """Iterable dataset without ``__len__``; with workers, worker k yields items k, k+W, k+2W, ..."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return (item(i) for i in range(start, self.n, step))


class DatasetBroke(Exception):
    """Raised by :class:`FailingItems`; a type of its own, so the suite can tell it reached the caller unchanged."""


class FailingItems(SizedItems):
    """Sized items whose item ``fail_at`` raises ``error`` (a DatasetBroke by default) when loaded."""

    def __init__(self, n: int, fail_at: int, error: type[BaseException] = DatasetBroke) -> None:
        super().__init__(n)
        self.fail_at, self.error = fail_at, error

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise self.error(f"item {i} cannot be loaded")
        return item(i)


class SlowItems(SizedItems):
    """Sized items; from item ``slow_from`` on, each takes ``delay_s`` to load (a loader still busy when a run ends)."""

    def __init__(self, n: int, slow_from: int, delay_s: float) -> None:
        super().__init__(n)
        self.slow_from, self.delay_s = slow_from, delay_s

    def __getitem__(self, i: int):
        if i >= self.slow_from:
            time.sleep(self.delay_s)
        return item(i)


class ListedBatches(Sampler):
    """A batch sampler whose batches hold ``sizes[k]`` consecutive items: batches of different sizes."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for size in self.sizes:
            yield list(range(start, start + size))
            start += size

    def __len__(self) -> int:
        return len(self.sizes)


class UnsizedBatches(IterableDataset):
    """Yields collated batches of ``sizes[k]`` consecutive items, without ``__len__`` (load with
    ``batch_size=None``)."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)

    def __iter__(self) -> Iterator:
        return (default_collate([item(i) for i in batch]) for batch in ListedBatches(self.sizes))


def uneven_loader(kind: str, sizes: Sequence[int]) -> DataLoader:
    """A real DataLoader whose batch k holds ``sizes[k]`` items; ``kind`` is ``"sized"`` or ``"unsized"``."""
    if kind == "sized":
        return DataLoader(SizedItems(sum(sizes)), batch_sampler=ListedBatches(sizes))
    return DataLoader(UnsizedBatches(sizes), batch_size=None)


def make_loader(
    kind: str = "sized", n_items: int = 14, num_workers: int = 0, batch_size: int = BATCH_SIZE
) -> DataLoader:
    """A real DataLoader over ``n_items`` items; ``kind`` is ``"sized"`` or ``"unsized"``."""
    dataset = {"sized": SizedItems, "unsized": UnsizedItems}[kind](n_items)
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)


def ids(batch: Any) -> tuple[int, ...]:
    """The item ids a batch holds (a collated ``[ids, x, y]`` list, possibly wrapped by the transfer hooks)."""
    if isinstance(batch, dict):
        batch = batch["batch"]
    return tuple(int(i) for i in batch[0].tolist())


def loader_sequence(loader: DataLoader) -> list[tuple[int, ...]]:
    """The loader's own sequence of batches, read directly: what every design must hand out, in order."""
    return [ids(b) for b in loader]


def ids_or_none(batch: Any) -> tuple[int, ...] | None:
    try:
        return ids(batch)
    except (TypeError, IndexError, KeyError, AttributeError):
        return None


# (kind, num_workers) for the loaders a clause must hold for
LOADER_CASES = [
    pytest.param("sized", 0, id="sized-w0"),
    pytest.param("sized", 2, id="sized-w2"),
    pytest.param("unsized", 0, id="unsized-w0"),
    pytest.param("unsized", 2, id="unsized-w2"),
]
KINDS = ["sized", "unsized"]
