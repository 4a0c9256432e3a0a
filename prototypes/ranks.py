"""Under DDP the ranks agree on the end of data: the vote the designs that change Lightning's loops share, in a
collective of its own or carried in DDP's gradient all-reduce, and its messages."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl

from prototypes.step_calls import makes_drain_calls


# [RFC 3] under DDP the ranks agree on the end of data, in the one collective stock Lightning makes per step call
@dataclass(frozen=True)
class RanksVote:
    """What the ranks agreed between two step calls (``vote``): whether every rank makes another call (it has a
    batch, or it drains batches it holds), whether any rank's last call was cut short by its data's end, whether any
    rank's look-ahead sees its data end within the next call, whether every rank's step pulled batches ahead
    (``pulled_ahead``: the drain rule), rank 0's SIGTERM flag (what stock Lightning broadcasts before every call),
    and whether every rank makes another call over the current dataloader (a batch of it, or a drain call)."""

    every_rank_has_a_batch: bool
    a_call_was_cut_short: bool = False
    a_rank_ends_within_the_next_call: bool = False
    sigterm: bool = False
    every_rank_pulled_ahead: bool = False
    every_rank_continues_the_dataloader: bool = False

    def drains(self, rule: str) -> bool:
        """Whether the ranks make drain calls after the call that ended a dataloader's data, by what they agreed: no
        rank's call was cut short, and every rank continues the dataloader or, by ``rule``, every rank pulled ahead."""
        return not self.a_call_was_cut_short and (
            self.every_rank_continues_the_dataloader or makes_drain_calls(rule, self.every_rank_pulled_ahead)
        )


def vote(
    trainer: pl.Trainer, has_batch: bool, *, cut_short: bool = False, ends_within_the_next_call: bool = False,
    pulled_ahead: bool = False, continues_the_dataloader: bool = False,
) -> RanksVote:
    """The ranks' vote on the end of data (``start_vote``), read at once."""
    return start_vote(
        trainer, has_batch, cut_short=cut_short, ends_within_the_next_call=ends_within_the_next_call,
        pulled_ahead=pulled_ahead, continues_the_dataloader=continues_the_dataloader,
    )()


