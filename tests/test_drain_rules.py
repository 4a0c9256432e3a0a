"""The drain decision: when the loop makes drain calls, decided by the flavour's real clients, run unmodified.

After the step call that took a dataloader's last batch, a step that pulled batches ahead still holds some, and a
drain call (C17) lets it train them; a step that trains what it pulls needs none, and on a pipeline stage after the
first a drain call waits for an activation the first stage, out of batches, never sends. Each client below runs its
own code as its project writes it, under every candidate rule (``common.DRAIN_RULES``, the recommended
design's ``drain`` option) and under stock Lightning, and is judged against the same client driven by a plain loop
over the same batches: the batches it trained per epoch and its final weights, or a hang (C16's deadlines), or an
error.

The clients: a simple step; Lightning's own async-handle pattern (its tests of the flavour); TorchRec's five train
pipelines and ``EvalPipelineSparseDist`` (``torchrec_client``, ``TorchRecModule``); NeMo's step over megatron-core's
schedules, without the look-ahead check (the step NeMo runs today), on one stage (``megatron_client``) and on two
(``megatron_pipeline``), ``k`` 2 and 3, 12 and 13 batches per epoch, sized and unsized loaders.

The default suite runs NeMo's unmodified two-stage step under the rule that ships (the design's default), the one
client the conformance suite does not already run so: it must train what the plain loop trains, or, where the data
ends inside a call, stop at the process group's timeout with the error naming its fix. The RFC's table of every
rule and client::

    python -m tests.test_drain_rules rfc/results/drain-rules.json
"""

from __future__ import annotations

import contextlib
import inspect
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
from prototypes.common import DRAIN_RULES, VOTE_FAILED_AFTER_A_CALL_CUT_SHORT, Design
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


def rule_designs() -> dict[str, Design]:
    """Stock Lightning and the recommended design under each candidate rule, by the rule's name."""
    return {STOCK: DESIGNS["upstream"], **{rule: DESIGNS["prefetcher"].variant(drain=rule) for rule in DRAIN_RULES}}


# the rule that ships: the recommended design's default
SHIPPED = inspect.signature(DESIGNS["prefetcher"].make_trainer).parameters["drain"].default


# --------------------------------------------------------------------------------------------------- outcomes
def outcome(trained: list, reference: list, warned: list[str], error: BaseException | dict | None = None,
            hung: bool = False, same_weights: bool = True) -> dict[str, Any]:
    """One client's run under one rule: its verdict beside the plain loop, and the counts behind it."""
    if isinstance(error, BaseException):
        error = describe_error(error)
    lost = sum(len(r) for r in reference) - sum(len(t) for t in trained)
    if error and VOTE_FAILED_AFTER_A_CALL_CUT_SHORT.split("{rank}")[1][:60] in error["message"]:
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
    return dict(verdict=verdict, trained_per_epoch=[len(t) for t in trained],
                plain_loop_per_epoch=[len(r) for r in reference], lost=lost if verdict.startswith("loses") else 0,
                error=None if error is None else f"{error['type'].rsplit('.', 1)[-1]}: {error['message'][:160]}")


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts: list[str] = []
        yield texts
        texts += [str(w.message) for w in caught]


def fit_and_judge(fit: Callable[[], tuple[list, list, bool]]) -> dict[str, Any]:
    """``fit()`` returns (trained per epoch, the plain loop's, same weights); an error it raises is the outcome."""
    error = None
    with recorded_warnings() as warned:
        try:
            trained, reference, same = fit()
        except Exception as raised:  # noqa: BLE001 - an error is an outcome of the rule under test
            error = raised
    if error is not None:
        return outcome([], [[]], warned, error)
    return outcome(trained, reference, warned, same_weights=same)


def close(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(p.detach(), reference[name]) for name, p in model.named_parameters())


# --------------------------------------------------------------------------------------------------- the clients
def simple_step(design: Design, kind: str) -> dict[str, Any]:
    def fit():
        module = IterStepModule((1,))
        loader = make_loader(kind, n_items=SIMPLE_BATCHES * ITEMS_PER_BATCH)
        make_trainer(design, max_epochs=EPOCHS).fit(module, loader)
        received = [[batch for batch, _ in epoch] for epoch in module.record.received_in_epochs()]
        return received, [loader_sequence(loader)] * EPOCHS, True
    return fit_and_judge(fit)


def async_handle(design: Design, kind: str) -> dict[str, Any]:
    def fit():
        module = AsyncHandleModule()
        loader = make_loader(kind, n_items=SIMPLE_BATCHES * ITEMS_PER_BATCH)
        make_trainer(design, max_epochs=EPOCHS).fit(module, loader)
        return module.trained, [loader_sequence(loader)] * EPOCHS, True
    return fit_and_judge(fit)


def torchrec_pipeline(design: Design, pipeline: str, kind: str) -> dict[str, Any]:
    from tests.conformance import torchrec_client as client
    from tests.conformance.torchrec_cpu_streams import cpu_stream_stand_ins

    def fit():
        module = client.TorchRecModule(pipeline)
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS, "limit_val_batches": 0})
        with cpu_stream_stand_ins():
            trainer.fit(module, client.make_loader(kind, 0))
            trained, weights, _ = client.plain_loop(pipeline, module.initial, client.make_loader(kind, 0))
        return module.trained, trained, close(module.model, weights)
    return fit_and_judge(fit)


