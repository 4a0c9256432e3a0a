"""[RFC 14] ``ThroughputMonitor`` learns about every batch a step took."""

from patch.edits import LightningSource, calls
from patch.items import Item


def _every_batch_of_the_call(source: LightningSource) -> None:
    monitor = source.module("callbacks.throughput_monitor")
    monitor.replace_statement(
        "ThroughputMonitor.on_train_batch_end",
        calls("self._update"),
        """
        fetcher = trainer.fit_loop.prefetching_fetcher
        # a step taking `dataloader_iter` consumed the batches the loop recorded for the call (none in a drain
        # call); the hook's `batch` is only the last of them
        for step_batch in [batch] if fetcher is None else fetcher.step_batches():
            self._update(trainer, pl_module, step_batch, trainer.fit_loop.total_batch_idx + 1)
        """,
    )


ITEM = Item(
    14,
    "ThroughputMonitor learns about every batch a step took",
    """
`ThroughputMonitor` added one batch and `batch_size_fn` of `on_train_batch_end`'s batch per step call, which with
`training_step(self, dataloader_iter)` taking several batches per call is the call's last one: it counted half the
batches and samples of a step taking two. It now adds each batch the running call consumed (the loop records them for
`self.log`'s batch size, item 9), and none for a drain call. A regular `training_step` is counted as before.
""",
    _every_batch_of_the_call,
    changelog=(
        ("Fixed", (
            "`ThroughputMonitor` counts every batch and sample a `training_step(dataloader_iter)` call "
            "consumed"
        )),
    ),
    tests=("callbacks/test_throughput_monitor_dataloader_iter.py",),
)
