"""[RFC 10] Misuse is refused with a message that names the fix."""

import ast
import json

from patch.edits import LightningSource, ModuleSource, calls
from patch.items import Item, UpdatedTest
from patch.items.look_ahead import UTILITIES
from patch.transplant import definition_source
from prototypes.common import DATALOADER_ITER, refuse_mixed_step_signature


def _refuse_misuse(source: LightningSource) -> None:
    utilities = source.module("loops.utilities")
    utilities.insert(
        definition_source(
            refuse_mixed_step_signature,
            name="_refuse_mixed_step_signature",
            constants={"DATALOADER_ITER": json.dumps(DATALOADER_ITER)},
            # the selection calls it only for a step that declares `dataloader_iter`
            substitutions={"    if DATALOADER_ITER not in parameters:\n        return\n": ""},
        ),
        before="_select_data_fetcher",
    )
    # before Lightning's experimental-flavour warning, as the first thing the flavour's selection does
    utilities.insert_in_body(
        "_select_data_fetcher", "_refuse_mixed_step_signature(step_fx, step_fx_name)", before=calls("rank_zero_warn")
    )
    manual = source.module("loops.optimization.manual")
    manual.add_import(f"from {UTILITIES} import _discard_cut_short_call")
    manual.replace_statement(
        "_ManualOptimization.run",
        lambda node: isinstance(node, ast.With),
        """
        fetcher = self.trainer.fit_loop.prefetching_fetcher
        if fetcher is None:
            with suppress(StopIteration):  # no loop to break at this level
                self.advance(kwargs)
        else:
            try:
                self.advance(kwargs)
            except StopIteration:
                fetcher.step_stopped()  # the end of the data ends the call; any other StopIteration is an error
                _discard_cut_short_call(self.trainer, fetcher.calls.call.consumed)
                return {}
            finally:
                fetcher.end_step_call()
        """,
    )


def _foreign_stop_iteration_is_an_error(test: ModuleSource) -> None:
    name = "test_stop_iteration_with_dataloader_iter"
    test.remove_statement(name, lambda n: isinstance(n, ast.If) and ast.unparse(n.test) == "trigger_stop_iteration")
    test.insert_in_body(
        name,
        """
        if trigger_stop_iteration:
            # this StopIteration does not come from dataloader_iter, which has batches left: ending the epoch there
            # would silently skip them
            with pytest.raises(RuntimeError, match="did not come from dataloader_iter"):
                trainer.fit(m)
            return
        """,
        before=calls("trainer.fit"),
    )


ITEM = Item(
    10,
    "Misuse of the dataloader_iter flavour is refused with a message that names the fix",
    """
A step taking both a batch and `dataloader_iter`, such as `training_step(self, batch, dataloader_iter)`, was
selected for the flavour by its parameter name and then called with the iterator alone, failing with Python's
"missing 1 required positional argument", which names neither the conflict nor the fix. The selection now refuses it
with a TypeError that names both ways to write the step. A `StopIteration` the step raises itself while its iterator
still has batches (not the iterator's own end) was taken for the end of the data and ended the epoch silently; it is
now a RuntimeError that says so.
""",
    _refuse_misuse,
    changelog=(
        ("Changed", (
            "A step taking both a batch and `dataloader_iter` is refused with a `TypeError` naming both ways "
            "to write it, and a `StopIteration` a step raises while its `dataloader_iter` still has batches "
            "is a `RuntimeError` instead of the silent end of the epoch"
        )),
    ),
    tests=("loops/test_dataloader_iter_misuse.py",),
    updated_tests=(
        UpdatedTest(
            "loops/test_fetchers.py", "test_stop_iteration_with_dataloader_iter",
            "the step raises a StopIteration of its own while dataloader_iter has batches left: that is now an error "
            "naming the fix, where it ended the epoch",
            _foreign_stop_iteration_is_an_error,
        ),
    ),
)