def start_vote(
    trainer: pl.Trainer, has_batch: bool, *, cut_short: bool = False, ends_within_the_next_call: bool = False,
    pulled_ahead: bool = False, continues_the_dataloader: bool = False, carrier: VoteInGradients | None = None,
) -> Callable[[], RanksVote]:
    """The ranks' vote on the end of data: one all-reduce(MAX) of six flags, started here; the function it returns
    waits for it and reads its result (one host read). With a ``carrier``, called where a step call's backward is
    about to all-reduce the gradients, the flags ride in that all-reduce instead (``VoteInGradients``).

    Why: under DDP each step call ends in a gradient all-reduce. A rank whose data ends early and stops would leave
    its peers blocked in that collective until the process-group timeout (the hang of HF Accelerate #2258), so all
    ranks must stop at the same step call. Why the flags in one collective: stock Lightning already broadcasts rank
    0's SIGTERM flag before every step call (``_TrainingEpochLoop._broadcast_sigterm_tensor``, a collective and a
    host sync); carried here (only rank 0 sets it, so MAX is that broadcast), it makes the vote cost no collective
    and no host sync that stock does not pay. Why started apart from its reading: unlike a broadcast, whose root
    need not wait for its peers, an all-reduce waits for the slowest rank; started as a step call's backward ends and
    read after its optimizer step, that wait overlaps the optimizer step. Why "every rank pulled ahead" rather than
    "any": a drain call in which one rank trains a held batch and a peer, holding none, ends the draining would pair
    that batch's gradient all-reduce with nothing; the ranks drain only where all hold batches.

    Why a rank that holds batches counts as having one (``has_batch``, ``continues_the_dataloader``): a pipeline's
    own loading thread (TorchRec's ``EvalPipelineSparseDist``) takes a dataloader's last batch inside a call on one
    rank and just after it on another, so one rank's data ends a call before its peer's. The first then makes a drain
    call where the peer makes a regular one, each training one batch: their calls, and the votes after them, pair.
    Without a process group it answers from this rank alone.
    """
    import torch
    import torch.distributed as dist

    received_sigterm = bool(getattr(trainer, "received_sigterm", False))
    if not (dist.is_available() and dist.is_initialized()) or trainer.world_size == 1:
        alone = RanksVote(has_batch, cut_short, ends_within_the_next_call, received_sigterm, pulled_ahead,
                          continues_the_dataloader)
        return lambda: alone
    sigterm = received_sigterm and trainer.global_rank == 0
    flags = [int(sigterm), int(not has_batch), int(cut_short), int(ends_within_the_next_call), int(not pulled_ahead),
             int(not continues_the_dataloader)]
    agreed = torch.tensor(flags, device=trainer.strategy.root_device)

    def agreed_on(flags_set: list) -> RanksVote:
        sigterm_flag, a_rank_has_none, cut, ends, a_rank_did_not_pull_ahead, a_rank_ends_it = flags_set
        return RanksVote(not a_rank_has_none, bool(cut), bool(ends), bool(sigterm_flag), not a_rank_did_not_pull_ahead,
                         not a_rank_ends_it)

    def explain(error: RuntimeError) -> None:
        if cut_short:
            raise RuntimeError(VOTE_FAILED_AFTER_A_CALL_CUT_SHORT.format(rank=trainer.global_rank)) from error

    def start() -> Callable[[], RanksVote]:
        try:
            work = dist.all_reduce(agreed, op=dist.ReduceOp.MAX, async_op=True)
        except RuntimeError as error:  # torch.distributed's DistError and the backends' timeouts
            explain(error)
            raise

        def read() -> RanksVote:
            try:
                work.wait()
            except RuntimeError as error:
                explain(error)
                raise
            return agreed_on(agreed.tolist())

        return read

    if carrier is None:
        return start()
    carrier.pending = agreed

    def read_carried() -> RanksVote:
        # Why a vote of its own where nothing carried it: a loss no parameter contributes to runs a backward without
        # DDP's all-reduce on every rank alike, and stock Lightning trains on
        carried = carrier.take()
        return start()() if carried is None else agreed_on(carried)

    return read_carried


