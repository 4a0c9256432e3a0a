"""Lockstep pairs: two runs in two forked processes pinned to one core, taking turns batch by batch (``lockstep``).

Why: on a shared virtual machine the speed of a core drifts by tens of percent within a second, so two runs made one
after the other differ by as much as the overheads S3 judges, however they are interleaved. Alternating the two runs
at every batch on one core gives both the same machine at the same moment: only their own work differs.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import measuring
from benchmarks.measuring import Probe


class Turns:
    """In a lockstep child: whose turn it is. The step's receipt of a batch ends this process's turn (from receipt
    ``skip`` on, when both have reached it); the time from getting the turn back to the next receipt is one period."""

    def __init__(self, skip: int, mine: Any, theirs: Any, start: Any, theirs_finished: Any, first: bool) -> None:
        self.skip, self.mine, self.theirs, self.start = skip, mine, theirs, start
        self.theirs_finished, self.first = theirs_finished, first
        self.periods: list[float] = []
        self.ran_a_thread = False  # a batch of the window was produced off the main thread (see ``lockstep``)
        self._turn_started: float | None = None
        self._off_main_at_start = 0

    def received(self, probe: Probe, now: float) -> None:
        if self._turn_started is not None:
            self.periods.append(now - self._turn_started)
        receipt = len(probe.received_at) - 1
        if receipt < self.skip:
            return
        if receipt == self.skip:
            self._off_main_at_start = probe.produced_off_main
            self.start.wait(timeout=LOCKSTEP_TIMEOUT_S)  # both at the window's start
            if not self.first:
                self._wait_for_turn()
        else:
            self.ran_a_thread |= probe.produced_off_main > self._off_main_at_start
            self.theirs.release()
            self._wait_for_turn()
        self._turn_started = time.perf_counter()

    def _wait_for_turn(self) -> None:
        while not self.theirs_finished.is_set():
            if self.mine.acquire(timeout=0.05):
                return
        # the other run has ended: this one runs on alone (its last periods are unpaired, like a solo run's)


LOCKSTEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Pair:
    """One lockstep pair: each entry's steady-state seconds per batch, measured in the same turns."""

    first_s: float
    second_s: float
    threaded: bool  # either entry produced a batch off the main thread in the window: the pair is not fair

    @property
    def ratio(self) -> float:
        return self.second_s / self.first_s


def lockstep(first: Callable[[], Probe], second: Callable[[], Probe], skip: int) -> Pair:
    """Run two entries at once in two forked processes pinned to one core, taking turns batch by batch.

    Each turn runs one period (from receiving a batch to receiving the next) of one entry while the other process
    waits; the waiting costs neither entry a period. Only the main thread waits, so an entry whose batches come from
    a background thread would load them during the other's turn: such a pair is marked ``threaded`` and its ratio is
    not fair (S3 measures those entries in interleaved solo rounds instead).
    """
    context = multiprocessing.get_context("fork")  # the children inherit the registry, the burner, the sizes
    semaphores = context.Semaphore(0), context.Semaphore(0)
    finished = context.Event(), context.Event()
    start = context.Barrier(2)
    core = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    pipes = [context.Pipe(duplex=False) for _ in range(2)]
    children = []
    for me, run in enumerate((first, second)):
        other = 1 - me
        turns = (skip, semaphores[me], semaphores[other], start, finished[other], me == 0)
        child = context.Process(target=_lockstep_child, args=(run, turns, finished[me], pipes[me][1], core),
                                daemon=True)
        child.start()
        children.append(child)
    outcomes = []
    for child, (reader, writer) in zip(children, pipes, strict=True):
        writer.close()
        waited = reader.poll(LOCKSTEP_TIMEOUT_S * 2)  # a run takes seconds; a child that hangs is given up on
        outcome = reader.recv() if waited else ("error", f"no result within {LOCKSTEP_TIMEOUT_S * 2:.0f} s (a hang?)")
        child.join(timeout=LOCKSTEP_TIMEOUT_S)
        if child.is_alive():
            child.kill()
        outcomes.append(outcome)
    errors = [value for kind, value in outcomes if kind == "error"]
    if errors:
        raise RuntimeError("a lockstep run failed:\n" + "\n".join(errors))
    (first_s, first_threaded), (second_s, second_threaded) = (value for _, value in outcomes)
    return Pair(first_s, second_s, first_threaded or second_threaded)


def _lockstep_child(run: Callable[[], Probe], turns: tuple, finished: Any, writer: Any, core: int | None) -> None:
    outcome: tuple[str, Any]
    mine: Turns | None = None
    try:
        if core is not None:
            os.sched_setaffinity(0, {core})
        mine = Turns(*turns)
        measuring.receipt_hook = mine.received
        run()
        if not mine.periods:
            raise AssertionError(f"the run's step received no batch after the first {mine.skip}")
        outcome = ("ok", (statistics.fmean(mine.periods), mine.ran_a_thread))
    except BaseException as error:  # noqa: BLE001  (reported to the parent, which raises it)
        outcome = ("error", "".join(traceback.format_exception(error)))
        turns[3].abort()  # the other run waiting at the window's start fails at once instead of timing out
    finally:
        finished.set()
        if mine is not None:
            mine.theirs.release()  # the other run may be waiting for a turn this one will never give
    writer.send(outcome)
    writer.close()
    os._exit(0)  # Why: a forked child of pytest must not run the parent's exit handlers
