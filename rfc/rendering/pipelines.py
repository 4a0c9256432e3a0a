"""The real-pipelines table (clause C19): batches each design trained per epoch, per TorchRec pipeline and loader, on
one process and on two ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.conformance import conformance_parts
from rendering.markdown import code, no_results, table
from rendering.results import CONFORMANCE_COMMAND, OUTCOME_KIND, PASS, Inputs

TWO_RANKS = "2 ranks"  # the loader column's prefix for the two-rank runs, whose counts are one list per rank
# test -> (the pipeline it runs, None where the test's first parameter names it; the loader column's prefix; its
# measured counts' keys)
REAL_PIPELINE_TESTS = {
    "test_c19_real_pipelines.py::test_train_pipeline_trains_every_batch_once_per_epoch":
        (None, "", "batches_trained_per_epoch", "plain_loop_batches_per_epoch"),
    "test_c19_real_pipelines.py::test_eval_pipeline_evaluates_every_batch_once_per_validation_run":
        ("EvalPipelineSparseDist", "", "batches_evaluated_per_run", "plain_loop_batches_per_run"),
    "test_c19_torchrec_two_ranks.py::test_each_rank_trains_its_batches_once_per_epoch":
        ("TrainPipelineSparseDist", f"{TWO_RANKS}, ", "batches_trained_per_epoch", "plain_loop_batches_per_epoch"),
    "test_c19_torchrec_two_ranks.py::test_each_rank_evaluates_both_validation_loaders_once_per_run":
        ("EvalPipelineSparseDist", f"{TWO_RANKS}, 2 loaders, ", "batches_evaluated_per_run",
         "plain_loop_batches_per_run"),
}


def _measured_runs(data: dict[str, Any]) -> dict[tuple[str, str], dict[str, tuple[list[int], list[int], bool]]]:
    """``{(pipeline, loader): {variant: (counted per epoch or run, the plain loop's, passed)}}``."""
    runs: dict[tuple[str, str], dict[str, tuple[list[int], list[int], bool]]] = {}
    for r in data["results"]:
        test_id, measured = r["test_id"], r.get("measured") or {}
        test, _, parameters = test_id.partition("[")
        if test not in REAL_PIPELINE_TESTS:
            continue
        pipeline, loader_prefix, counted, plain_loop = REAL_PIPELINE_TESTS[test]
        if counted not in measured:
            continue
        if pipeline is None:
            pipeline, parameters = parameters.split("-", 1)
        loader = loader_prefix + parameters.rstrip("]")
        passed = OUTCOME_KIND.get(r.get("outcome", "")) == PASS
        runs.setdefault((pipeline, loader), {})[r.get("variant") or r["design"]] = (
            measured[counted], measured[plain_loop], passed
        )
    return runs


def _counts(counts: list) -> str:
    """Per epoch (or run) ``8 · 8``; on two ranks, a list per rank: ``8 · 8 / 8 · 8`` (an empty list: none)."""
    if counts and isinstance(counts[0], list):
        return " / ".join(_counts(rank) or "none" for rank in counts)
    return " · ".join(str(n) for n in counts)


def _cell(trained: list, plain_loop: list, passed: bool) -> str:
    if passed:
        return f"{_counts(trained)} ✓"
    if not any(plain_loop):  # the plain loop did not run: the fit raised first
        return f"{_counts(trained)} ✗"
    return f"{_counts(trained)} of {_counts(plain_loop)} ✗"


# The limits of every run of the real clients, said wherever their results are rendered
CPU_STAND_INS = (
    "The clients run on the CPU, unmodified but for their CUDA-only lines on the CPU path, each replaced alone and "
    "named where it is replaced: TorchRec's side streams and `record_stream` for `TrainPipelineSemiSync` and "
    "`PrefetchTrainPipelineSparseDist` (`tests/conformance/torchrec_cpu_streams.py`), megatron-core's token counter "
    "and its point-to-point module's receive buffers and synchronize (`tests/conformance/megatron_client.py`, "
    "`tests/conformance/megatron_pipeline.py`); several ranks are gloo processes on one machine."
)


def block_real_pipelines(inputs: Inputs, page_dir: Path) -> str:
    """TorchRec pipeline x loader rows, a column per design (one per variant where its variants differ)."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    runs = _measured_runs(data)
    if not runs:
        return "The results file holds no measured runs of TorchRec's pipelines (clause C19)."
    _, _, _, design_of, variants = conformance_parts(data)
    variants = [v for v in variants if any(v in row for row in runs.values())]
    columns: list[tuple[str, list[str]]] = []  # (label, the variants it stands for)
    for design in dict.fromkeys(design_of[v] for v in variants):
        own = [v for v in variants if design_of[v] == design]
        alike = all(row.get(v) == row.get(own[0]) for row in runs.values() for v in own)
        columns += [(design, own)] if alike else [(v, [v]) for v in own]
    rows = []
    for (pipeline, loader), row in sorted(runs.items()):
        cells = [_cell(*row[vs[0]]) if vs[0] in row else "not run" for _, vs in columns]
        rows.append([code(pipeline), code(loader), *cells])
    legend = (
        "Batches trained in each epoch by TorchRec's train pipelines, run unmodified under each design (the user code "
        "of C17's migration note); ✓: every epoch trained every batch once, in order, to the weights of the same "
        "pipeline driven by a plain loop; ✗: the batches the plain loop trains per epoch follow *of*. `w0`, `w2`: "
        "DataLoader workers. `EvalPipelineSparseDist` runs in `validation_step`: its counts are the batches "
        "evaluated in each validation run. `2 ranks`: the tables sharded over two gloo ranks, each rank's counts "
        "(rank 0 / rank 1), each compared with the same pipelines driven by a plain loop on that rank; `2 loaders`: "
        "two validation dataloaders, a run's counts both loaders' batches. A fit that raised counts the epochs "
        "and runs it began, and its plain loop does not run (no *of*); `none`: a rank that reported nothing. "
        + CPU_STAND_INS
    )
    return legend + "\n\n" + table(["Pipeline", "Loader", *(code(label) for label, _ in columns)], rows)
