"""The drain decision: whether the loop calls a step again after a dataloader's last batch, decided by the flavour's
real clients.

After the step call that took a dataloader's last batch, a step that pulled batches ahead still holds some, and a
drain call (C17) lets it train them; a step that trains what it pulls needs none, and on a pipeline stage after the
first a drain call waits for an activation the first stage, out of batches, never sends. Each client below runs its
own code as its project writes it, in four columns: stock Lightning; the earlier prototype's automatic rule (the
``prefetcher`` design, which drains after a dataloader the step pulled ahead of its calls); and the patched Lightning
without and with the module's opt-in (``drain_dataloader_iter``), the only change the clients get. Each run is judged
against the same client driven by a plain loop over the same batches: the batches it trained or evaluated, its
final weights, the warnings naming batches left unused, a hang (C16's deadlines) or an error, and the calls it got
after its data ended that it did not ask for.

The clients: a simple step; Lightning's own async-handle pattern (its tests of the flavour); TorchRec's five train
pipelines with Lightning's optimizer wrapper and with the raw optimizer, and ``EvalPipelineSparseDist``
(``torchrec_client``, ``TorchRecModule``); NeMo's step over megatron-core's schedules, without the look-ahead check
(the step NeMo runs today), in training on one stage (``megatron_client``) and on two (``megatron_pipeline``), ``k``
2 and 3, 12 and 13 batches per epoch, and in validation over loaders of ``k``, ``2k`` and ``2k + 1`` batches; sized
and unsized loaders.

The default suite runs NeMo's unmodified two-stage step as the patched package ships it (no opt-in), the one client
the conformance suite does not already run so: it must train what the plain loop trains, or, where the data ends
inside a call, stop with an error naming its fix. The RFC's table: the stock and prototype columns run where Lightning
is stock, the patched ones in the patched environment (``python -m patch.environment``); each run adds its columns to
the file::

    python -m tests.test_drain_rules rfc/results/drain-rules.json
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import harness_common
from prototypes import DESIGNS
from prototypes.common import Design, takes_dataloader_iter
from tests.conformance.ddp import describe_error, launch
from tests.conformance.harness import QUIET, loader_sequence, make_loader, make_trainer
from tests.conformance.harness.modules import IterStepModule
from tests.conformance.pipelining import AsyncHandleModule

STOCK = "stock"
EPOCHS = 2
ITEMS_PER_BATCH = 2  # the harness loaders' batch size
SIMPLE_BATCHES = 6
MEGATRON_RUNS = [(k, n, sized) for k in (2, 3) for n in (12, 13) for sized in (1, 0)]
# Each two-stage run on a process group of its own (a hang must not take the next run down), two groups at once; a
# stage blocked in a collective raises at the process group's timeout (C16's), well inside the deadline.
GROUPS_AT_ONCE = 2
TWO_STAGE_DEADLINE_S = 60.0
# what a rule may do with a client: train what the plain loop trains, say what it leaves untrained, or stop at the
# process group's timeout with an error naming the client's fix (where no rule can tell, the RFC says why)
ACCEPTED = ("as the plain loop", "loses batches, warned", "times out, naming the fix")
NOT_TRAINED = "not trained"  # what every warning about batches left untrained says (C5, C16, C17)


PROTOTYPE = "prototype (automatic)"
PATCHED = "patched"
OPT_IN = "patched, opt-in"
COLUMNS = (STOCK, PROTOTYPE, PATCHED, OPT_IN)


def columns() -> dict[str, tuple[Design, bool]]:
    """The columns this environment runs, by name: (the design, whether the module opts in to drain calls)."""
    if DESIGNS["patched"].unavailable_reason() is None:
        return {PATCHED: (DESIGNS["patched"], False), OPT_IN: (DESIGNS["patched"], True)}
    return {STOCK: (DESIGNS["upstream"], False), PROTOTYPE: (DESIGNS["prefetcher"], False)}


def opted(module: Any, opt_in: bool) -> Any:
    """``module`` with the opt-in set as the column says, and a count of the calls it got after its data ended
    (``after_the_end``: entered with ``dataloader_iter.done`` already True) that it did not ask for."""
    module.drain_dataloader_iter = opt_in
    module.after_the_end = 0
    for name in ("training_step", "validation_step"):
        step = getattr(module, name)
        if not takes_dataloader_iter(step):
            continue

        @functools.wraps(step)
        def counted(dataloader_iter, *args, _step=step, **kwargs):
            module.after_the_end += bool(dataloader_iter.done) and not opt_in
            return _step(dataloader_iter, *args, **kwargs)

        setattr(module, name, counted)
    return module


# --------------------------------------------------------------------------------------------------- outcomes
def outcome(trained: list, reference: list, warned: list[str], error: BaseException | dict | None = None,
            hung: bool = False, same_weights: bool = True, after_the_end: int = 0) -> dict[str, Any]:
    """One client's run under one rule: its verdict beside the plain loop, and the counts behind it."""
    if isinstance(error, BaseException):
        error = describe_error(error)
    lost = sum(len(r) for r in reference) - sum(len(t) for t in trained)
    if error and "has_batches" in error["message"]:  # the error names the step's fix
        verdict = "times out, naming the fix"
    elif hung or (error and error["collective"]):
        verdict = "hangs"
    elif error:
        verdict = "error"
    elif trained == reference and same_weights:
        verdict = "as the plain loop"
    elif any(NOT_TRAINED in text for text in warned):
        verdict = "loses batches, warned"
    else:
        verdict = "loses batches silently"
    return dict(verdict=verdict, after_the_end=after_the_end, trained_per_epoch=[len(t) for t in trained],
                plain_loop_per_epoch=[len(r) for r in reference], lost=lost if verdict.startswith("loses") else 0,
                error=None if error is None else f"{error['type'].rsplit('.', 1)[-1]}: {error['message'][:160]}")


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts: list[str] = []
        yield texts
        texts += [str(w.message) for w in caught]


