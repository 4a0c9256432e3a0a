"""C1's run under ``strategy="ddp_spawn"``: Lightning starts the ranks itself, so a design's Trainer must pickle like
stock's. The launch the C16 clause uses, its ranks started by the test, is in ``ddp.py``; this shares its deadlines and
its report of a rank's outcome.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pytorch_lightning.callbacks import Callback
from pytorch_lightning.strategies import DDPStrategy
from torch.utils.data import DataLoader

from harness_common import QUIET
from tests.conformance.ddp import LAUNCH_DEADLINE_S, PG_TIMEOUT_S, WORLD, rank_outcome, trim_stack

# Under `strategy="ddp_spawn"` Lightning starts the ranks itself: it pickles the Trainer, the module and the loaders
# into WORLD new processes (C1: a design's Trainer must pickle like stock's). Each rank reports through a callback;
# the test process keeps the launch deadline with a timer.
# A spawned rank imports torch and Lightning itself (5-10 s on 2 busy cores), hence a longer deadline than above.
SPAWN_DEADLINE_S = LAUNCH_DEADLINE_S + 30
SPAWN_TEST_TIMEOUT_S = SPAWN_DEADLINE_S + 30


class ReportsRankOutcome(Callback):
    """Writes its rank's outcome as JSON into ``outdir`` when the fit ends; arms faulthandler for a stack dump."""

    def __init__(self, outdir: str) -> None:
        self.outdir = outdir

    def setup(self, trainer, pl_module, stage: str) -> None:
        stack_file = open(Path(self.outdir) / f"stack-{trainer.global_rank}.txt", "w")  # noqa: SIM115 - kept open
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)

    def on_fit_end(self, trainer, pl_module) -> None:
        path = Path(self.outdir) / f"rank{trainer.global_rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(rank_outcome(pl_module, trainer, None)))
        path.with_suffix(".tmp").rename(path)


def spawn_fit(design, module, loader: DataLoader) -> dict[str, Any]:
    """``fit`` under ``strategy="ddp_spawn"`` (gloo, ``WORLD`` CPU processes); the result has ``launch``'s shape.

    A rank that raises reports nothing: its exception ends ``fit`` in the test process as Lightning's launcher
    re-raises it, and its text is the result's ``error``. Never blocks past ``SPAWN_DEADLINE_S``: the ranks still
    running then have their stacks dumped and are killed, which ends ``fit`` too.
    """
    with tempfile.TemporaryDirectory(prefix="c01-spawn-") as outdir:
        # what strategy="ddp_spawn" names, with the process group's timeout of the launches above
        strategy = DDPStrategy(
            start_method="spawn", process_group_backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S)
        )
        trainer = design.trainer(**{**QUIET, "devices": WORLD, "strategy": strategy,
                                    "callbacks": [ReportsRankOutcome(outdir)]})
        running_before, hung = set(multiprocessing.active_children()), {}

        def past_the_deadline() -> None:
            ranks = [proc for proc in multiprocessing.active_children() if proc not in running_before]
            for proc in ranks:
                os.kill(proc.pid, signal.SIGUSR1)  # faulthandler dumps every thread's stack
            time.sleep(1.0)
            for rank in range(WORLD):
                stack = Path(outdir) / f"stack-{rank}.txt"
                if not (Path(outdir) / f"rank{rank}.json").exists():
                    hung[rank] = (trim_stack(stack.read_text()) if stack.exists() else "") or "(no stack dumped)"
            for proc in ranks:
                proc.kill()

        deadline = threading.Timer(SPAWN_DEADLINE_S, past_the_deadline)
        deadline.start()
        error = None
        try:
            trainer.fit(module, train_dataloaders=loader)
        except Exception as raised:  # noqa: BLE001 - reported with the ranks' outcomes
            error = f"{type(raised).__name__}: {raised}"[-3000:]
        finally:
            deadline.cancel()
            deadline.join()
        ranks = [json.loads(path.read_text()) if (path := Path(outdir) / f"rank{rank}.json").exists() else None
                 for rank in range(WORLD)]
        return dict(ranks=ranks, hung=hung, exitcodes=[None] * WORLD, error=error, deadline_s=SPAWN_DEADLINE_S)
