"""[RFC 2] Look one batch ahead: the step's iterator, one per loop over a dataloader, from a fetcher that hands out
the batches the step consumes.

The fetcher, what it is built from (the producer, the record of a loop's step calls) and what the loops share with it
(the record of a step call, the batch transfer, the ranks' vote) are the recommended design's own modules, written
into ``loops/fetchers.py`` by ``patch.transplant``; the drain calls and the optimisation loops' helpers are written
at the end of the loops' helpers in ``loops/utilities.py`` (``UTILITIES_PARTS``). No module is added:
each definition is private in the module it is written into, as Lightning names its fetchers and its loops' helpers.
The loops choose the fetcher where they chose Lightning's ``_DataLoaderIterDataFetcher``. The fetcher and the step's
iterator are written as one class each (``FLATTENED``): the prototype cuts them into mixins to keep each class on a
screen, Lightning's reader meets one.
The design's opt-in prefetch thread (``prototypes.prefetcher.threaded``) is not carried, nor the batch transfer's
pinning step it uses: the RFC defers it (its thread decision), and code no user can switch on does not ship.
"""

import ast
import functools
import re
from collections.abc import Iterable

import prototypes.batches_per_call
import prototypes.common
import prototypes.lightning_changes.draining
import prototypes.lightning_changes.fit_loop
import prototypes.lightning_changes.optimization
import prototypes.prefetcher.fetcher
import prototypes.prefetcher.producer
import prototypes.prefetcher.step_calls
from patch.edits import LightningSource, ModuleSource, asserts, asserts_exactly, assigns, calls, import_statement
from patch.items import Item, UpdatedTest
from patch.transplant import (
    assignment_source,
    class_source,
    definition_source,
    imports_and_body,
    module_source,
    renamed,
    top_level_names,
)

FETCHERS = "pytorch_lightning.loops.fetchers"
UTILITIES = "pytorch_lightning.loops.utilities"
IMPORTS = {
    # what the fetcher is built from and what the loops share with it are written into its module (``FETCHER_PARTS``)
    "prototypes.common": FETCHERS,
    "prototypes.prefetcher.fetcher": FETCHERS,
    "prototypes.prefetcher.producer": FETCHERS,
    "prototypes.prefetcher.step_calls": FETCHERS,
    # written into the one module that uses each (``WRITTEN_INTO_ITS_USER``), which drops the import
    "prototypes.lightning_changes:loader_state_reader": FETCHERS,
    "prototypes.batches_per_call:CALL_CUT_SHORT": UTILITIES,
    "prototypes.lightning_changes:CountsConsumed": "pytorch_lightning.loops.progress",
    # public: a user filters it (or makes it an error) by its category
    "prototypes.batches_per_call:CutShortCallWarning": "pytorch_lightning.utilities.warnings",
}
# What the fetcher is built from, written into `loops/fetchers.py` before it, in this order: what every loop shares
# with it (the record of a step call and of a loop's calls, the batch transfer, the ranks' end-of-data vote, the
# misuse messages), the producer that loads and transfers the batches (and reads the loaders' state after each), and
# the record of a loop's step calls (the peeked next batch, the ranks' vote, the running call, batches taken between
# calls, drain calls): part -> (prototype module, the definitions it takes: None for all, those it leaves).
FETCHER_PARTS = {
    # less the prototype's registry entry, what the loops' selection does (item 10), the iterator the fetcher's own
    # replaces, and the message of an iterator used after its step, which no loop of the stack gives
    "common": (prototypes.common, None, {"Design", "takes_dataloader_iter", "refuse_mixed_step_signature",
                                         "StepIterator", "DATALOADER_ITER", "ITERATOR_USED_AFTER_ITS_STEP"}),
    "producer": (prototypes.prefetcher.producer, None, ()),
    "step_calls": (prototypes.prefetcher.step_calls, None,
                   {"HeldBatches", "RanksVoteBetweenCalls", "RanksVoteAfterDrainCalls", "VoteSchedule"}),
}
# What the loops call at the end of the data and around the optimizer, written into `loops/utilities.py` after its
# helpers, in this order (as ``FETCHER_PARTS``): the drain calls, and what the optimisation loops do for a step taking
# `dataloader_iter` (a call cut short by the end of the data, which calls skip DDP's gradient all-reduce, and how a
# window the data closed unforeseen is synchronised once). `loops/fetchers.py` cannot hold them: `loops/utilities.py`
# imports it, and they call `_is_max_limit_reached` there.
UTILITIES_PARTS = {
    "draining": (prototypes.lightning_changes.draining, None, ()),
    "optimization": (prototypes.lightning_changes.optimization,
                     {"discard_cut_short_call", "first_where_synced", "blocks_gradient_sync",
                      "average_gradients_over_ranks"}, ()),
}
# the progress classes count consumed batches themselves once item 1 is in; what is written into Lightning's modules
# is private there, as Lightning names the fetchers and the loops' helpers
NAMES = {"CountsConsumed": "_Progress", "FetcherStepIterator": "_DataLoaderIter",
         "_PrefetchingIterFetcher": "_DataLoaderIterDataFetcher", "loader_state_reader": "_loader_state_reader",
         "CALL_CUT_SHORT": "_CALL_CUT_SHORT",
         # the prose of the prototype's record of the step calls names the rules by their module
         "common.DRAIN_RULES": "_DRAIN_RULES",
         **{name: f"_{name}" for module, keep, drop in (*FETCHER_PARTS.values(), *UTILITIES_PARTS.values())
            for name in top_level_names(module, keep=keep, drop=drop) if not name.startswith("_")}}
