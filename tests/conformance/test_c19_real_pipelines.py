"""C19 Real pipelines: TorchRec's own train pipelines, unmodified, train every batch exactly once per epoch.

C17 is argued with the suite's own pipelining steps; this clause runs the client the flavour exists for (#8316):
TorchRec 1.8.0's ``TrainPipelineBase`` (one batch held across calls) and ``TrainPipelineSparseDist`` (two held,
``next(it, None)`` to refill while it still holds them) over a ``DistributedModelParallel`` model, on the CPU in a
single-process gloo group; and ``TrainPipelineSemiSync`` and ``PrefetchTrainPipelineSparseDist`` (three in flight), with
CPU stand-ins for their stream objects only, named in ``torchrec_cpu_streams.py``: ``CpuSideStream`` for the side
streams TorchRec creates only on a GPU (``with_cpu_side_streams``), ``record_stream`` a no-op on CPU tensors
(``cpu_stream_stand_ins``); their batch handling runs unmodified. Each epoch must train the loader's batches once,
in order, validation after each epoch must see its loader's batches once, and the final weights must equal the same
pipeline driven by a plain loop over the same batches. ``EvalPipelineSparseDist`` in ``validation_step``: its
loading thread binds to the first ``dataloader_iter`` it is handed and pulls from it between and during the step
calls (the iterator is one object per evaluation run, C14 a), and it holds two batches at the end of the data (the
run's drain calls, C17). The same on two ranks: ``test_c19_torchrec_two_ranks.py``.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from tests.conformance.harness import QUIET, make_trainer
from tests.conformance.torchrec_client import (
    EPOCHS,
    PIPELINES,
    SingleProcessGroup,
    TorchRecModule,
    loader_ids,
    make_loader,
    plain_loop,
)
from tests.conformance.torchrec_cpu_streams import cpu_stream_stand_ins

pytestmark = [
    pytest.mark.clause("C19"),
    pytest.mark.timeout(120),
    # TorchRec's own notices, not under test: a DDP argument and a planner default it uses, and fbgemm's CPU
    # lookup, whose backward torch runs through its fallback (the plain loop runs the same kernels)
    pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:HeuristicalStorageReservation is known:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*dense_embedding_codegen_lookup_function.*:UserWarning"),
]

LOADERS = [
    pytest.param("sized", 0, id="sized-w0"),
    pytest.param("sized", 2, id="sized-w2"),
    pytest.param("unsized", 0, id="unsized-w0"),
    pytest.param("unsized", 2, id="unsized-w2"),
]
# the pipelines that run only with the CPU stand-ins for their stream objects; workers change nothing the stand-ins
# touch, so these run without (each case costs a fit per design)
STREAM_PIPELINES = ["TrainPipelineSemiSync", "PrefetchTrainPipelineSparseDist"]
PIPELINE_RUNS = [
    pytest.param(pipeline, *loader.values, id=f"{pipeline}-{loader.id}")
    for pipeline in PIPELINES
    for loader in LOADERS
    if pipeline not in STREAM_PIPELINES or loader.id == "sized-w0"
]


@pytest.fixture(scope="module", autouse=True)
def process_group():
    # one intra-op thread, as each rank of the two-rank runs has: FBGEMM's CPU backward of the fused tables runs an
    # OpenMP region per batch, and with a second thread on two busy cores a plain loop took 5-8 times as long
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    group = SingleProcessGroup()
    yield
    group.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def plain_loop_runs():
    """The plain loop's (trained, weights) per pipeline and loader: one run each, shared by the designs."""
    runs: dict[tuple[str, str, int, bool], tuple[list, dict, list]] = {}

    def run(pipeline: str, kind: str, workers: int, initial: dict, evaluate: bool = False) -> tuple[list, dict, list]:
        if (pipeline, kind, workers, evaluate) not in runs:
            eval_loaders = (make_loader(kind, workers),) if evaluate else ()
            runs[pipeline, kind, workers, evaluate] = plain_loop(pipeline, initial, make_loader(kind, workers),
                                                                 eval_loaders)
        return runs[pipeline, kind, workers, evaluate]

    return run


