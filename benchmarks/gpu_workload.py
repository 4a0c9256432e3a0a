"""S5's workload (``benchmarks/gpu_s5.py``): host batches whose values identify them, and one user step, in both
flavours, that checks on the device what it received and then computes."""

from __future__ import annotations

from collections.abc import Iterator

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import Dataset

from benchmarks import measuring

FEATURES = 8
PATTERN_MAX = 1000  # batch values are integers below PATTERN_MAX + n: exact in float32


class PinnedBatches(Dataset):
    """Item ``i``: a host batch (pinned on CUDA) equal to ``pattern + i``; produced instantly, the copy is L."""

    def __init__(self, n: int, rows: int, cols: int, probe: measuring.Probe, pin: bool, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.pattern = torch.randint(0, PATTERN_MAX, (rows, cols), generator=generator).float()
        self.pattern[:, 0] = 0.0
        self.items = []
        for i in range(n):
            batch = self.pattern + float(i)
            self.items.append(batch.pin_memory() if pin else batch)
        self.probe = probe

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.probe.batch_produced()
        return self.items[i]


class GpuStep(pl.LightningModule):
    """One user step for every design: take a batch, make sure it is on the device, check it, compute C."""

    def __init__(self, probe: measuring.Probe, pattern: torch.Tensor, iterations: int, matmul: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(FEATURES, 1)
        self.probe = probe
        self.iterations = iterations
        self.matmul = matmul
        self.register_buffer("pattern", pattern.clone(), persistent=False)
        self.register_buffer("weights_b", torch.randn(matmul, matmul, generator=torch.Generator().manual_seed(1))
                             / matmul**0.5, persistent=False)
        self.ids: list[torch.Tensor] = []
        self.oks: list[torch.Tensor] = []

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def on_train_epoch_start(self) -> None:
        self.ids, self.oks = [], []
        self.probe.epoch_started()

    def on_train_epoch_end(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.probe.epoch_ended(*self.parameters())
        self.probe.received = [int(i) for i in torch.stack(self.ids).tolist()] if self.ids else []
        self.probe.batches_exact = bool(torch.stack(self.oks).all().item()) if self.oks else False

    def work(self, batch: torch.Tensor) -> torch.Tensor:
        batch_id = batch[0, 0].clone()  # not a view: the batch itself may be freed (and its memory reused) early
        self.ids.append(batch_id)
        self.oks.append((batch == self.pattern + batch_id).all())  # stays on the device: no synchronisation
        out = torch.empty(self.matmul, self.matmul, device=batch.device)
        view = batch[: self.matmul, : self.matmul]
        for _ in range(self.iterations):
            torch.mm(view, self.weights_b, out=out)
        features = batch[:, 1 : FEATURES + 1] / PATTERN_MAX
        return self.layer(features).pow(2).mean()


class RegularGpuStep(GpuStep):
    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.work(batch)


class IterGpuStep(GpuStep):
    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        if batch.device != self.device:  # stock Lightning's flavour hands over CPU batches (#18831)
            batch = batch.to(self.device, non_blocking=True)
        return self.work(batch)