# What one module alone uses is written into it, not beside what the others use: module -> (the definition, the
# definition it goes before, the import it needs there or None)
WRITTEN_INTO_ITS_USER = {
    "loops.fetchers": (definition_source(prototypes.lightning_changes.fit_loop.loader_state_reader,
                                         name="_loader_state_reader"),
                       "_BatchProducer", "from lightning_fabric.utilities.types import _Stateful"),
    "loops.utilities": (renamed(assignment_source(prototypes.batches_per_call, "CALL_CUT_SHORT"), NAMES),
                        "_discard_cut_short_call", None),
}
# The prototype's classes written as one class each where Lightning's reader meets them (``class_source``).
FLATTENED = {"common": {
    # without `pin`, the prefetch thread's pinned-memory step: the stack has no thread
    "BatchTransfer": class_source(
        prototypes.common.BatchTransfer, name="BatchTransfer", bases="", substitutions={
            " ``pin`` runs between the first hook and the copy.": "",
            ", *, pin: Callable[[Any], Any] | None = None": "",
            "        if pin is not None:\n            batch = pin(batch)\n": "",
        },
    ),
}, "step_calls": {
    # its mixins (the held batches, the ranks' vote and when it is due) written into it; its base, the record every
    # loop keeps, stays
    "EpochStepCalls": class_source(prototypes.prefetcher.step_calls.EpochStepCalls, name="EpochStepCalls",
                                   bases="StepCalls", within="prototypes.prefetcher."),
}}
PRODUCER_HOOKS = ("_producer_transfer", "_start_producing", "_next_produced", "_stop_producing")
# The fetcher, in `loops/fetchers.py` in place of the one it replaces, and the iterator a step receives, in place of
# `_DataFetcherWrapper`: the prototype's mixins and its iterator's base flattened into them. Left out: `_take` of the
# iterator's base (the iterator binds its own), and `adopt`, how the prototype's loops take over the loader iterator
# Lightning's evaluation loop started (the changed loops build this fetcher themselves).
FETCHER = class_source(
    prototypes.prefetcher.fetcher._PrefetchingIterFetcher, name="_DataLoaderIterDataFetcher", bases="_DataFetcher",
    drop=("adopt", *PRODUCER_HOOKS), substitutions={
        "_DataFetcher.__iter__(self)": "super().__iter__()",
        # the producer's hooks, which only the prototype's threaded fetcher overrides, written where they are called
        "self._producer_transfer()": "BatchTransfer(self.trainer)",
        "        self._start_producing(producer)\n": "        self._producer = producer\n",
        "return self._next_produced()": "return self._producer()",
        "        self._stop_producing()\n": (
            "        # it holds the run's hooks and profiler wrappers, which a Trainer pickled after fit must not\n"
            "        # carry\n"
            "        self._producer = None\n"
        ),
        # what the fetcher it subclassed in the prototype set: the loops read them
        "        super().__init__()\n": (
            "        super().__init__()\n        self._batch: Any = None\n        self._batch_idx: int = 0\n"
            "        self._dataloader_idx: int = 0\n"
        ),
    },
)
STEP_ITERATOR = class_source(
    prototypes.prefetcher.fetcher.FetcherStepIterator, name="_DataLoaderIter", bases="Iterator", drop=("_take",)
)
FETCHER_IMPORTS = (
    "from __future__ import annotations",
    "import functools",
    "from collections.abc import Callable",
    "import pytorch_lightning as pl",
    "from pytorch_lightning.loops.progress import _Progress",
)
# the prototype's banners between its groups of definitions (`# ---- drain a pipelining step`), which Lightning's
# modules do not use
_BANNER = re.compile(r"^# -{10,}[^\n]*\n", flags=re.M)