def fit_and_judge(fit: Callable[[], tuple[list, list, bool, int]]) -> dict[str, Any]:
    """``fit()`` returns (trained per epoch, the plain loop's, same weights, calls after the end unasked); an error it
    raises is the outcome."""
    error = None
    with recorded_warnings() as warned:
        try:
            trained, reference, same, after_the_end = fit()
        except Exception as raised:  # noqa: BLE001 - an error is an outcome of the column under test
            error = raised
    if error is not None:
        return outcome([], [[]], warned, error)
    return outcome(trained, reference, warned, same_weights=same, after_the_end=after_the_end)


def close(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(p.detach(), reference[name]) for name, p in model.named_parameters())


# --------------------------------------------------------------------------------------------------- the clients
def simple_step(column: tuple[Design, bool], kind: str) -> dict[str, Any]:
    design, opt_in = column

    def fit():
        module = opted(IterStepModule((1,)), opt_in)
        loader = make_loader(kind, n_items=SIMPLE_BATCHES * ITEMS_PER_BATCH)
        make_trainer(design, max_epochs=EPOCHS).fit(module, loader)
        received = [[batch for batch, _ in epoch] for epoch in module.record.received_in_epochs()]
        return received, [loader_sequence(loader)] * EPOCHS, True, module.after_the_end
    return fit_and_judge(fit)


def async_handle(column: tuple[Design, bool], kind: str) -> dict[str, Any]:
    design, opt_in = column

    def fit():
        module = opted(AsyncHandleModule(), opt_in)
        loader = make_loader(kind, n_items=SIMPLE_BATCHES * ITEMS_PER_BATCH)
        make_trainer(design, max_epochs=EPOCHS).fit(module, loader)
        return module.trained, [loader_sequence(loader)] * EPOCHS, True, module.after_the_end
    return fit_and_judge(fit)


def torchrec_pipeline(column: tuple[Design, bool], pipeline: str, kind: str, raw_optimizer: bool) -> dict[str, Any]:
    from tests.conformance import torchrec_client as client
    from tests.conformance.torchrec_cpu_streams import cpu_stream_stand_ins

    design, opt_in = column

    def fit():
        module = opted(client.TorchRecModule(pipeline, raw_optimizer=raw_optimizer), opt_in)
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS, "limit_val_batches": 0})
        with cpu_stream_stand_ins():
            trainer.fit(module, client.make_loader(kind, 0))
            trained, weights, _ = client.plain_loop(pipeline, module.initial, client.make_loader(kind, 0))
        return module.trained, trained, close(module.model, weights), module.after_the_end
    return fit_and_judge(fit)


def torchrec_eval_pipeline(column: tuple[Design, bool], kind: str) -> dict[str, Any]:
    from tests.conformance import torchrec_client as client

    design, opt_in = column

    def fit():
        module = opted(client.TorchRecModule("TrainPipelineSparseDist", eval_pipeline=True), opt_in)
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS})
        trainer.fit(module, client.make_loader(kind, 0), client.make_loader(kind, 0))
        _, _, evaluated = client.plain_loop("TrainPipelineSparseDist", module.initial, client.make_loader(kind, 0),
                                            (client.make_loader(kind, 0),))
        return module.validated, [[ids for ids, _ in run] for run in evaluated], True, module.after_the_end
    return fit_and_judge(fit)


