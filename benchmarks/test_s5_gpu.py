"""S5 GPU, the script ``benchmarks/gpu_s5.py``: its dry run on the CPU as a smoke test of every code path (plain
``pytest``), and with CUDA its ``--quick`` run (every design, correctness checked against the synchronous path),
which fails if it reports a problem. The measurement is the script itself, ``python benchmarks/gpu_s5.py``, which
writes ``rfc/results/benchmarks-<gpu kind>.json``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import entries, gpu_s5, measuring, results
from prototypes import DESIGNS

SCRIPT = gpu_s5.REPO_ROOT / "benchmarks" / "gpu_s5.py"
DRY_RUN_TIMEOUT_S = 240  # a hang guard, not a time bound: the run takes seconds; past this the child is killed


def repository_design_ids() -> list[str]:
    """What the script's own process runs: this repository's designs (not one from outside that ``--design`` adds to
    this session's registry), each as it ships and with its opt-in prefetch thread."""
    return [d.id for d in entries.design_entries(()).values()
            if d.make_trainer.__module__.split(".")[0] == "prototypes"]


@pytest.mark.timeout(DRY_RUN_TIMEOUT_S + 60)
def test_the_dry_run_on_cpu_runs_every_design_and_writes_its_results(tmp_path) -> None:
    # Why a subprocess: the documented command line, argument parsing and exit status included
    out = tmp_path / "benchmarks-s5-dry-run.json"
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out)]
    done = subprocess.run(command, cwd=gpu_s5.REPO_ROOT, capture_output=True, text=True, timeout=DRY_RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert f"S5 on cpu: {gpu_s5.SKIPPED_ON_CPU}" in done.stdout
    assert f"wrote {out} " in done.stdout and "; 0 problem(s)" in done.stdout, done.stdout

    document = json.loads(out.read_text())
    assert document["schema"] == results.SCHEMA
    assert document["setup"]["machine_kind"] == "dry-run-cpu" and document["setup"]["cuda"] == "none"
    assert document["notes"]["mode"] == "dry-run" and document["notes"]["failures"] == []
    assert document["notes"]["measurement"] == gpu_s5.SKIPPED_ON_CPU
    calibrated = sorted(key.split()[1] for key in document["notes"]["calibration"])  # "S5 <point> C=<ms>"
    assert calibrated == sorted(gpu_s5.POINTS), document["notes"]["calibration"]
    designs = repository_design_ids()
    rows = document["scenarios"]["S5"]
    assert sorted((row["point"], row["design"]) for row in rows) == sorted(
        (point, entry) for point in gpu_s5.POINTS for entry in (*gpu_s5.BASELINES, *designs))
    for row in rows:
        assert "error" not in row and row["correct"] is True, row
        assert row["n_batches"] == gpu_s5.DRY_RUN_BATCHES and row["rounds"] == 1, row
        if row["role"] == "design":  # the figures a GPU run reports are all computed (their values mean nothing here)
            assert {"time_per_batch_ms", "t_serial_ms", "t_ideal_ms", "efficiency", "weights_max_abs_diff"} <= set(row)
            assert row["weights_max_abs_diff"] <= gpu_s5.WEIGHTS_TOLERANCE, row
    verdicts = document["targets"]["S5"]["results"]
    assert sorted((v["point"], v["design"]) for v in verdicts) == sorted(
        (point, design) for point in gpu_s5.POINTS for design in designs)
    assert all(v["met"] and v["verdict"] == "met" for v in verdicts), verdicts


def test_a_design_that_cannot_run_is_recorded_and_fails_the_run(tmp_path, monkeypatch, capsys) -> None:
    # A real design with an option its trainer refuses: the other entries still run, the script exits non-zero
    broken = DESIGNS["prefetcher"].variant(depth=-1)
    monkeypatch.setitem(DESIGNS, "prefetcher_negative_depth", broken)
    out = tmp_path / "benchmarks-s5-broken.json"
    argv = ["--device", "cpu", "--batches", "3", "--designs", "upstream,prefetcher_negative_depth", "--out", str(out)]
    assert gpu_s5.main(argv) == 1
    rows = json.loads(out.read_text())["scenarios"]["S5"]
    errors = {row["point"]: row["error"] for row in rows if row["design"] == broken.id}
    assert sorted(errors) == sorted(gpu_s5.POINTS)
    assert all(error.startswith("ValueError: prefetcher: `depth` must be") for error in errors.values()), errors
    assert all(row["correct"] for row in rows if row["design"] != broken.id), rows
    printed = capsys.readouterr().out
    assert f"; {len(gpu_s5.POINTS)} problem(s)" in printed
    assert printed.count("PROBLEM: ") == len(gpu_s5.POINTS) and f"{broken.id}: ValueError" in printed


def probe(received: list[int], exact: bool, weights: list[float]) -> measuring.Probe:
    """A run's probe as ``GpuStep`` leaves it at the epoch's end."""
    probe = measuring.Probe()
    probe.received, probe.batches_exact = received, exact
    probe.final_weights = [torch.tensor(weights)]
    return probe


def test_the_correctness_check_reports_each_kind_of_violation() -> None:
    # What only a wrong design shows (the dry run's designs are right): each violation is named, and any one fails
    reference = [torch.tensor([1.0, 2.0])]
    right = probe([0, 1, 2], True, [1.0, 2.0])
    assert gpu_s5.check(measuring.Measurement([1.0], [right]), 3, reference) == dict(
        correct=True, weights_max_abs_diff=0.0, problems=[])
    wrong = [probe([0, 1, 2], False, [1.0, 2.0]), probe([0, 2, 1], True, [1.0, 2.0]), probe([0, 1], True, [1.0, 2.0]),
             probe([0, 1, 2], True, [1.0, 2.5])]
    verdict = gpu_s5.check(measuring.Measurement([1.0] * len(wrong), wrong), 3, reference)
    assert not verdict["correct"] and verdict["weights_max_abs_diff"] == 0.5
    assert verdict["problems"] == [
        "round 0: a batch did not hold its item's values",
        "round 1: received [0, 2, 1], expected 0..2 in order",
        "round 2: received [0, 1], expected 0..2 in order",
        "weights differ from the synchronous path by 0.5",
    ]


def test_an_unknown_design_is_refused_before_any_run(capsys) -> None:
    assert gpu_s5.main(["--device", "cpu", "--designs", "upstream,no_such_design"]) == 2
    error = capsys.readouterr().err
    assert "unknown design(s) ['no_such_design']" in error and "registered: " in error


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available: the script does not refuse to run")
def test_without_cuda_the_gpu_run_is_refused_naming_the_dry_run(capsys) -> None:
    assert gpu_s5.main(["--quick"]) == 2
    assert "use --device cpu for a dry run" in capsys.readouterr().err


def test_the_machine_kind_is_the_gpu_name_in_lower_case_words() -> None:
    assert gpu_s5.gpu_kind("NVIDIA H200") == "nvidia-h200"
    assert gpu_s5.gpu_kind("  NVIDIA GeForce RTX 4090 (rev. 2) ") == "nvidia-geforce-rtx-4090-rev-2"


@pytest.mark.benchmark(group="S5 GPU (quick script run, wall time)")
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="S5 needs CUDA; on a GPU machine run `python benchmarks/gpu_s5.py`"
)
@pytest.mark.timeout(600)
def test_s5_gpu_quick(benchmark, tmp_path) -> None:
    out = tmp_path / "benchmarks-s5-quick.json"
    rc = benchmark.pedantic(gpu_s5.main, args=(["--quick", "--out", str(out)],), rounds=1, warmup_rounds=0)
    assert rc == 0, f"gpu_s5 --quick reported problems; see {out} and the captured output"
