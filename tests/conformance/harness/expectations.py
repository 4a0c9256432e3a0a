"""What a run must have done, and the assertions that say where it did not: the split into step calls, a plain
PyTorch reference loop's weights, batch sequences, error and warning texts."""

from __future__ import annotations

import itertools
import re
import warnings
from collections.abc import Sequence

import torch

from tests.conformance.harness.data import FEATURES, LR, item
from tests.conformance.harness.modules import RecordingModule


def split_by_pattern(sequence: Sequence, pattern: Sequence[int]) -> list[list]:
    """How a step following ``pattern`` must split ``sequence`` into step calls (the last one may be short)."""
    groups, position = [], 0
    for k in itertools.count():
        if position >= len(sequence):
            return groups
        take = pattern[k % len(pattern)]
        groups.append(list(sequence[position : position + take]))
        position += take
    raise AssertionError("unreachable")


def reference_weights(
    module: RecordingModule,
    steps: Sequence[Sequence[int]],
    *,
    complete: Sequence[bool],
    accumulate: int = 1,
    clip_norm: float | None = None,
) -> dict[str, torch.Tensor]:
    """Final weights of a plain PyTorch loop over the same batches, grouped into step calls.

    ``steps[k]`` lists the batches (as item-id tuples) step call k used; ``complete[k]`` is False for a step cut short
    by StopIteration (no backward, no optimizer step). The optimizer steps after every ``accumulate`` completed step
    calls and after the last completed call of the epoch, dividing the loss by ``accumulate`` as Lightning does.
    """
    layer = torch.nn.Linear(FEATURES, 1)
    layer.load_state_dict(module.initial_state)
    optimizer = torch.optim.SGD(layer.parameters(), lr=LR)
    finished = [k for k, ok in enumerate(complete) if ok]
    for position, k in enumerate(finished):
        if steps[k]:  # a call that consumed nothing returns no loss, but still counts towards the window
            batches = [collate_items([item(i) for i in batch_ids]) for batch_ids in steps[k]]
            loss = torch.stack([torch.nn.functional.mse_loss(layer(x), y) for _, x, y in batches]).mean()
            (loss / accumulate).backward()
        if (position + 1) % accumulate == 0 or position == len(finished) - 1:
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(layer.parameters(), clip_norm)
            optimizer.step()
            optimizer.zero_grad()
    return layer.state_dict()


def collate_items(items):
    """Items collated as a DataLoader does: ``(ids, x, y)`` tensors, for a reference loop over the same batches."""
    index, x, y = zip(*items, strict=True)
    return torch.tensor(index), torch.stack(x), torch.stack(y)


def assert_same_batches(actual: Sequence, expected: Sequence, what: str = "batches received") -> None:
    """Equality with a message that names the first batch that went wrong."""
    if list(actual) == list(expected):
        return
    for position, (a, e) in enumerate(zip(actual, expected, strict=False)):
        if a != e:
            raise AssertionError(
                f"{what}: position {position} got batch {a}, expected {e}\n  got:      {list(actual)}\n"
                f"  expected: {list(expected)}"
            )
    raise AssertionError(
        f"{what}: got {len(actual)} batches, expected {len(expected)}\n  got:      {list(actual)}\n"
        f"  expected: {list(expected)}"
    )


def error_chain_text(error: BaseException) -> str:
    """The error's text with its causes' (a design may wrap the user-facing message)."""
    parts = []
    while error is not None and len(parts) < 5:
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n  caused by ".join(parts)


def assert_names_the_fix(message: str, *patterns: str, what: str) -> None:
    missing = [p for p in patterns if not re.search(p, message, re.IGNORECASE)]
    assert not missing, f"{what}: the error does not name the fix (no match for {missing}):\n  {message}"


def warning_texts(run) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught]


CUT_SHORT_WARNING = "CutShortCallWarning"


def cut_short_reports(run) -> tuple[list[str], object]:
    """The texts of the ``CutShortCallWarning`` s that ``run()`` emitted, and what it returned. By the class's name:
    each design defines the class its users filter (the prototypes in ``prototypes.batches_per_call``, the patched
    Lightning in its own package)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = run()
    return [str(w.message) for w in caught if w.category.__name__ == CUT_SHORT_WARNING], returned
