"""What a training epoch costs in communication on one rank: the collectives it makes, the host reads of their
results, and DDP's gradient communication (clause C16's cost tests, ``test_c16_collectives.py``).

``CommunicationCount`` is installed in a rank's process (forked by ``tests/conformance/ddp.py``) around one fit. It
counts every call of ``torch.distributed``'s collectives made while a training epoch runs (between the callback
hooks ``on_train_epoch_start`` and ``on_train_epoch_end``: setup's broadcasts are not a step call's), every host read
(``item``, ``tolist``, ``bool``, ``int``, ``float``) of a tensor such a collective filled or of a view of it (on a
GPU each is a device-to-host synchronisation that waits for the queued work), and every bucket DDP's backward
all-reduces (a comm hook doing DDP's default all-reduce). Why wrap the module functions: Lightning and the designs
call them through the ``torch.distributed`` module (``dist.all_reduce``), and DDP's reducer, which does not, is
counted by its hook. ``comm_hook=False`` registers none, leaving DDP's hook to the design (a design that carries its
vote in DDP's gradient all-reduce registers its own, whose ``dist.all_reduce`` of each bucket is counted as a
collective on a floating-point tensor).
"""

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

COLLECTIVES = (
    "all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all", "all_to_all_single",
    "broadcast_object_list", "send", "recv", "isend", "irecv",
)
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__")


class CommunicationCount(pl.Callback):
    """Counts one rank's communication during its training epochs (see the module's docstring).

    ``collectives``: Counter of collective names; ``gradient_all_reduces``: collectives on floating-point tensors
    outside DDP's reducer (gradients averaged by hand); ``host_reads``: reads of collective results;
    ``gradient_buckets``: buckets DDP's backward all-reduced (``comm_hook``, registered on the DDP model at fit start).
    """

    def __init__(self, comm_hook: bool = True) -> None:
        self.comm_hook_registered = comm_hook
        self.collectives: Counter[str] = Counter()
        self.gradient_all_reduces = 0
        self.host_reads = 0
        self.gradient_buckets = 0
        self._in_epoch = False
        # the tensors collectives filled, by id (a tensor's == is elementwise, so no set of tensors)
        self._filled: dict[int, weakref.ref[torch.Tensor]] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Why here, not through DDPStrategy(ddp_comm_hook=): Lightning registers that hook on CUDA devices only
        if self.comm_hook_registered:
            trainer.strategy.model.register_comm_hook(None, self.comm_hook)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._in_epoch = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._in_epoch = False

    # Why this module has no `from __future__ import annotations`: DDP checks the hook's annotations as objects
    def comm_hook(self, state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if not self._in_epoch:
            return default_hooks.allreduce_hook(state, bucket)
        self.gradient_buckets += 1
        self._in_epoch = False  # Why: the default hook calls dist.all_reduce itself, counted here as the bucket
        try:
            return default_hooks.allreduce_hook(state, bucket)
        finally:
            self._in_epoch = True

    def as_dict(self) -> dict[str, Any]:
        return dict(collectives=dict(self.collectives), total=sum(self.collectives.values()),
                    gradient_all_reduces=self.gradient_all_reduces, host_reads=self.host_reads,
                    gradient_buckets=self.gradient_buckets)

    @contextlib.contextmanager
    def installed(self) -> Iterator["CommunicationCount"]:
        """Wrap the collectives and the host reads for the duration (one fit in a rank's own process)."""
        originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
        reads = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        for name, function in originals.items():
            setattr(dist, name, self._counting_collective(name, function))
        for name, method in reads.items():
            setattr(torch.Tensor, name, self._counting_read(method))
        try:
            yield self
        finally:
            for name, function in originals.items():
                setattr(dist, name, function)
            for name, method in reads.items():
                setattr(torch.Tensor, name, method)

    def _counting_collective(self, name: str, function: Any) -> Any:
        def collective(*args: Any, **kwargs: Any) -> Any:
            if self._in_epoch:
                self.collectives[name] += 1
                tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
                if tensor is not None:
                    self._filled[id(tensor)] = weakref.ref(tensor)
                    if tensor.is_floating_point():
                        self.gradient_all_reduces += 1
            return function(*args, **kwargs)

        return collective

    def _counting_read(self, method: Any) -> Any:
        def read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            base = tensor._base if tensor._base is not None else tensor
            filled = self._filled.get(id(base))
            if self._in_epoch and filled is not None and filled() is base:
                self.host_reads += 1
            return method(tensor, *args, **kwargs)

        return read
