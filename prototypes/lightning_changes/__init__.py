"""What Lightning has to change for ``training_step(self, dataloader_iter)``, written once.

The two designs that change Lightning's loops (``batch_processor`` and ``prefetcher``) differ in who owns the
iterator: the training loop's look-ahead, or a fetcher that prefetches. Everything else they change is the same
change to Lightning 2.6, and lives in this package, one module per part of Lightning it changes. Each piece is
tagged with its item in the RFC's list "What Lightning has to change" (``rfc/index.md``): ``[RFC n]``. Everything
in this package is an override of, or a call into, Lightning's private loop API; ``prototypes.common`` holds what
needs only the public API.

The per-batch rules (the layout rule; ``docs/adding-a-design.md`` says why). What runs per batch does no type
checks: it decides once and keeps the answer in an attribute. The regular flavour pays nothing: no override on its
path only defers to Lightning; the flavour's changes are shadowed on the instance while it runs, or decided once.
Loops, progress objects, fetchers and the strategy keep CPython's inline attribute layout: nothing reads their
``__dict__``, and none holds more than 29 attributes (a class that needs more is cut into a second object, not
packed). ``tests/designs/test_attribute_layout.py`` guards the layout for every design.
"""

from prototypes.lightning_changes.draining import (
    drain,
    epoch_stopped_early,
    evaluation_drain_call,
    prediction_drain_call,
)
from prototypes.lightning_changes.epoch_loop import BatchCountingEpochLoop, StockProfilerActions, stock_fetch_action
from prototypes.lightning_changes.fit_loop import BatchCountingFitLoop, loader_state_reader
from prototypes.lightning_changes.install import install_loops
from prototypes.lightning_changes.log_batch_size import samples_in, supply_log_batch_size
from prototypes.lightning_changes.optimization import (
    ManualOptimizationSeesStopIteration,
    StepFirstAutomaticOptimization,
    discard_cut_short_call,
)
from prototypes.lightning_changes.prediction import PredictionWriterSeesStepCalls
from prototypes.lightning_changes.progress import ConsumedBatchProgress, ConsumedProgress, CountsConsumed

__all__ = [
    "BatchCountingEpochLoop", "BatchCountingFitLoop", "ConsumedBatchProgress",
    "ConsumedProgress", "CountsConsumed", "ManualOptimizationSeesStopIteration", "PredictionWriterSeesStepCalls",
    "StepFirstAutomaticOptimization", "StockProfilerActions", "discard_cut_short_call", "drain", "epoch_stopped_early",
    "evaluation_drain_call", "install_loops", "loader_state_reader", "prediction_drain_call",
    "samples_in", "stock_fetch_action", "supply_log_batch_size",
]