# [RFC 3] the vote rides in DDP's gradient all-reduce where a step call's backward makes one
class VoteInGradients:
    """The ranks' vote carried in DDP's gradient all-reduce of a step call's backward: no collective of its own.

    Why: a vote in a collective of its own, even in the place of stock Lightning's SIGTERM broadcast, is a second
    meeting of the ranks per call beside the gradients' all-reduce, and an all-reduce waits for the slowest rank
    where a broadcast's root does not (on two ranks of a small step, about a tenth of the call). A call whose
    backward all-reduces the gradients meets the peers there anyway: its flags ride at the end of DDP's first bucket
    (bucket 0, the first ready and at most DDP's first-bucket cap unless one parameter is larger: the one copy this
    costs), summed with the peers' (a flag is set on some rank where its sum is positive); the one host read of the
    result replaces stock's read of the broadcast flag.

    Installed as the DDP model's communication hook (``install``) for a fit of the flavour under automatic
    optimisation: DDP takes one hook, so where a hook is registered already (a user's compression, DDP's mixed
    precision) the vote keeps its own all-reduce. Every other bucket gets DDP's default all-reduce. A call whose
    backward skips the sync (inside an accumulation window) or runs none votes in its own all-reduce, alike on every
    rank: DDP's reducer syncs on every rank or none.
    """

    def __init__(self, model: Any) -> None:
        self.group = model.process_group
        self.pending: Any = None  # the flags for the next synced backward's first bucket
        self.carried: Any = None  # the ranks' flags summed, once that bucket's all-reduce completed

    @staticmethod
    def install(trainer: pl.Trainer) -> VoteInGradients | None:
        """The carrier of the training step calls' votes on the trainer's DDP model, registered there on first use;
        None where the vote keeps its own all-reduce (one rank, manual optimisation, no DDP model, a hook of its
        own, DDP's compiled reducer, which calls hooks per parameter)."""
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if not (isinstance(model, DistributedDataParallel) and end_of_data_vote_needed(trainer)
                and trainer.lightning_module.automatic_optimization):
            return None
        carrier = _VOTE_CARRIERS.get(model)
        if carrier is None and not (model._comm_hooks or getattr(model, "_use_python_reducer", False)):
            carrier = _VOTE_CARRIERS[model] = VoteInGradients(model)
            model.register_comm_hook(None, carrier.hook)
        return carrier

    # Why no annotations: DDP checks a hook's annotations as objects, and this module's are strings
    def hook(self, state, bucket):
        """DDP's default all-reduce of ``bucket`` (the gradients averaged over the ranks), the pending flags at the
        end of bucket 0."""
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        if bucket.index() != 0 or self.pending is None:
            return default_hooks.allreduce_hook(self.group, bucket)
        gradients, flags, self.pending = bucket.buffer(), self.pending, None
        count = gradients.numel()
        carrying = torch.cat([gradients.div_(self.group.size()), flags.to(gradients.dtype)])

        def split(done: torch.futures.Future) -> torch.Tensor:
            summed = done.value()[0]
            self.carried = summed[count:]
            return summed[:count]

        return dist.all_reduce(carrying, group=self.group, async_op=True).get_future().then(split)

    def take(self) -> list[int] | None:
        """The flags the ranks' last synced backward carried, as a vote's MAX would give them (one host read); None
        where it all-reduced no gradients."""
        carried, self.pending, self.carried = self.carried, None, None
        return None if carried is None else [int(total > 0) for total in carried.tolist()]


_VOTE_CARRIERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # DDP model -> its ``VoteInGradients``


VOTE_FAILED_AFTER_A_CALL_CUT_SHORT = (
    "rank {rank}'s step call was cut short by the end of its data (StopIteration inside the step), and the ranks'"
    " end-of-data vote after it failed: a peer never reached it. Where the ranks are the stages of a pipeline-parallel"
    " schedule, the peer is still inside its step, waiting for an activation or gradient this rank will not send;"
    " the loop cannot end a call it did not start. A step that runs a pipeline-parallel schedule over k micro-batches"
    " must not start a call the data cannot finish: `if not dataloader_iter.has_batches(k): return None` first."
)


def every_rank_has_a_batch(trainer: pl.Trainer, has_batch: bool) -> bool:
    """Whether *every* rank can start another step call (``vote``'s first answer), for a vote of its own where no
    collective of stock Lightning's stands at that point (after a drain call)."""
    return vote(trainer, has_batch).every_rank_has_a_batch


# [RFC 3]
def end_of_data_vote_needed(trainer: pl.Trainer) -> bool:
    """Whether the ranks of a ``*_step(self, dataloader_iter)`` must vote on the end of data
    (``every_rank_has_a_batch``) after every step call: under DDP with more than one rank, always.

    Why no skip for loaders that give every rank the same number of batches (a ``DistributedSampler``): equal
    batches end every rank at the same step call only if every rank's calls take the same number of batches, and
    that is the step's to decide, call by call (a data-dependent micro-batch count, as sequence packing gives). A
    rank sees only its own calls, so no rank can prove it without the communication the vote is; one that skipped on
    its own evidence while a peer voted would pair the vote with the peer's gradient all-reduce. The regular flavour
    takes one batch per call by construction and keeps stock Lightning's loop, without a vote.
    """
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and trainer.world_size > 1


BATCHES_LEFT_WHEN_A_PEER_ENDED = (
    "rank {rank} ends the epoch with batches left, not trained: another rank's data ran out first (its shard was"
    " shorter, or its step calls took more batches each), and under DDP all ranks stop at the same step call. Give"
    " every rank the same number of batches, and make every rank's step calls take the same number of them."
)
