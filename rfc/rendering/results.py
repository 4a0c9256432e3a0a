"""The results a render reads, loaded and checked once: after ``load_inputs`` every block may rely on the shapes below.

* ``conformance.json``:
  ``{"schema": 1, "setup": {...}, "results": [{"design", "test_id", ...}], "clauses"?, "designs"?}``
* ``conformance-<environment>.json``: the same, for designs that run only in an environment of their own (the
  ``patched`` design, in the patched Lightning's); merged into the conformance results, each file keeping its setup
  (``setups``: file name -> setup)
* ``benchmarks-<machine>.json``, named for the machine it describes:
  ``{"schema": 1, "setup"?: {...}, "scenarios": {name: [row, ...]}, "targets"?, "notes"?}``
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFORMANCE_FILE = "conformance.json"
CONFORMANCE_ENVIRONMENT_GLOB = "conformance-*.json"
BENCHMARK_GLOB = "benchmarks-*.json"
CONFORMANCE_COMMAND = "pytest tests/conformance --results rfc/results/conformance.json"
BENCHMARK_COMMAND = "pytest --benchmark-only"  # writes rfc/results/benchmarks-<machine>.json
SUPPORTED_SCHEMA = 1
SCHEMAS = {"drain-rules.json": 2, "patch-series.json": 2}  # the files whose producers moved on from schema 1

PASS, XFAIL, FAIL, SKIP = "passed", "expected failure", "failure", "skipped"
OUTCOME_KIND = {
    "passed": PASS,
    "xfailed": XFAIL,
    "failed": FAIL,
    "error": FAIL,
    "xpassed": FAIL,  # strict xfail: a design that starts passing must drop its expected-failure line
    "skipped": SKIP,
}


class RenderError(Exception):
    """A problem with the inputs (malformed JSON, unknown block, unbalanced markers); reported without traceback."""


@dataclass
class Inputs:
    """What a render reads: the results and where pages live."""

    rfc_dir: Path
    results_dir: Path
    out_dir: Path
    command: str
    conformance: dict[str, Any] | None = None
    benchmarks: dict[str, dict[str, Any]] = field(default_factory=dict)  # machine kind -> results


def load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RenderError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RenderError(f"{path}: expected a JSON object at the top level")
    schema, supported = data.get("schema"), SCHEMAS.get(path.name, SUPPORTED_SCHEMA)
    if schema != supported:
        raise RenderError(f"{path}: schema {schema!r} is not supported (this renderer reads schema {supported})")
    return data


def _require(ok: bool, path: Path, what: str) -> None:
    if not ok:
        raise RenderError(f"{path}: {what}")


def _validate_conformance(data: dict[str, Any], path: Path) -> None:
    for key in ("setup", "results"):
        _require(key in data, path, f"missing {key!r}")
    _require(isinstance(data["setup"], dict), path, "'setup' must be an object")
    _require(isinstance(data["results"], list), path, "'results' must be a list")
    for i, result in enumerate(data["results"]):
        _require(isinstance(result, dict) and isinstance(result.get("design"), str)
                 and isinstance(result.get("test_id"), str), path,
                 f"results[{i}] must be an object with string 'design' and 'test_id'")
    for key in ("clauses", "designs"):
        _require(isinstance(data.get(key) or {}, dict), path, f"{key!r} must be an object")


def _validate_benchmarks(data: dict[str, Any], path: Path) -> None:
    _require("scenarios" in data, path, "missing 'scenarios'")
    _require(isinstance(data["scenarios"], dict), path, "'scenarios' must be an object")
    for scenario, rows in data["scenarios"].items():
        _require(isinstance(rows, list) and all(isinstance(r, dict) for r in rows), path,
                 f"scenario {scenario!r} must be a list of row objects")
    _require(isinstance(data.get("setup") or {}, dict), path, "'setup' must be an object")
    _require(isinstance(data.get("notes") or {}, dict), path, "'notes' must be an object")
    targets = data.get("targets") or {}
    _require(isinstance(targets, dict), path, "'targets' must be an object")
    for scenario, spec in targets.items():
        _require(isinstance(spec, dict) and isinstance(spec.get("results") or [], list)
                 and all(isinstance(r, dict) for r in spec.get("results") or []), path,
                 f"target {scenario!r} must be an object whose 'results' is a list of objects")


def _merge_conformance(into: dict[str, Any], data: dict[str, Any], path: Path) -> None:
    """Add another environment's conformance run: its designs must be its own (a design run in two environments
    would count twice)."""
    _validate_conformance(data, path)
    theirs, ours = {r["design"] for r in data["results"]}, {r["design"] for r in into["results"]}
    _require(not theirs & ours, path, f"designs {sorted(theirs & ours)} are in {CONFORMANCE_FILE} too: keep each "
             "design's run in one results file")
    into["results"] = into["results"] + data["results"]
    into["designs"] = {**(into.get("designs") or {}), **(data.get("designs") or {})}
    into["setups"][path.name] = data["setup"]


def load_inputs(rfc_dir: Path, results_dir: Path, out_dir: Path, command: str) -> Inputs:
    inputs = Inputs(rfc_dir=rfc_dir, results_dir=results_dir, out_dir=out_dir, command=command)
    conformance = results_dir / CONFORMANCE_FILE
    if conformance.is_file():
        inputs.conformance = load_json(conformance)
        _validate_conformance(inputs.conformance, conformance)
        inputs.conformance["setups"] = {conformance.name: inputs.conformance["setup"]}
        for path in sorted(results_dir.glob(CONFORMANCE_ENVIRONMENT_GLOB)):
            _merge_conformance(inputs.conformance, load_json(path), path)
    # each file is named for its machine (``benchmarks-x86_64-linux-2cpu.json``): the CPU machines' files first (what
    # `pytest --benchmark-only` writes), then those of GPU machines (``benchmarks/gpu_s5.py``), each by name
    found = {}
    for path in sorted(results_dir.glob(BENCHMARK_GLOB)):
        found[path] = load_json(path)
        _validate_benchmarks(found[path], path)
    for path, data in sorted(found.items(), key=lambda item: ("gpu" in (item[1].get("setup") or {}), item[0].name)):
        inputs.benchmarks[path.stem[len("benchmarks-"):]] = data
    return inputs