def torchrec_eval_pipeline(design: Design, kind: str) -> dict[str, Any]:
    from tests.conformance import torchrec_client as client

    def fit():
        module = client.TorchRecModule("TrainPipelineSparseDist", eval_pipeline=True)
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS})
        trainer.fit(module, client.make_loader(kind, 0), client.make_loader(kind, 0))
        _, _, evaluated = client.plain_loop("TrainPipelineSparseDist", module.initial, client.make_loader(kind, 0),
                                            (client.make_loader(kind, 0),))
        return module.validated, [[ids for ids, _ in run] for run in evaluated], True
    return fit_and_judge(fit)


def nemo_one_stage(design: Design, micro_batches: int, batches: int, sized: int) -> dict[str, Any]:
    from tests.conformance import megatron_client as client

    def fit():
        kind = "sized" if sized else "unsized"
        module = client.NeMoStyleModule(micro_batches)  # NeMo's step: no look-ahead check
        trainer = make_trainer(design, **{**QUIET, "max_epochs": client.EPOCHS, "limit_val_batches": 0})
        trainer.fit(module, make_loader(kind, batches * ITEMS_PER_BATCH))
        reference = client.plain_loop(micro_batches, module.initial, make_loader(kind, batches * ITEMS_PER_BATCH),
                                      None)
        steps = [b - a for a, b in zip([0, *module.global_steps], module.global_steps, strict=False)]
        same = steps == reference.steps and close(module.model, reference.weights)
        return module.trained, reference.trained, same
    return fit_and_judge(fit)


def nemo_two_stages(design: Design, groups_at_once: int = GROUPS_AT_ONCE) -> dict[tuple, dict[str, Any]]:
    """Every two-stage run of NeMo's unmodified step under ``design``, each on a process group of its own,
    ``groups_at_once`` at a time."""
    from tests.conformance.megatron_pipeline import MEGATRON_PIPELINE, UNMODIFIED, fit_stage

    runs = {run: (MEGATRON_PIPELINE, (*run, UNMODIFIED)) for run in MEGATRON_RUNS}
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


def single_process_cases() -> list[tuple[str, str, Callable[[Design], dict[str, Any]]]]:
    """(client, case, run) for every client that runs in this process."""
    from tests.conformance.torchrec_client import PIPELINES

    cases = [("simple step", kind, lambda d, kind=kind: simple_step(d, kind)) for kind in LOADER_KINDS]
    cases += [("async-handle (Lightning's tests)", kind, lambda d, kind=kind: async_handle(d, kind))
              for kind in LOADER_KINDS]
    cases += [(f"TorchRec {pipeline}", kind, lambda d, p=pipeline, kind=kind: torchrec_pipeline(d, p, kind))
              for pipeline in PIPELINES for kind in LOADER_KINDS]
    cases += [("TorchRec EvalPipelineSparseDist", kind, lambda d, kind=kind: torchrec_eval_pipeline(d, kind))
              for kind in LOADER_KINDS]
    cases += [("NeMo, one stage", megatron_case(run), lambda d, run=run: nemo_one_stage(d, *run))
              for run in MEGATRON_RUNS]
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


def measure(rules: dict[str, Design]) -> list[dict[str, Any]]:
    """Every client under every rule in ``rules``: one row per (client, case, rule)."""
    rows = []
    for rule, design in rules.items():  # the two-stage launches first: a rank forks this process, no group in it
        for run, judged in nemo_two_stages(design).items():
            rows.append(dict(client="NeMo, two pipeline stages", case=megatron_case(run), rule=rule, **judged))
    cases = single_process_cases()
    for client in dict.fromkeys(client for client, _, _ in cases):
        with process_group(client):
            for rule, design in rules.items():
                for name, case, run in cases:
                    if name == client:
                        rows.append(dict(client=client, case=case, rule=rule, **run(design)))
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
def test_nemos_unmodified_two_stage_step_trains_or_names_its_fix_under_the_shipped_rule():
    """The one client the conformance suite does not run under the shipped rule as its project writes it: C17 and
    C19 run the others (the simple and async-handle steps, TorchRec's pipelines, NeMo's step on one stage) against
    the same plain loops, and C19's two-stage step checks ``has_batches(k)`` first."""
    # four groups at a time: half the runs wait out the process group's timeout, idle
    judged = nemo_two_stages(rule_designs()[SHIPPED], groups_at_once=4)
    bad = {run: row for run, row in judged.items() if row["verdict"] not in ACCEPTED}
    assert not bad, "under the drain rule that ships:\n" + "\n".join(
        f"  {megatron_case(run)}: {row['verdict']}, trained {row['trained_per_epoch']} per epoch, the plain loop"
        f" {row['plain_loop_per_epoch']}; {row['error'] or ''}" for run, row in bad.items()
    )
    whole = [run for run in judged if run[1] % run[0] == 0]
    assert all(judged[run]["verdict"] == "as the plain loop" for run in whole), (
        "where k divides the epoch NeMo's step needs no change: " + str({run: judged[run]["verdict"] for run in whole})
    )


def main(argv: list[str]) -> int:
    """``python -m tests.test_drain_rules PATH``: every client under every rule and stock, written to PATH."""
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")  # the clients' own notices; each run records what it warned itself
    setup = harness_common.conformance_setup()  # the code as it was when the runs started
    rows = measure(rule_designs())
    payload = dict(schema=1, setup=setup, shipped=SHIPPED, rules=[STOCK, *DRAIN_RULES], rows=rows)
    path = Path(argv[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"{len(rows)} runs written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
