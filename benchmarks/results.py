"""The benchmark results file: rows per scenario, the run's setup and notes, the targets judged, written as JSON."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.measuring import Interleaved
from benchmarks.targets import evaluate_targets
from benchmarks.workloads import TORCH_THREADS
from harness_common import REPO_ROOT, cpu_model, machine_file_name, machine_label, provenance, version
from prototypes import DESIGNS

RESULTS_DIR = REPO_ROOT / "rfc" / "results"
PARTIAL_DIR = REPO_ROOT / ".benchmarks"  # git-ignored: results of runs that did not cover every CPU scenario
MACHINE_KIND = machine_file_name()  # the results file is named for the machine it describes
SCHEMA = 1
CPU_SCENARIOS = ("S1", "S2", "S3", "S4", "S6", "S7")  # what `pytest --benchmark-only` measures; S5 needs a GPU


def setup_info() -> dict[str, Any]:
    """Machine, versions and commit: the ``setup`` block of the results file and every benchmark's extra_info."""
    return {
        "machine": machine_label(),
        "cpu": cpu_model(),
        "machine_kind": MACHINE_KIND,
        "cpu_count": os.cpu_count() or 0,
        "torch_threads": TORCH_THREADS,
        "pytest_benchmark": version("pytest-benchmark"),
        **provenance(),
    }


@dataclass
class ResultStore:
    """Rows per scenario, measured scenario points, and the session's notes; written as JSON at session end."""

    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    points: dict[tuple, Interleaved] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def record(self, scenario: str, row: dict[str, Any]) -> None:
        self.rows.setdefault(scenario, []).append(row)

    def point(self, key: tuple, measure_now: Callable[[], Interleaved]) -> Interleaved:
        """A scenario point's interleaved measurements, taken by the first test that needs them."""
        if key not in self.points:
            before = os.getloadavg()[0]
            self.points[key] = measure_now()
            # before and after; both include this run's own threads
            self.notes.setdefault("loadavg_1min_per_point", {})[" ".join(map(str, key))] = [
                round(before, 2), round(os.getloadavg()[0], 2)]
        return self.points[key]


RESULTS = ResultStore()

def results_document(store: ResultStore, setup: dict[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "setup": setup,
        "targets": evaluate_targets(store.rows, DESIGNS),
        "scenarios": {s: store.rows[s] for s in sorted(store.rows)},
        "notes": store.notes,
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
