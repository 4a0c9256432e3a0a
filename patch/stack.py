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
        "Hand a dataloader_iter step the batches it consumes, counted, one batch looked ahead",
        """
A step taking `dataloader_iter` got an iterator over Lightning's data fetcher: progress, limits and
`val_check_interval` counted its calls rather than its batches, `on_train_batch_start` saw the previous call's batch,
`done` was known only after the step had read past the end, and its batches skipped the transfer hooks. The loops now
give it a fetcher that looks one batch ahead and counts what it hands out, with one iterator per loop over a
dataloader, and checkpoints record the loaders' state as of the batches the step consumed.
""",
        """
A step that consumes one batch per call notices nothing but the transfer hooks, which now run on its batches (a
step that moved them itself may stop doing so). A step that consumes several batches per call sizes `limit_*_batches`
and `val_check_interval` in batches, as the regular flavour does, no longer in calls; `on_train_batch_start` gets the
batch the call takes first, never `None`.
""",
        (
            Commit((1, 2, 4, 11, 16), "Count the batches a dataloader_iter step consumes, looking one ahead"),
            Commit((6,)),
        ),
    ),
    PullRequest(
        "Steps that take several batches per call: drain calls, the optimizer step after the step, the ranks' vote",
        """
A step that pipelines (it pulls batch i+1 before it trains batch i) or takes k batches per call needs the loop to
call it once more at the end of the data, to step the optimizer only after it has seen what the call took, and under
DDP to stop every rank at the same call. The loops now make drain calls where the step pulled ahead, run the closure
before the optimizer step, give evaluation and prediction one iterator per dataloader, and carry the ranks'
end-of-data vote in the collective they already make per batch. Misuse is refused with a message that names the fix.
""",
        """
A pipelining step that holds batches at the end of the data gets drain calls: it trains what it holds and returns
`None` (or raises `StopIteration`) when it has nothing left. `accumulate_grad_batches` counts step calls. A
`StopIteration` the step raises itself while its iterator has batches left is now an error, not the end of the epoch;
a step taking both a batch and `dataloader_iter` is refused when the fit starts. A pipeline-parallel step asks
`dataloader_iter.has_batches(k)` before it starts k micro-batches.
""",
        (Commit((3,)), Commit((5,)), Commit((7,)), Commit((8,)), Commit((10,))),
    ),
    PullRequest(
        "Logging and callbacks count every batch a dataloader_iter step consumed",
        """
`self.log` needed `batch_size=` for the flavour, `ThroughputMonitor` counted one batch per call, the LR finder
recorded a rate per batch rather than per optimizer step, and `BasePredictionWriter` refused a `predict_step` taking
`dataloader_iter`. Each now reads the batches the running call consumed, which the loop records.
""",
        """
`batch_size=` in `self.log` can go where the batches' size can be inferred. A prediction writer for the flavour
gets every batch's indices of the call, and `batch=None` in a drain call.
""",
        (Commit((9,)), Commit((12,)), Commit((13,)), Commit((14,)), Commit((15,))),
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