def _write_parts(module: ModuleSource, parts: dict, itself: str, before: str | None = None) -> None:
    """Each part's definitions written into ``module`` (the Lightning module ``itself``): before the definition
    ``before``, or at its end, with the imports they need that ``module`` lacks."""
    for name, (prototype, keep, drop) in parts.items():
        text = module_source(prototype, imports=IMPORTS, names=NAMES, keep=keep, drop=drop,
                             replacements=FLATTENED.get(name, {}))
        imports, body = imports_and_body(text)
        _add_imports(module, imports, itself)
        module.insert(_BANNER.sub("", body), before=before)


def _add_imports(module: ModuleSource, lines: Iterable[str], itself: str) -> None:
    """The imports ``lines``, less those of ``itself`` (the definitions written into it) and the names ``module``
    already imports (Lightning's `Callable` of `typing` where the prototype's is of `collections.abc`)."""
    bound = {(alias.asname or alias.name).split(".")[0] for node in ast.parse("".join(module.lines)).body
             if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    for line in lines:
        node = ast.parse(line).body[0]
        if isinstance(node, ast.ImportFrom) and node.module == itself:
            continue
        node.names = [alias for alias in node.names if (alias.asname or alias.name).split(".")[0] not in bound]
        if node.names:
            module.add_import(import_statement(ast.unparse(node)))


def _look_ahead(source: LightningSource) -> None:
    source.module("core.module").extend_docstring(
        "LightningModule.training_step",
        """
        To take the batches yourself, several per call or one ahead of the one you train, declare ``dataloader_iter``
        in place of ``batch`` and ``batch_idx``. Each ``next(dataloader_iter)`` returns ``(batch, batch_idx,
        dataloader_idx)``, the batch already through the transfer hooks, and every call of an epoch receives the same
        iterator. ``dataloader_iter.done`` is ``True`` once the epoch's last batch has been taken, and
        ``dataloader_iter.has_batches(k)`` tells whether ``k`` more batches remain, without taking any. Progress,
        ``limit_train_batches`` and ``val_check_interval`` count the batches the step took, and ``on_train_batch_start``
        receives the first batch the call gets. A call that the end of the data cuts short (``next()`` raising
        ``StopIteration`` inside the step) steps no optimizer for its batches and warns with
        :class:`~pytorch_lightning.utilities.warnings.CutShortCallWarning`; to avoid it, ask ``has_batches(k)`` first
        and return ``None`` when it is ``False``:

        .. code-block:: python

            def training_step(self, dataloader_iter):
                if not dataloader_iter.has_batches(2):
                    return None  # the epoch ends here: its last batch is left untrained, and the loop warns
                batches = [next(dataloader_iter)[0] for _ in range(2)]
                return self.loss(torch.cat(batches))
        """,
        before_section="Note:",
    )
    source.module("utilities.warnings").insert(
        definition_source(prototypes.batches_per_call.CutShortCallWarning, name="CutShortCallWarning")
    )
    fetchers = source.module("loops.fetchers")
    fetchers.replace("_DataLoaderIterDataFetcher", renamed(FETCHER, NAMES))
    fetchers.replace("_DataFetcherWrapper", renamed(STEP_ITERATOR, NAMES))
    for line in FETCHER_IMPORTS:
        fetchers.add_import(line)
    _write_parts(fetchers, FETCHER_PARTS, FETCHERS, before="_DataLoaderIterDataFetcher")
    utilities = source.module("loops.utilities")
    # their annotations (`X | None`) need it on Python 3.9, as the fetcher's do
    utilities.add_import("from __future__ import annotations")
    _write_parts(utilities, UTILITIES_PARTS, UTILITIES)
    for dotted, (definition, before, needs) in WRITTEN_INTO_ITS_USER.items():
        module = source.module(dotted)
        module.insert(definition, before=before)
        if needs is not None:
            module.add_import(needs)

    utilities.add_parameters(
        "_select_data_fetcher", "progress: Optional[_Progress] = None, drain_dataloader: Optional[Callable] = None"
    )
    utilities.add_import("from pytorch_lightning.loops.progress import _Progress")
    utilities.replace_statement(
        "_select_data_fetcher",
        calls("_DataLoaderIterDataFetcher"),
        """
        # `progress` counts the batches the step consumes; `drain_dataloader`: an evaluation loop's drain calls at
        # the end of a dataloader (training drains in its epoch loop)
        return _DataLoaderIterDataFetcher(trainer, step_fx_name, progress, drain_dataloader)
        """,
    )

    for module, loop in (("loops.evaluation_loop", "_EvaluationLoop"), ("loops.prediction_loop", "_PredictionLoop")):
        source.module(module).replace_statement(
            f"{loop}.reset",
            assigns("data_fetcher"),
            "data_fetcher = _select_data_fetcher(self.trainer, self.trainer.state.stage, self.batch_progress)",
        )

    fit_loop = source.module("loops.fit_loop")
    fit_loop.insert_in_body(
        "_FitLoop.__init__",
        """
        # the installed fetcher when the training step takes `dataloader_iter`, else None: decided once per
        # fetcher, since the loops ask on every batch
        self.prefetching_fetcher: Optional[_DataLoaderIterDataFetcher] = None
        """,
        after=assigns("self._data_fetcher"),
    )
    fit_loop.add_import("from pytorch_lightning.loops.fetchers import _DataLoaderIterDataFetcher")
    fit_loop.replace_statement(
        "_FitLoop.setup_data",
        assigns("self._data_fetcher"),
        """
        self._data_fetcher = _select_data_fetcher(trainer, RunningStage.TRAINING, self.epoch_loop.batch_progress)
        fetcher = self._data_fetcher
        self.prefetching_fetcher = fetcher if isinstance(fetcher, _DataLoaderIterDataFetcher) else None
        """,
    )
    fit_loop.insert_in_body(
        "_FitLoop.__init__",
        """
        self.cut_short_call_reported = False  # this fit warned of a step call cut short by the end of the data
        """,
        after=assigns("self._data_fetcher"),
    )
    fit_loop.insert_in_body("_FitLoop.on_run_start", "self.cut_short_call_reported = False", at_start=True)
    fit_loop.insert_in_body(
        "_FitLoop.on_advance_end",
        """
        if self.prefetching_fetcher is not None:
            self.prefetching_fetcher.stop()  # the epoch's producer must not outlive it
        """,
        at_start=True,
    )
    fit_loop.insert_in_body(
        "_FitLoop.teardown",
        """
        self.prefetching_fetcher = None
        """,
        at_end=True,
    )


def _training_start_hook_sees_the_step_batch(test: ModuleSource) -> None:
    test.replace_statement(
        "test_training_loop_dataloader_iter_multiple_dataloaders", asserts("model.batch_start_ins"),
        "assert model.batch_start_ins == model.step_outs",
    )


def _evaluation_start_hook_sees_the_step_batch(test: ModuleSource) -> None:
    test.replace_statement(
        "test_evaluation_loop_dataloader_iter_multiple_dataloaders", asserts("model.batch_start_ins"),
        """
        # on_validation_batch_start receives the batch the step gets first: the fetcher looks one batch ahead
        assert model.batch_start_ins == model.step_outs
        """,
        comments_above=True,
    )


def _prediction_start_hook_sees_the_step_batch(test: ModuleSource) -> None:
    test.replace_statement(
        "test_prediction_loop_with_iterable_dataset", asserts("model.batch_start_ins"),
        "assert model.batch_start_ins == model.step_outs",
    )


def _built_for_a_trainer(test: ModuleSource, name: str) -> None:
    test.substitute(name, r"_DataLoaderIterDataFetcher\(\)", "_training_step_fetcher()")


def _done_is_exact_for_unsized_data(test: ModuleSource) -> None:
    # the helper the fetcher's unit tests build it with, added with the first of them
    test.add_import("from lightning.pytorch.loops.progress import _Progress")
    test.insert(
        """
        def _training_step_fetcher():
            \"\"\"The fetcher the loops choose for ``training_step(self, dataloader_iter)``, built for a Trainer.\"\"\"
            trainer = Trainer(
                accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
            )
            trainer.strategy.connect(BoringModel())
            return _DataLoaderIterDataFetcher(trainer, "training_step", _Progress())
        """,
        before="test_done_dataloader_iter",
    )
    name = "test_done_dataloader_iter"
    _built_for_a_trainer(test, name)
    test.remove_statement(name, asserts("dataloader_iter.data_fetcher"))
    test.replace_statement(
        name, lambda node: isinstance(node, ast.If) and ast.unparse(node.test) == "isinstance(iterable, list)",
        "assert dataloader_iter.done  # the fetcher looks one batch ahead: exact for unsized data too",
        comments_above=True,
    )


def _done_is_exact_with_a_limit(test: ModuleSource) -> None:
    name = "test_done_dataloader_iter_with_limit"
    _built_for_a_trainer(test, name)
    for case in UNSIZED_CASES_NOW_KNOWN:
        test.substitute(name, rf"^(\s*){re.escape(case)}, False\),.*$",
                        rf"\g<1>{case}, True),  # looked ahead: exact for unsized data too")
    test.substitute(name, r"# not sized, no prefetching -> can't know$", "# the second dataloader is left")
    test.replace_statement(
        name, lambda node: isinstance(node, ast.For),
        """
        for _ in range(num_fetches):
            if dataloader_iter.done:  # `sequential`: the step gets each dataloader's iterator in turn
                dataloader_iter = next(fetcher)
            next(dataloader_iter)
        """,
    )
    test.replace_statement(
        name, asserts_exactly("dataloader_iter.done == expected"),
        "assert dataloader_iter.done == expected or mode == \"sequential\"  # it ends with its dataloader",
    )


def _empty_cycled_iterable_is_done(test: ModuleSource) -> None:
    name = "test_done_dataloader_iter_empty_iterables"
    _built_for_a_trainer(test, name)
    test.replace_statement(
        name, asserts_exactly("fetcher.done == (mode == 'min_size')"),
        """
        # `max_size_cycle` cycles the empty iterable: its length is 3, but it yields nothing
        assert fetcher.done == (mode in ("min_size", "max_size_cycle"))
        """,
    )


# the cases of an unsized loader whose end the released fetcher could not know before reading past it
UNSIZED_CASES_NOW_KNOWN = (
    '("min_size", [IterDataset()], None, 3', '("min_size", [IterDataset(2), IterDataset(3)], None, 2',
    '("max_size", [IterDataset(2), IterDataset(3)], 100, 3',
    '("max_size_cycle", [IterDataset(2), IterDataset(3)], 100, 3',
    '("sequential", [IterDataset(2), IterDataset(3)], 100, 5', '("max_size", [IterDataset(2), [1, 2, 3]], None, 3',
    '("max_size_cycle", [IterDataset(2), [1, 2, 3]], None, 3',
)
FETCHER_BUILT_FOR_A_TRAINER = (
    "the fetcher is built for the Trainer whose loop chooses it (it runs the transfer hooks and counts the batches "
    "in the loop's progress) and looks one batch ahead, so `done` is exact for unsized data too; the step's "
    "iterator ends with its dataloader"
)


START_HOOK_SEES_THE_STEP_BATCH = (
    "the batch-start hook received the previous call's batch (None at the first); it now receives the batch the "
    "step gets first"
)


ITEM = Item(
    2,
    "Look one batch ahead: one dataloader_iter per loop over a dataloader, from a fetcher of consumed batches",
    """
`_DataLoaderIterDataFetcher` handed the step an iterator over the fetcher itself: `done` was only known after the
step had tried to read past the end, `on_train_batch_start` saw the batch of the previous call, and nothing said
which batches the step had consumed. It is rewritten in `loops/fetchers.py`, and the iterator a step receives,
`_DataLoaderIter`, replaces `_DataFetcherWrapper`: the fetcher peeks one batch ahead, so `done` is exact and the batch
hooks see the batch the step gets first; it counts the batches handed out, records each step call's batches, and
hands every step call of a loop over a dataloader the same iterator, valid until that loop ends. A `next()` between
two calls (a pipeline's own loading thread) counts toward the next call. It loads each batch on the step's thread, as
the step asks for it (a prefetch thread is not part of this change). What it is built from, the producer that reads
and transfers the batches and the record of the step calls, and what the other loops share with it (the record of a
step call, the batch transfer, the ranks' vote) are written before it in `loops/fetchers.py`; the drain calls and
what the optimisation loops do for such a step go among the loops' helpers in `loops/utilities.py`, which imports
`loops/fetchers.py` and whose `_is_max_limit_reached` they use. No module is added, and each definition is private in
its module. The fetcher is built for the Trainer whose loop chooses it, so its unit tests in `loops/test_fetchers.py`
build it for one; with `from __future__ import annotations`, which the annotations written into both modules need on
Python 3.9, Lightning's ruff rewrites their older annotations (five in `loops/fetchers.py`, seven in
`loops/utilities.py`). A training step
call cut short by the end of the data warns with `CutShortCallWarning`, public in
`pytorch_lightning.utilities.warnings`, so that a user can filter it or make it an error by its category.
""",
    _look_ahead,
    changelog=(
        ("Changed", (
            "A step taking `dataloader_iter` gets one iterator for every call over a dataloader, looking one "
            "batch ahead: `dataloader_iter.done` is exact, and `on_train_batch_start` receives the batch the "
            "step gets first"
        )),
        ("Added", (
            "Added `dataloader_iter.has_batches(k)`, whether at least `k` more batches remain for the step, "
            "without taking any"
        )),
        ("Added", (
            "Added `pytorch_lightning.utilities.warnings.CutShortCallWarning`, the category of the warning a "
            "`training_step(dataloader_iter)` call cut short by the end of the data gives"
        )),
    ),
    tests=("helpers/dataloader_iter.py", "loops/test_dataloader_iter_fetcher.py"),
    updated_tests=(
        UpdatedTest("loops/test_fetchers.py", "test_done_dataloader_iter", FETCHER_BUILT_FOR_A_TRAINER,
                    _done_is_exact_for_unsized_data),
        UpdatedTest("loops/test_fetchers.py", "test_done_dataloader_iter_with_limit", FETCHER_BUILT_FOR_A_TRAINER,
                    _done_is_exact_with_a_limit),
        UpdatedTest("loops/test_fetchers.py", "test_done_dataloader_iter_empty_iterables",
                    FETCHER_BUILT_FOR_A_TRAINER, _empty_cycled_iterable_is_done),
        UpdatedTest("loops/test_fetchers.py", "test_done_dataloader_iter_zero_limit", FETCHER_BUILT_FOR_A_TRAINER,
                    functools.partial(_built_for_a_trainer, name="test_done_dataloader_iter_zero_limit")),
        UpdatedTest(
            "loops/test_training_epoch_loop.py", "test_training_loop_dataloader_iter_multiple_dataloaders",
            START_HOOK_SEES_THE_STEP_BATCH, _training_start_hook_sees_the_step_batch,
        ),
        UpdatedTest(
            "loops/test_evaluation_loop.py", "test_evaluation_loop_dataloader_iter_multiple_dataloaders",
            START_HOOK_SEES_THE_STEP_BATCH, _evaluation_start_hook_sees_the_step_batch,
        ),
        UpdatedTest(
            "loops/test_prediction_loop.py", "test_prediction_loop_with_iterable_dataset",
            START_HOOK_SEES_THE_STEP_BATCH, _prediction_start_hook_sees_the_step_batch,
        ),
    ),
)
