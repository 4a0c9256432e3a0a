"""The patch's cost (S3 across two environments): stock Lightning against the patched Lightning, in lockstep pairs.

S3 pairs two runs of one interpreter (``benchmarks.lockstep`` forks them). The patched Lightning replaces the
installed ``pytorch_lightning``, so it lives in an environment of its own (``python -m patch.environment``) and a
pair needs two interpreters: here each run is a child process of its environment's Python, and the two take turns
batch by batch on one core through pipes, with the same turn rule as S3 (``lockstep.Turns``). Each pair gives one
ratio, patched over stock, for the same S3 run (tiny model, L = 0, batch size 1) in both flavours; stock paired with
itself measures the method's own spread. Two more cases, shown and not judged, split the flavour's cost: the look-ahead
passes each batch through the transfer hooks as the regular step does (clause C4), and today's flavour does not. One
pairs the patched flavour with stock's regular step, which pays the same hooks; the other pairs today's flavour with
the patched flavour whose transfer is left out (``_leave_out_transfer``), which is the look-ahead's own work. Each
flavour's median ratio carries its 95 % interval and a verdict against the patch's targets: a regular module at most
1.01 of stock, the flavour at most 1.01 of today's flavour.

Beside the time, each case counts the Python bytecode instructions per batch in the same window, each side in a run
of its own under a trace function (``instructions``): a count has no run-to-run spread, so it tells a real difference
from the method's noise where the timed interval cannot, though an instruction's time varies, so it is not judged.

Why several builds of each environment (``--stock-python`` and ``--patched-python`` take several interpreters): two
builds of the same code, installed in environments of their own, differ in a lockstep pair by about as much as the
flavour's margin, so one pair of environments puts that difference into every pair of a run, beyond its interval.
Given several, the pairs cycle over every combination of a stock and a patched build, each in both orders, and stock
is paired with another build of stock: the interval then holds the builds' spread, and the control measures it.

    python -m benchmarks.patch_cost --patched-python .venv-patched/bin/python [...] [--stock-python PY [...]]
        [--pairs 24] [--batches 200] [--skip 20] [--out rfc/results/patch-cost.json]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import intervals
from benchmarks.lockstep import LOCKSTEP_TIMEOUT_S, Turns

FLAVOURS = ("regular", "dataloader_iter")
# the patch's targets: what a change written into Lightning may cost a regular module and today's flavour
THRESHOLDS = {"regular": 1.01, "dataloader_iter": 1.01}
SAME_ENVIRONMENT = "stock-over-stock"  # stock's flavour paired with itself: the lockstep's own spread
OVER_REGULAR = "dataloader_iter-over-regular"  # the patched flavour paired with stock's regular step
WITHOUT_TRANSFER = "dataloader_iter-without-transfer"  # the patched flavour, its transfer left out, over today's
CHILD_FLAVOURS = (*FLAVOURS, WITHOUT_TRANSFER)


class _PipeSemaphore:
    """One side of a turn handed between two processes over a pipe: ``release`` writes a byte, ``acquire`` reads
    one (False on a timeout, or when the other side has gone)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        try:
            os.write(self.fd, b"t")
        except BrokenPipeError:
            pass  # the other run has ended and closed its end: nobody waits for this turn

    def acquire(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return bool(ready) and os.read(self.fd, 1) == b"t"


class _PipeClosed:
    """The other run has finished: its end of this pipe is closed (at exit, whatever the exit)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.closed = False

    def is_set(self) -> bool:
        if not self.closed and select.select([self.fd], [], [], 0)[0]:
            self.closed = os.read(self.fd, 1) == b""
        return self.closed


class _PipeBarrier:
    """Both runs at the window's start: each writes a byte to the other and waits for the other's."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    def wait(self, timeout: float) -> None:
        os.write(self.write_fd, b"s")
        ready, _, _ = select.select([self.read_fd], [], [], timeout)
        if not ready or os.read(self.read_fd, 1) != b"s":
            raise RuntimeError("the other run did not reach the timed window")

    def abort(self) -> None:
        os.close(self.write_fd)


def _leave_out_transfer() -> None:
    """Makes the patched loop hand each batch on untransferred: no precision conversion, no transfer hooks. For the
    control case only; a build of stock, which has no such transfer, is refused."""
    from pytorch_lightning.loops import training_epoch_loop

    if not hasattr(training_epoch_loop, "_transfer_batch"):
        raise SystemExit(f"{sys.executable} runs stock pytorch_lightning: the {WITHOUT_TRANSFER} case needs the patch")
    training_epoch_loop._transfer_batch = lambda trainer, batch, dataloader_idx: batch


def _run_s3(flavour: str, batches: int) -> None:
    """S3's run in this interpreter's Lightning, in ``flavour`` (of ``CHILD_FLAVOURS``); each receipt goes through
    ``measuring.receipt_hook``."""
    import torch

    from benchmarks import measuring, workloads
    from benchmarks.conftest import FEATURES

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # both runs of a pair on one core, as S3's pairs
    torch.set_num_threads(workloads.TORCH_THREADS)
    if flavour == WITHOUT_TRANSFER:
        _leave_out_transfer()
    probe = measuring.Probe()
    dataset = workloads.TimedDataset(batches, 0.0, probe, 1, FEATURES)
    step = workloads.RegularStep if flavour == "regular" else workloads.IterStep
    module = step(probe, FEATURES, workloads.Burner(), 0)
    with tempfile.TemporaryDirectory() as root:
        workloads.fit(workloads.make_trainer(None, Path(root)), module, workloads.loader(dataset))
    measuring.check_exactly_once(probe.received, batches)


def _count_child(args: argparse.Namespace) -> None:
    """S3's run, counting the Python bytecode instructions executed between its receipts of batch ``--skip`` and of
    the last batch (the window the timed runs time); prints their number per batch as JSON."""
    from benchmarks import measuring

    executed = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal executed
        frame.f_trace_opcodes = True
        executed += event == "opcode"
        return trace

    def received(probe: measuring.Probe, now: float) -> None:
        if len(probe.received_at) == args.skip + 1:
            frame = inspect.currentframe()
            while frame is not None:  # the frames running now (the loops') count too, from here on
                frame.f_trace, frame.f_trace_opcodes, frame = trace, True, frame.f_back
            sys.settrace(trace)
        elif len(probe.received_at) == args.batches:
            sys.settrace(None)

    measuring.receipt_hook = received
    _run_s3(args.flavour, args.batches)
    print(json.dumps(dict(instructions_per_batch=executed / (args.batches - args.skip - 1))))


def _child(args: argparse.Namespace) -> None:
    """One run of S3's workload in this interpreter's Lightning, taking turns through the inherited pipes; prints its
    mean period (seconds per batch) as JSON."""
    from benchmarks import measuring

    mine, theirs, my_done, their_done, start_in, start_out = args.fds
    turns = Turns(args.skip, _PipeSemaphore(mine), _PipeSemaphore(theirs), _PipeBarrier(start_in, start_out),
                  _PipeClosed(their_done), args.first)
    measuring.receipt_hook = turns.received
    if args.receipts:  # the order of receipts, for the test that the runs take turns
        def logged(probe: measuring.Probe, now: float) -> None:
            with open(args.receipts, "a") as log:
                log.write(f"{args.name} {len(probe.received_at) - 1}\n")
            turns.received(probe, now)

        measuring.receipt_hook = logged
    try:
        _run_s3(args.flavour, args.batches)
        if not turns.periods:
            raise AssertionError(f"the run's step received no batch after the first {args.skip}")
    except BaseException:
        turns.start.abort()  # the other run waiting at the window's start fails at once
        raise
    finally:
        os.close(my_done)  # the other run sees this one finished
        turns.theirs.release()  # it may be waiting for a turn this one will never give
    print(json.dumps(dict(period_s=sum(turns.periods) / len(turns.periods), threaded=turns.ran_a_thread)))


def pair(first: str, second: str, flavours: tuple[str, str], batches: int, skip: int, receipts: Path | None = None
         ) -> tuple[float, float]:
    """One lockstep pair of the S3 run under two interpreters (``first`` takes the first turn), each run in its
    flavour of ``flavours``: each one's seconds per batch. ``receipts``: a file where each run logs its receipts in
    order (``first`` as 0, ``second`` as 1)."""
    turn = [os.pipe() for _ in range(2)]  # turn[i]: run i waits on its read end, the other releases it
    done = [os.pipe() for _ in range(2)]
    start = [os.pipe() for _ in range(2)]
    children = []
    for me, (python, flavour) in enumerate(zip((first, second), flavours, strict=True)):
        other = 1 - me
        fds = (turn[me][0], turn[other][1], done[me][1], done[other][0], start[me][0], start[other][1])
        command = [python, "-m", "benchmarks.patch_cost", "--child", "--flavour", flavour, "--batches", str(batches),
                   "--skip", str(skip), "--fds", *map(str, fds), *(["--first"] if me == 0 else []),
                   *(["--receipts", str(receipts), "--name", str(me)] if receipts else [])]
        children.append(subprocess.Popen(command, pass_fds=fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, cwd=Path(__file__).resolve().parent.parent))
    for ends in (*turn, *done, *start):
        for fd in ends:
            os.close(fd)  # the children hold their ends; a child's exit then closes its "done" pipe for the other
    periods, errors = [], []
    for python, child in zip((first, second), children, strict=True):
        try:
            out, err = child.communicate(timeout=LOCKSTEP_TIMEOUT_S * 2)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            err += f"\nno result within {LOCKSTEP_TIMEOUT_S * 2:.0f} s (a hang?)"
        if child.returncode != 0:
            errors.append(f"{python}: exit {child.returncode}\n{err[-3000:]}")
            continue
        found = json.loads(out.strip().splitlines()[-1])
        if found["threaded"]:
            errors.append(f"{python}: a batch came from a background thread; the pair would not be fair")
        periods.append(found["period_s"])
    if errors:
        raise RuntimeError("a lockstep run failed:\n" + "\n".join(errors))
    return periods[0], periods[1]


def cases(stock: str, patched: str, other_stock: str) -> dict[str, tuple[str, str, tuple[str, str]]]:
    """Each case as (reference interpreter, measured interpreter, (reference flavour, measured flavour)), for a stock
    build, a patched build and the stock build its control pairs with."""
    found = {flavour: (stock, patched, (flavour, flavour)) for flavour in FLAVOURS}
    found[SAME_ENVIRONMENT] = (stock, other_stock, ("dataloader_iter", "dataloader_iter"))
    found[OVER_REGULAR] = (stock, patched, ("regular", "dataloader_iter"))
    found[WITHOUT_TRANSFER] = (stock, patched, ("dataloader_iter", WITHOUT_TRANSFER))
    return found


def measure(stocks: list[str], patcheds: list[str], pairs: int, batches: int, skip: int) -> dict[str, list[float]]:
    """Ratios (second over first) per case. Pairs cycle over every (stock, patched) combination of builds, each twice
    in a row with the first turn swapped; stock's control pairs each stock build with the next one (with itself
    where there is one)."""
    combinations = [(stock, patched) for patched in patcheds for stock in stocks]
    ratios: dict[str, list[float]] = {case: [] for case in cases("", "", "")}
    for r in range(pairs):
        stock, patched = combinations[(r // 2) % len(combinations)]
        other_stock = stocks[(stocks.index(stock) + 1) % len(stocks)]
        for case, (reference, measured, (reference_flavour, measured_flavour)) in cases(
                stock, patched, other_stock).items():
            if r % 2 == 0:
                reference_s, measured_s = pair(reference, measured, (reference_flavour, measured_flavour), batches,
                                               skip)
            else:
                measured_s, reference_s = pair(measured, reference, (measured_flavour, reference_flavour), batches,
                                               skip)
            ratios[case].append(measured_s / reference_s)
        print(f"patch cost: {r + 1} of {pairs} rounds", file=sys.stderr, flush=True)
    return ratios


def count_instructions(python: str, flavour: str, batches: int, skip: int) -> float:
    """Bytecode instructions per batch of S3's timed window, run alone under ``python`` (``_count_child``)."""
    found = subprocess.run([python, "-m", "benchmarks.patch_cost", "--count", "--flavour", flavour, "--batches",
                            str(batches), "--skip", str(skip)], capture_output=True, text=True,
                           timeout=LOCKSTEP_TIMEOUT_S * 2, cwd=Path(__file__).resolve().parent.parent)
    if found.returncode != 0:
        raise RuntimeError(f"counting {flavour} under {python} failed: exit {found.returncode}\n{found.stderr[-3000:]}")
    return json.loads(found.stdout.strip().splitlines()[-1])["instructions_per_batch"]


def instructions(stocks: list[str], patcheds: list[str], batches: int, skip: int) -> dict[str, dict[str, Any]]:
    """Per case, the instructions per batch of each side under every build (the same code gives the same count, so
    the builds' counts show whether the count is exact), and the ratio of the sides' means."""
    counted: dict[tuple[str, str], float] = {}

    def count(python: str, flavour: str) -> float:
        if (python, flavour) not in counted:
            counted[python, flavour] = count_instructions(python, flavour, batches, skip)
        return counted[python, flavour]

    found = {}
    for case in cases("", "", ""):
        sides: dict[str, list[float]] = {"reference": [], "measured": []}
        for build in range(max(len(stocks), len(patcheds))):
            stock, patched = stocks[build % len(stocks)], patcheds[build % len(patcheds)]
            other_stock = stocks[(stocks.index(stock) + 1) % len(stocks)]
            reference, measured, (reference_flavour, measured_flavour) = cases(stock, patched, other_stock)[case]
            sides["reference"].append(count(reference, reference_flavour))
            sides["measured"].append(count(measured, measured_flavour))
        means = {side: sum(values) / len(values) for side, values in sides.items()}
        found[case] = dict(sides, ratio=means["measured"] / means["reference"])
    return found


_VERSIONS = (
    "import json, platform, torch, pytorch_lightning as pl, importlib.util as u;"
    "marker = u.find_spec('pytorch_lightning._rfc_patch_series');"
    "series = marker and __import__('pytorch_lightning._rfc_patch_series', fromlist=['_']).SERIES;"
    "print(json.dumps(dict(python=platform.python_version(), torch=torch.__version__,"
    " pytorch_lightning=pl.__version__, patch_series=series or None)))"
)


def _versions(python: str) -> dict[str, Any]:
    """What ``python`` runs: its versions and the patch series its Lightning carries (None: stock)."""
    return json.loads(subprocess.run([python, "-c", _VERSIONS], check=True, capture_output=True, text=True).stdout)


def _environment(parser: argparse.ArgumentParser, pythons: list[str], patched: bool) -> dict[str, Any]:
    """What the builds of one environment run, the same for each (``_versions``); a build that runs something else
    (stock where the patch is expected, another series, other versions) is refused, naming it."""
    found = [_versions(python) for python in pythons]
    if patched and found[0]["patch_series"] is None:
        parser.error(f"{pythons[0]} runs stock pytorch_lightning: pass the patched environment's python")
    for python, versions in zip(pythons[1:], found[1:], strict=True):
        if versions != found[0]:
            parser.error(f"{python} runs {versions}, {pythons[0]} runs {found[0]}: the builds of an environment must"
                         " run the same (rebuild it with `python -m patch.environment --venv PATH`)")
    return found[0]


def results(ratios: dict[str, list[float]], stock: dict[str, Any], patched: dict[str, Any], batches: int, skip: int,
            builds: dict[str, int] | None = None, counts: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The results file: each case's median ratio, interval and verdict; ``stock`` and ``patched`` are what each
    environment's interpreters run (``_versions``), ``builds`` how many builds of each the pairs cycled over,
    ``counts`` each case's instructions per batch (``instructions``)."""
    from harness_common import conformance_setup

    rows = []
    for case, values in ratios.items():
        figure = intervals.summary(values)
        row = dict(case=case, flavour=case if case in FLAVOURS else "dataloader_iter", pairs=len(values),
                   ratio=figure["value"], interval=figure["interval"])
        if case in THRESHOLDS:
            row.update(threshold=THRESHOLDS[case], verdict=intervals.verdict(figure["interval"], "<=",
                                                                             THRESHOLDS[case]))
        if counts:
            row["instructions"] = counts[case]
        rows.append(row)
    setup = conformance_setup()
    setup.update(batches=batches, skip=skip, stock=stock, patched=patched, builds=builds or dict(stock=1, patched=1))
    return dict(schema=1, setup=setup, rows=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patched-python", nargs="+", help="the interpreter of each build of the patched environment")
    parser.add_argument("--stock-python", nargs="+", default=[sys.executable],
                        help="the interpreter of each build of the stock environment")
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--skip", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("rfc/results/patch-cost.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flavour", choices=CHILD_FLAVOURS, help=argparse.SUPPRESS)
    parser.add_argument("--fds", type=int, nargs=6, help=argparse.SUPPRESS)
    parser.add_argument("--first", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--receipts", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.count:
        (_child if args.child else _count_child)(args)
        return 0
    if not args.patched_python:
        parser.error("--patched-python is required: build the environment with `python -m patch.environment --venv "
                     "PATH` and pass PATH/bin/python")
    stock, patched = _environment(parser, args.stock_python, False), _environment(parser, args.patched_python, True)
    counts = instructions(args.stock_python, args.patched_python, args.batches, args.skip)
    ratios = measure(args.stock_python, args.patched_python, args.pairs, args.batches, args.skip)
    builds = dict(stock=len(args.stock_python), patched=len(args.patched_python))
    payload = results(ratios, stock, patched, args.batches, args.skip, builds, counts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    for row in payload["rows"]:
        print(f"{row['case']}: {row['ratio']} {row['interval']} {row.get('verdict', '')}; instructions"
              f" {row['instructions']['ratio']:.4f}")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