def nemo_one_stage(column: tuple[Design, bool], micro_batches: int, batches: int, sized: int) -> dict[str, Any]:
    from tests.conformance import megatron_client as client

    design, opt_in = column

    def fit():
        kind = "sized" if sized else "unsized"
        module = opted(client.NeMoStyleModule(micro_batches), opt_in)  # NeMo's step: no look-ahead check
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS, "limit_val_batches": 0})
        trainer.fit(module, make_loader(kind, batches * ITEMS_PER_BATCH))
        reference = client.plain_loop(micro_batches, module.initial, make_loader(kind, batches * ITEMS_PER_BATCH),
                                      None)
        steps = [b - a for a, b in zip([0, *module.global_steps], module.global_steps, strict=False)]
        same = steps == reference.steps and close(module.model, reference.weights)
        return module.trained, reference.trained, same, module.after_the_end
    return fit_and_judge(fit)


def nemo_validation(column: tuple[Design, bool], micro_batches: int, batches: int, sized: int) -> dict[str, Any]:
    """NeMo's ``validation_step`` (megatron's schedule, ``forward_only``) over one validation run of ``batches``."""
    from tests.conformance import megatron_client as client

    design, opt_in = column

    def fit():
        loader = make_loader("sized" if sized else "unsized", batches * ITEMS_PER_BATCH)
        module = opted(client.NeMoStyleModule(micro_batches), opt_in)
        make_trainer(design, **QUIET).validate(module, loader, verbose=False)
        model, reference, batches_left = client.megatron_mlp(module.initial), [], iter(loader)
        with torch.no_grad():
            while True:
                try:
                    client.run_schedule(model, batches_left, micro_batches, forward_only=True, pulled=reference)
                except StopIteration:
                    break
        return module.validated, [reference], True, module.after_the_end
    return fit_and_judge(fit)


def nemo_two_stages(column: tuple[Design, bool], groups_at_once: int = GROUPS_AT_ONCE) -> dict[tuple, dict[str, Any]]:
    """Every two-stage run of NeMo's unmodified step in ``column``, each on a process group of its own,
    ``groups_at_once`` at a time."""
    from tests.conformance.megatron_pipeline import MEGATRON_PIPELINE, OPTS_IN, UNMODIFIED, fit_stage

    design, opt_in = column
    runs = {run: (MEGATRON_PIPELINE, (*run, UNMODIFIED, *([OPTS_IN] if opt_in else []))) for run in MEGATRON_RUNS}
    keys, launched = list(runs.values()), {}
    for at in range(0, len(keys), groups_at_once):
        launched |= launch(design, [[key] for key in keys[at:at + groups_at_once]], fit=fit_stage,
                           deadline_s=TWO_STAGE_DEADLINE_S)
    judged = {}
    for run, key in runs.items():
        result = launched[key]
        stages = result["ranks"]
        # the error that names a fix first: the rank that raised it is the one the loop could tell
        errors = sorted((stage["error"] for stage in stages if stage is not None and stage["error"] is not None),
                        key=lambda error: error["collective"])
        if result["hung"] or None in stages or errors:
            judged[run] = outcome([], [[]], [], errors[0] if errors else None, hung=not errors)
            continue
        same = all(stage["weights"] == stage["reference"]["weights"] for stage in stages)
        warned = [text for stage in stages for text in stage["warnings"]]
        judged[run] = outcome(stages[0]["trained"], stages[0]["reference"]["trained"], warned, same_weights=same)
    return judged


def megatron_case(run: tuple[int, int, int]) -> str:
    k, n, sized = run
    return f"k={k}, {n} batches, {'sized' if sized else 'unsized'}"


# --------------------------------------------------------------------------------------------------- the table
LOADER_KINDS = ("sized", "unsized")


VALIDATION_RUNS = [(k, n, sized) for k in (2, 3) for n in (k, 2 * k, 2 * k + 1) for sized in (1, 0)]