@pytest.mark.parametrize("pipeline,kind,workers", PIPELINE_RUNS)
def test_train_pipeline_trains_every_batch_once_per_epoch(design, plain_loop_runs, record_property, pipeline, kind,
                                                         workers):
    module = TorchRecModule(pipeline)
    trainer = make_trainer(design, **{**QUIET, "max_epochs": EPOCHS})
    with cpu_stream_stand_ins() if pipeline in STREAM_PIPELINES else nullcontext():
        # validation between the epochs, over a loader of the same kind: the batches a pipeline holds at an epoch's
        # end are that epoch's training, and validation must not disturb what the pipeline holds
        trainer.fit(module, make_loader(kind, num_workers=workers), make_loader(kind, num_workers=workers))
        reference_trained, reference_weights, _ = plain_loop_runs(pipeline, kind, workers, module.initial)
    sequence = loader_ids(make_loader(kind, workers))
    # the RFC's real-pipelines table: batches trained per epoch, whatever the outcome
    record_property("batches_trained_per_epoch", [len(epoch) for epoch in module.trained])
    record_property("plain_loop_batches_per_epoch", [len(epoch) for epoch in reference_trained])
    assert reference_trained == [sequence] * EPOCHS, "the plain loop itself does not train every batch once"
    assert module.trained == reference_trained, (
        f"sample ids trained per epoch {module.trained}; the plain loop over the same batches trains {sequence}"
        " every epoch"
    )
    assert module.validated == [sequence] * EPOCHS, (
        f"sample ids validated per validation run {module.validated}; expected {sequence} after each epoch"
    )
    assert trainer.global_step == EPOCHS * len(sequence), (
        f"global_step {trainer.global_step}: the pipeline steps `self.optimizers()` once per batch trained"
    )
    for name, value in module.model.named_parameters():
        torch.testing.assert_close(value.detach(), reference_weights[name], msg=lambda m, name=name: (
            f"{name} differs from the same pipeline driven by a plain loop:\n{m}"
        ))


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("pipeline", list(PIPELINES))
def test_train_pipeline_with_the_raw_optimizer_trains_every_batch_once(design, plain_loop_runs, pipeline, kind):
    """TorchRec's own example style: the pipeline gets the raw optimizer and the step returns None. The drain calls
    that train a held batch step that optimizer, which is work (C17) though Lightning's counts never see it."""
    module = TorchRecModule(pipeline, raw_optimizer=True)
    trainer = make_trainer(design, **{**QUIET, "max_epochs": EPOCHS, "limit_val_batches": 0})
    with cpu_stream_stand_ins() if pipeline in STREAM_PIPELINES else nullcontext():
        trainer.fit(module, make_loader(kind, num_workers=0))
        reference_trained, reference_weights, _ = plain_loop_runs(pipeline, kind, 0, module.initial)
    sequence = loader_ids(make_loader(kind, 0))
    assert module.trained == reference_trained == [sequence] * EPOCHS, (
        f"sample ids trained per epoch {module.trained}; the plain loop over the same batches trains {sequence}"
        " every epoch"
    )
    assert trainer.global_step == 0, (
        f"global_step {trainer.global_step}: it counts the steps taken through Lightning's optimizer wrapper, and the"
        " pipeline steps the raw optimizer"
    )
    for name, value in module.model.named_parameters():
        torch.testing.assert_close(value.detach(), reference_weights[name])


@pytest.mark.parametrize("kind,workers", LOADERS)
def test_eval_pipeline_evaluates_every_batch_once_per_validation_run(design, plain_loop_runs, record_property, kind,
                                                                     workers):
    module = TorchRecModule("TrainPipelineSparseDist", eval_pipeline=True)
    trainer = make_trainer(design, **{**QUIET, "max_epochs": EPOCHS})
    trainer.fit(module, make_loader(kind, num_workers=workers), make_loader(kind, num_workers=workers))
    sequence = loader_ids(make_loader(kind, workers))
    _, _, reference = plain_loop_runs("TrainPipelineSparseDist", kind, workers, module.initial, evaluate=True)
    # the RFC's real-pipelines table: batches evaluated per validation run, whatever the outcome
    record_property("batches_evaluated_per_run", [len(run) for run in module.validated])
    record_property("plain_loop_batches_per_run", [len(run) for run in reference])
    assert [[ids for ids, _ in run] for run in reference] == [sequence] * EPOCHS, (
        "the plain loop itself does not evaluate every batch once"
    )
    assert module.validated == [sequence] * EPOCHS, (
        f"sample ids evaluated per validation run {module.validated}; EvalPipelineSparseDist driven by a plain loop"
        f" evaluates {sequence} after each epoch"
    )
    # the same losses: the same batches through the same model, trained alike between the runs
    torch.testing.assert_close(module.validation_losses, [[loss for _, loss in run] for run in reference])
