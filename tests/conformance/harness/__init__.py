"""What the conformance suite's clauses share, one module per kind of thing:

- ``data``: self-identifying items, the datasets and loaders built from them, reading batches back (``ids``);
- ``trainers``: the design's or stock Lightning's Trainer with the quiet defaults;
- ``modules``: the recording LightningModules, both step flavours;
- ``expectations``: what a run must have done (a reference loop, the split into step calls) and the assertions;
- ``leftovers``: the threads and processes a run must not leave running.

The clauses import from this package; the names below are the ones it offers.
"""

from __future__ import annotations

from harness_common import QUIET
from tests.conformance.harness.data import (
    BATCH_SIZE,
    FEATURES,
    KINDS,
    LOADER_CASES,
    LR,
    DatasetBroke,
    FailingItems,
    ListedBatches,
    SizedItems,
    SlowItems,
    UnsizedBatches,
    UnsizedItems,
    ids,
    ids_or_none,
    item,
    loader_sequence,
    make_loader,
    uneven_loader,
)
from tests.conformance.harness.expectations import (
    assert_names_the_fix,
    assert_same_batches,
    collate_items,
    cut_short_reports,
    error_chain_text,
    reference_weights,
    split_by_pattern,
    warning_texts,
)
from tests.conformance.harness.leftovers import Running, assert_nothing_left
from tests.conformance.harness.modules import (
    CountingSGD,
    Crash,
    CrashingModule,
    IterStepModule,
    Record,
    RecordingModule,
    RegularStepModule,
)
from tests.conformance.harness.trainers import fit, make_trainer, stock_trainer

__all__ = [
    "cut_short_reports",
    "BATCH_SIZE", "FEATURES", "KINDS", "LOADER_CASES", "LR", "QUIET",
    "CountingSGD", "Crash", "CrashingModule", "DatasetBroke", "FailingItems", "IterStepModule", "ListedBatches",
    "Record", "RecordingModule", "RegularStepModule", "Running", "SizedItems", "SlowItems", "UnsizedBatches",
    "UnsizedItems",
    "assert_names_the_fix", "assert_nothing_left", "assert_same_batches", "collate_items", "error_chain_text", "fit",
    "ids", "ids_or_none", "item", "loader_sequence", "make_loader", "make_trainer", "reference_weights",
    "split_by_pattern", "stock_trainer", "uneven_loader", "warning_texts",
]