def single_process_cases() -> list[tuple[str, str, Callable[[tuple[Design, bool]], dict[str, Any]]]]:
    """(client, case, run) for every client that runs in this process."""
    from tests.conformance.torchrec_client import PIPELINES

    cases = [("simple step", kind, lambda c, kind=kind: simple_step(c, kind)) for kind in LOADER_KINDS]
    cases += [("async-handle (Lightning's tests)", kind, lambda c, kind=kind: async_handle(c, kind))
              for kind in LOADER_KINDS]
    cases += [(f"TorchRec {pipeline}{', raw optimizer' if raw else ''}", kind,
               lambda c, p=pipeline, kind=kind, raw=raw: torchrec_pipeline(c, p, kind, raw))
              for pipeline in PIPELINES for raw in (False, True) for kind in LOADER_KINDS]
    cases += [("TorchRec EvalPipelineSparseDist", kind, lambda c, kind=kind: torchrec_eval_pipeline(c, kind))
              for kind in LOADER_KINDS]
    cases += [("NeMo, one stage", megatron_case(run), lambda c, run=run: nemo_one_stage(c, *run))
              for run in MEGATRON_RUNS]
    cases += [("NeMo, one stage, validation", megatron_case(run), lambda c, run=run: nemo_validation(c, *run))
              for run in VALIDATION_RUNS]
    return cases


@contextlib.contextmanager
def process_group(client: str) -> Iterator[None]:
    """The one-rank process group a client needs (TorchRec's sharding, megatron's parallel state), one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    if client.startswith("TorchRec"):
        from tests.conformance.torchrec_client import SingleProcessGroup as Group
    else:
        from tests.conformance.megatron_client import MegatronParallelState as Group
    group = Group() if client.startswith(("TorchRec", "NeMo")) else None
    try:
        yield
    finally:
        if group is not None:
            group.close()
        torch.set_num_threads(threads)


def measure(columns: dict[str, tuple[Design, bool]]) -> list[dict[str, Any]]:
    """Every client in every column of ``columns``: one row per (client, case, column)."""
    rows = []
    for name, column in columns.items():  # the two-stage launches first: a rank forks this process, no group in it
        for run, judged in nemo_two_stages(column).items():
            rows.append(dict(client="NeMo, two pipeline stages", case=megatron_case(run), rule=name, **judged))
    cases = single_process_cases()
    for client in dict.fromkeys(client for client, _, _ in cases):
        with process_group(client):
            for name, column in columns.items():
                for client_name, case, run in cases:
                    if client_name == client:
                        rows.append(dict(client=client, case=case, rule=name, **run(column)))
    return rows


# --------------------------------------------------------------------------------------------------- the test
# the clients' own notices, not under test (as in C19's modules)
pytestmark = [
    pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning"),
    pytest.mark.filterwarnings("ignore:`broadcast_buffers` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:HeuristicalStorageReservation is known:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*dense_embedding_codegen_lookup_function.*:UserWarning"),
]


@pytest.mark.timeout(300)
def test_nemos_unmodified_two_stage_step_trains_or_names_its_fix_without_the_opt_in():
    """The one client the conformance suite does not run as its project writes it: C17 and C19 run the others (the
    simple and async-handle steps, TorchRec's pipelines, NeMo's step on one stage) against the same plain loops, and
    C19's two-stage step checks ``has_batches(k)`` first. Where the patched package is installed the column is the
    one it ships, no opt-in; elsewhere the earlier prototype's."""
    column = columns().get(PATCHED) or columns()[PROTOTYPE]
    # four groups at a time: half the runs wait out the process group's timeout, idle
    judged = nemo_two_stages(column, groups_at_once=4)
    bad = {run: row for run, row in judged.items() if row["verdict"] not in ACCEPTED}
    assert not bad, "as it ships:\n" + "\n".join(
        f"  {megatron_case(run)}: {row['verdict']}, trained {row['trained_per_epoch']} per epoch, the plain loop"
        f" {row['plain_loop_per_epoch']}; {row['error'] or ''}" for run, row in bad.items()
    )
    whole = [run for run in judged if run[1] % run[0] == 0]
    assert all(judged[run]["verdict"] == "as the plain loop" for run in whole), (
        "where k divides the epoch NeMo's step needs no change: " + str({run: judged[run]["verdict"] for run in whole})
    )


def main(argv: list[str]) -> int:
    """``python -m tests.test_drain_rules PATH``: every client in the columns this environment runs, added to PATH
    (the rows of the other columns it holds are kept)."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # the clients' own notices; each run records what it warned itself
    runnable = columns()
    path = Path(argv[0])
    previous = json.loads(path.read_text()) if path.is_file() else {}
    kept = [row for row in previous.get("rows", []) if row["rule"] not in runnable and row["rule"] in COLUMNS]
    rows = kept + measure(runnable)
    setups = {**{name: previous["setups"][name] for name in previous.get("setups", {}) if name not in runnable},
              **dict.fromkeys(runnable, harness_common.conformance_setup())}  # the code as it was when the runs began
    payload = dict(schema=2, setups=setups, columns=list(COLUMNS), rows=rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"{len(rows)} runs written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
