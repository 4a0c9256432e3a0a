"""[RFC 7] Evaluation and prediction steps get one iterator per dataloader, and their batch-start hooks the call's first
batch."""

import ast

import prototypes.prefetcher.loops
from patch.edits import LightningSource, ModuleSource, assigns
from patch.items import Item, UpdatedTest
from patch.items.draining import STEP_METHODS_TEST, count_drain_calls
from patch.items.look_ahead import NAMES, UTILITIES
from patch.transplant import definition_source, methods_source, renamed
from prototypes.lightning_changes.prediction import PredictionWriterSeesStepCalls
from prototypes.prefetcher.loops import _PrefetchingEvaluationLoop, _PrefetchingPredictionLoop

_STEP_CALL = "_step_call"
_NOT_THE_FETCHERS = (  # the prototype's guard for an iterator of Lightning's own fetcher
    "    if not isinstance(dataloader_iter, FetcherStepIterator):\n"
    "        return step(dataloader_iter, *args, **kwargs)\n"
)


def _is_the_while_loop(node: ast.stmt) -> bool:
    return isinstance(node, ast.While)


# What the prototype's loops take from their mixin and from a shadow of the strategy's step: inside Lightning, the
# loop's own step name, the drain call through `_step_call` directly, and (evaluation) no per-call record
_EVALUATION_STEPS = """
@property
def step_name(self) -> str:
    return "test_step" if self.trainer.testing else "validation_step"

def _on_step_returned(self, output: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
    \"\"\"After each step call taking ``dataloader_iter``, before its batch-end hooks.\"\"\"
"""
_WRITER_RECORD = ("_on_step_returned", "_on_drain_call_returned", "_seen_indices")
_DRAIN_CALL = """
def _run_drain_call(self) -> tuple[bool, Any]:
    \"\"\"One drain call at the end of the current dataloader: whether a StopIteration ended it, and its output.\"\"\"
    fetcher = self._data_fetcher
    step = functools.partial(call._call_strategy_hook, self.trainer, self.step_name)
    output = _step_call(self, step, fetcher.start_step_call(drain=True))
    return fetcher.calls.call.cut_short, output
"""


def _one_iterator_per_dataloader(source: LightningSource) -> None:
    # the evaluation step call, as the prototype runs it (the StopIteration at its dataloader's end ends the call),
    # among Lightning's helpers of the loops: both evaluation loops call it; the changed loops call it only with the
    # fetcher's iterator
    source.module("loops.utilities").insert(
        renamed(definition_source(prototypes.prefetcher.loops._step_call, name=_STEP_CALL,
                                  substitutions={_NOT_THE_FETCHERS: ""}),
                {**NAMES, "_PrefetchingEvaluationSteps": "Any"}),
        after="_select_data_fetcher",
    )
    for module, loop, hook, step, output, drain in (
        ("loops.evaluation_loop", "_EvaluationLoop", "_evaluation_step", "hook_name", "output",
         "self._drain_dataloader"),
        ("loops.prediction_loop", "_PredictionLoop", "_predict_step", '"predict_step"', "predictions",
         "self._drain_dataloader"),
    ):
        lightning = source.module(module)
        lightning.replace_statement(
            f"{loop}.reset",
            assigns("data_fetcher"),
            f"""
            data_fetcher = _select_data_fetcher(
                self.trainer, self.trainer.state.stage, self.batch_progress, {drain}
            )
            """,
        )
        lightning.add_import(f"from pytorch_lightning.loops.utilities import {_STEP_CALL}")
        lightning.add_import("import functools")
        strategy_step = f"call._call_strategy_hook(trainer, {step}, *step_args)"
        lightning.replace_statement(
            f"{loop}.{hook}",
            assigns(output),
            f"""
            {output} = (
                {_STEP_CALL}(self, functools.partial(call._call_strategy_hook, trainer, {step}), dataloader_iter)
                if using_dataloader_iter
                else {strategy_step}
            )
            """,
        )
        lightning.insert_in_body(
            f"{loop}.run",
            """
            if isinstance(data_fetcher, _DataLoaderIterDataFetcher):
                data_fetcher.stop()  # the run's producer must not outlive it
            """,
            after=_is_the_while_loop,
        )

    evaluation = source.module("loops.evaluation_loop")
    evaluation.add_import(f"from {UTILITIES} import _drain, _evaluation_drain_call")
    evaluation.insert(
        renamed(
            _EVALUATION_STEPS + _DRAIN_CALL + "\n" + methods_source(_PrefetchingEvaluationLoop, ("_drain_dataloader",)),
            NAMES,
        ),
        after="_EvaluationLoop._evaluation_step",
    )

    prediction = source.module("loops.prediction_loop")
    prediction.add_import(f"from {UTILITIES} import _drain, _prediction_drain_call")
    prediction.insert(
        renamed(
            'step_name = "predict_step"\n' + _DRAIN_CALL + "\n"
            + methods_source(_PrefetchingPredictionLoop, ("_drain_dataloader",)) + "\n"
            + methods_source(PredictionWriterSeesStepCalls, _WRITER_RECORD),
            NAMES,
        ),
        after="_PredictionLoop._predict_step",
    )
    prediction.insert_in_body(
        "_PredictionLoop._predict_step",
        """
        if using_dataloader_iter and data_fetcher.calls.call.cut_short and self._return_predictions:
            self._predictions[data_fetcher.dataloader_idx].pop()  # a call ended by StopIteration predicted nothing
        """,
        at_end=True,
    )


def _evaluation_counts_its_drain_calls(test: ModuleSource) -> None:
    count_drain_calls(test, ("sanity_validation", "validation", "test", "predict"))


ITEM = Item(
    7,
    "Evaluation and prediction steps get one iterator per dataloader; their batch-start hooks, the call's first batch",
    """
`validation_step`, `test_step` and `predict_step` taking `dataloader_iter` got Lightning's iterator over the whole run:
a step could read across dataloaders, and a `StopIteration` at one dataloader's end ended the run for all of them.
They now get the fetcher of the training loop: one iterator per dataloader, ending at that dataloader's last batch
(`done`, then `StopIteration`, which ends the call and not the run); the next dataloader starts a new call, and the
batch-start hooks see the batch the call gets first. Where the step pulled ahead over a dataloader (item 3's rule),
the loop makes drain calls at that dataloader's end, before it moves on: a validation or test drain call's output
joins the run's logged aggregates, a prediction drain call's prediction joins the results in order.
""",
    _one_iterator_per_dataloader,
    changelog=(
        ("Changed", (
            "A `validation_step`, `test_step` or `predict_step` taking `dataloader_iter` gets one iterator "
            "per dataloader, its batch-start hooks the call's first batch, and, where it pulled batches "
            "ahead, calls after the dataloader's last batch until it holds none"
        )),
    ),
    tests=("loops/test_dataloader_iter_evaluation.py",),
    updated_tests=(
        UpdatedTest(
            "loops/test_fetchers.py", STEP_METHODS_TEST,
            "where an evaluation or prediction dataloader is a single call's two batches, the loop drains it: the "
            "step is entered once more and its next() raises StopIteration",
            _evaluation_counts_its_drain_calls,
        ),
    ),
)
