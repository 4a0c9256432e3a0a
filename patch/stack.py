"""The patch series as the stack of pull requests a maintainer would merge, in order: each pull request a few
commits, each commit one or more items of the RFC's change list (``patch.items``), and a description per pull request.

Why items are grouped into commits: an item that needs another to run (item 1 counts what item 2's fetcher hands out,
and that fetcher counts through item 1's progress) is one commit with it, and an item with no code of its own (its
CHANGELOG entry only) goes into the commit whose code makes it, so that every commit of the stack runs on its own and
none is empty (``python -m patch.prefixes`` smoke-runs each).
"""

from __future__ import annotations

from dataclasses import dataclass

from patch.items import ITEMS, Item


@dataclass(frozen=True)
class Commit:
    """One commit of the stack: the items it makes, applied in the order given. ``subject`` is its message's first
    line; by default the title of its one item."""

    items: tuple[int, ...]
    subject: str = ""


@dataclass(frozen=True)
class PullRequest:
    """One pull request of the stack. ``why`` opens its description (what it changes and why); ``adapt`` says what a
    user of today's flavour changes in their code."""

    title: str
    why: str
    adapt: str
    commits: tuple[Commit, ...]


STACK: tuple[PullRequest, ...] = (
    PullRequest(
        "Hand a dataloader_iter step its batches through a fetcher that looks one batch ahead",
        """
A training step taking `dataloader_iter` got Lightning's data fetcher unchanged: progress, `limit_train_batches`,
`val_check_interval` and `accumulate_grad_batches` counted calls instead of batches, `on_train_batch_start` saw the
previous call's batch, `done` was known only after a `next()` past the end, the transfer hooks never ran, and a
checkpoint recorded the loader's state after the batches fetched ahead. The fetcher now looks one batch ahead,
transfers each batch, and counts what the step takes; the training loop counts batches in progress and limits,
accumulates over step calls, and warns when a call runs out of batches.
""",
        """
A step that takes one batch per call notices the transfer hooks, which now run on its batches. A step that takes
several batches per call states `limit_train_batches` and `val_check_interval` in batches. A step that took part of a
call's batches before `StopIteration` asks `dataloader_iter.has_batches(n)` first.
""",
        (Commit((1,)),),
    ),
    PullRequest(
        "Give evaluation and prediction steps taking dataloader_iter an iterator per dataloader",
        """
Validation, test and prediction steps taking `dataloader_iter` got one iterator over all their dataloaders, so one
call could mix the batches of two. Each dataloader now gets an iterator of its own, and progress counts batches.
""",
        """
A step that relied on one call spanning dataloaders takes the next dataloader's batches in the next call.
""",
        (Commit((2,)),),
    ),
    PullRequest(
        "Stop every rank at the same dataloader_iter step call",
        """
Under DDP, a rank whose data ended stopped while its peers waited in the next gradient all-reduce. After each call of
a step taking `dataloader_iter` the ranks now agree whether the data has ended, and whether the next call may take
the last batch, in one all-reduce that replaces the SIGTERM broadcast made before each batch.
""",
        """
Nothing: a rank with batches left when another rank's data ended warns that they are not trained.
""",
        (Commit((3,)),),
    ),
    PullRequest(
        "Call a dataloader_iter step again after its data ends, when the module asks",
        """
A step that pipelines (it takes batch i+1 before it trains batch i) holds a batch when the data ends. With
`self.drain_dataloader_iter = True` the loops call the step again until it returns `None` or raises
`StopIteration`; without it, the loops warn where a step's first call took more batches than its later ones.
""",
        """
A pipelining step sets `self.drain_dataloader_iter = True` and returns `None` once it holds no batch.
""",
        (Commit((4,)),),
    ),
    PullRequest(
        "Count every batch of a dataloader_iter step call in ThroughputMonitor and prediction writers",
        """
`ThroughputMonitor` counted one batch per call of a step taking `dataloader_iter`, the call's last, and
`BasePredictionWriter` refused such a `predict_step`. The monitor now counts every batch the call took, and the
writers get the sample indices of every batch of the call.
""",
        """
A writer that refused the flavour's `predict_step` itself may drop its own guard.
""",
        (Commit((5,)),),
    ),
    PullRequest(
        "Let the LR finder ask the loop whether the optimizer steps",
        """
The LR finder recorded a rate whenever `(batch_idx + 1) % accumulate_grad_batches == 0`. It now asks the loop
whether the running call steps the optimizer, which counts step calls for a step taking `dataloader_iter`.
""",
        """
Nothing.
""",
        (Commit((6,)),),
    ),
)


def items_of(commit: Commit, items: tuple[Item, ...] = ITEMS) -> list[Item]:
    by_number = {item.number: item for item in items}
    return [by_number[number] for number in commit.items]


def commits(stack: tuple[PullRequest, ...] = STACK) -> list[Commit]:
    return [commit for pull_request in stack for commit in pull_request.commits]


def commit_message(commit: Commit, items: tuple[Item, ...] = ITEMS) -> str:
    """The commit's message: its subject, then what each of its items changes and what a user notices."""
    made = items_of(commit, items)
    subject = commit.subject or made[0].title
    if len(made) == 1:
        return f"{subject}\n\n{made[0].body()}\n"
    return f"{subject}\n\n" + "\n\n".join(f"{item.title}:\n{item.body()}" for item in made) + "\n"


def check_stack(stack: tuple[PullRequest, ...] = STACK, items: tuple[Item, ...] = ITEMS) -> None:
    """Every item in exactly one commit, every commit with a subject: raises naming what is wrong."""
    placed = [number for commit in commits(stack) for number in commit.items]
    known = [item.number for item in items]
    if sorted(placed) != sorted(known):
        raise ValueError(f"the stack's commits make items {sorted(placed)}; the change list has {sorted(known)}: "
                         "place each item in exactly one commit of patch.stack.STACK")
    unnamed = [commit.items for commit in commits(stack) if len(commit.items) > 1 and not commit.subject]
    if unnamed:
        raise ValueError(f"commits of several items need a subject: {unnamed}")
