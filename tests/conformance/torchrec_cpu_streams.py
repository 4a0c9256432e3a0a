"""CPU stand-ins for the stream objects of TorchRec's semi-sync and prefetch train pipelines (clause C19).

For the stream objects only, where TorchRec reaches for a GPU's. The semi-sync and prefetch pipelines create their
side streams only for CUDA or MTIA devices: None on the CPU, which ``PrefetchTrainPipelineSparseDist`` takes as
"nothing to prefetch" and then refuses the forward, and from which ``TrainPipelineSemiSync``'s rewritten forward
takes its device (``cuda`` without one). ``CpuSideStream`` (``torch.cpu.Stream`` with the ``device`` attribute
TorchRec reads) takes their place (``with_cpu_side_streams``). And TorchRec calls ``record_stream`` on the CPU
tensors it hands between streams, which torch implements for GPU tensors only (``RuntimeError: unknown parameter
type``): ``cpu_stream_stand_ins`` makes it a no-op on CPU tensors while they run. Their batch handling (what they
pull, hold, train and return) runs unmodified.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist


class CpuSideStream(torch.cpu.Stream):
    """Stand-in for a GPU side stream on the CPU (whose work is synchronous): what TorchRec reads of a stream is
    its ``device``, which ``torch.cpu.Stream`` lacks; waiting on it and recording events are ``torch.cpu.Stream``'s
    no-ops."""

    device = torch.device("cpu")


def with_cpu_side_streams(pipeline: TrainPipelineSparseDist) -> TrainPipelineSparseDist:
    """The pipeline's side streams (copy, input dist, and for prefetching the prefetch and forward streams), which
    TorchRec leaves None on a CPU device, the CPU's stand-ins: the semi-sync pipeline's rewritten forward takes its
    device from the input-dist stream (``torch.device("cuda")`` without one), and the prefetch pipeline skips the
    prefetch without one and then refuses the forward."""
    for stream in ("_memcpy_stream", "_data_dist_stream", "_prefetch_stream", "_default_stream"):
        if hasattr(pipeline, stream):
            setattr(pipeline, stream, CpuSideStream())
    return pipeline


@contextmanager
def cpu_stream_stand_ins() -> Iterator[None]:
    """While open, ``Tensor.record_stream`` is a no-op on CPU tensors (there is no caching allocator to tell that
    another stream uses them); torch's own for any other tensor."""
    record_stream = torch.Tensor.record_stream

    def record_stream_unless_cpu(tensor: torch.Tensor, stream: Any) -> None:
        if tensor.device.type != "cpu":
            record_stream(tensor, stream)

    torch.Tensor.record_stream = record_stream_unless_cpu
    try:
        yield
    finally:
        torch.Tensor.record_stream = record_stream
