"""S5 GPU: pinned-memory host-to-device copies of large batches against GPU compute, through every design.

Run on a machine with CUDA, from the repository root::

    python benchmarks/gpu_s5.py            # estimated 1-2 minutes on one H200 (budget: under 5; not yet run on a GPU)
    python benchmarks/gpu_s5.py --quick    # a smaller correctness-first run

Each item is a pinned host batch (``--batch-mib``, default 64 MiB) whose values identify it; loading is the
host-to-device copy L (non_blocking, from pinned memory); the step's compute C is GPU matmuls that read the batch,
calibrated before each point so that the compute-only run measures C. For C = 2L, L and L/2, side by side in one
process: stock Lightning's regular flavour (T_serial: the copy and the compute serialise on one stream), a copy-only
and a compute-only run (T_ideal = max; compute-only is stock Lightning's loop over batches already on the device
with the same step, as in the CPU scenarios; its raw-loop figure is kept), and every registered design, as it ships
and with its opt-in prefetch thread (whose side-stream copies S5 checks most), with the same user step (it moves the
batch itself when a design hands it over on the CPU, as stock Lightning's flavour does), interleaved round by round.
Efficiency e = (T_serial - T) / (T_serial - T_ideal), medians of the rounds.

Correctness, per design and point: the step checks on the GPU, without synchronising, that every batch it
received holds exactly the values of the item it claims to be (a copy read before it finished, or a buffer reused
too early, shows up here), that it received items 0..n-1 once each in order, and that the final weights equal
those of the synchronous path (the regular flavour). Any violation makes the script exit non-zero.

Writes ``rfc/results/benchmarks-<kind>.json`` (kind from the GPU name, e.g. ``nvidia-h200``; ``--kind`` to
override; ``--out`` for another path) in the schema of ``benchmarks/README.md``, scenario ``S5``.
``--device cpu`` runs the same code without CUDA: a dry run of every code path with tiny unpinned batches and the
fewest batches and rounds that reach them all (``--quick`` asks for no less), writing ``.benchmarks/`` unless
``--out`` says otherwise. What needs CUDA (pinned copies against GPU compute, and so the measurement and its warm-up
rounds) is reported as skipped: its times measure nothing. The default test suite runs it as a smoke test.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from benchmarks import calibration, entries, measuring, overlap, results, workloads  # noqa: E402
from benchmarks.gpu_workload import GpuStep, IterGpuStep, PinnedBatches, RegularGpuStep  # noqa: E402
from harness_common import QUIET  # noqa: E402
from prototypes import DESIGNS, Design, runnable_designs  # noqa: E402
from prototypes.prefetcher.prefetch_thread import AUTO_PROBE_BATCHES  # noqa: E402

POINTS = {"L=0.5C": 2.0, "L=C": 1.0, "L=2C": 0.5}  # point -> C as a multiple of the measured L
BASELINES = ("baseline:regular", "baseline:copy-only", "baseline:compute-only", "baseline:compute-only-raw")
WEIGHTS_TOLERANCE = 1e-5  # final weights against the synchronous path's (the same step on the same batches)
# The dry run's batches: past the prefetcher's "auto" probe, so its decision (and the path after it) runs too.
DRY_RUN_BATCHES = AUTO_PROBE_BATCHES + 2
SKIPPED_ON_CPU = ("the measurement (pinned host-to-device copies against GPU compute, warm-up rounds) needs CUDA:"
                  " skipped; the times below measure nothing")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate(device: torch.device, size: int) -> float:
    """Milliseconds per ``size`` x ``size`` float32 matmul on ``device``."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    out = torch.empty(size, size, device=device)
    for _ in range(10):
        torch.mm(a, b, out=out)
    samples = []
    for _ in range(7):
        _sync(device)
        start = time.perf_counter()
        for _ in range(20):
            torch.mm(a, b, out=out)
        _sync(device)
        samples.append((time.perf_counter() - start) / 20 * 1000.0)
    return statistics.median(samples)


class S5:
    """One S5 session: data, calibration and the runs."""

    def __init__(self, device: torch.device, n: int, rows: int, cols: int, matmul: int, rounds: int, warmup: int,
                 root: Path) -> None:
        self.device, self.n, self.rows, self.cols, self.matmul = device, n, rows, cols, matmul
        self.rounds, self.warmup, self.root = rounds, warmup, root
        self.data = PinnedBatches(n, rows, cols, measuring.Probe(), pin=device.type == "cuda")
        self.ms_per_matmul = calibrate(device, matmul)
        self.copy_only = self.measure(lambda: self._copy_only())
        self.l_ms = self.copy_only.median_ms
        self.trainer_kwargs = dict(QUIET, accelerator="gpu" if device.type == "cuda" else "cpu")

    def measure(self, once) -> measuring.Measurement:
        return measuring.measure(once, 0, self.rounds, self.warmup)  # timed over the whole epoch (per_batch_s)

    def _fresh_probe(self) -> measuring.Probe:
        probe = measuring.Probe()
        self.data.probe = probe
        return probe

    def _copy_only(self) -> measuring.Probe:
        probe = self._fresh_probe()
        probe.epoch_started()
        for batch in workloads.loader(self.data):
            batch.to(self.device, non_blocking=True)
        _sync(self.device)
        probe.epoch_ended()
        probe.received = list(range(self.n))
        probe.batches_exact = True
        return probe

    def _compute_only(self, iterations: int) -> measuring.Probe:
        """Stock Lightning's regular flavour over batches already on the device: T_ideal's C side."""
        on_device = [b.to(self.device) for b in self.data.items]
        _sync(self.device)
        module = RegularGpuStep(self._fresh_probe(), self.data.pattern, iterations, self.matmul)
        trainer_kwargs = {**self.trainer_kwargs, "default_root_dir": str(self.root)}
        with workloads.quiet():
            pl.Trainer(**trainer_kwargs).fit(module, train_dataloaders=DataLoader(on_device, batch_size=None))
        return module.probe

    def _compute_only_raw(self, iterations: int) -> measuring.Probe:
        """The same step's work in a plain PyTorch loop over batches already on the device (the raw-loop figure)."""
        probe = self._fresh_probe()
        on_device = [b.to(self.device) for b in self.data.items]
        _sync(self.device)
        module = RegularGpuStep(probe, self.data.pattern, iterations, self.matmul).to(self.device)
        optimizer = module.configure_optimizers()
        module.on_train_epoch_start()
        for batch in on_device:
            loss = module.work(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        module.on_train_epoch_end()
        return probe

    def calibrated_iterations(self, c_ms: float) -> calibration.Calibration:
        """Matmul iterations that make the compute-only run (through Lightning's loop) measure ``c_ms`` per batch."""
        def compute_only_ms(iterations: int) -> float:
            return self._compute_only(iterations).per_batch_s(0) * 1000.0

        return calibration.calibrate_step(compute_only_ms, c_ms, self.ms_per_matmul)

    def _fit(self, design: Any | None, module: GpuStep) -> measuring.Probe:
        trainer_kwargs = {**self.trainer_kwargs, "default_root_dir": str(self.root)}
        with workloads.quiet():
            trainer = pl.Trainer(**trainer_kwargs) if design is None else design.trainer(**trainer_kwargs)
            trainer.fit(module, train_dataloaders=workloads.loader(self.data))
        return module.probe

    def once(self, entry: str, iterations: int, design: Design | None = None) -> measuring.Probe:
        """One epoch of ``entry`` (a baseline, or ``design``) with ``iterations`` matmuls per step."""
        if entry == "baseline:copy-only":
            return self._copy_only()
        if entry == "baseline:compute-only":
            return self._compute_only(iterations)
        if entry == "baseline:compute-only-raw":
            return self._compute_only_raw(iterations)
        if entry == "baseline:regular":
            return self._fit(None, RegularGpuStep(self._fresh_probe(), self.data.pattern, iterations, self.matmul))
        return self._fit(design, IterGpuStep(self._fresh_probe(), self.data.pattern, iterations, self.matmul))

    def point(self, iterations: int, designs: dict[str, Design]) -> measuring.Interleaved:
        """Baselines and designs (entry -> design) at one C (``iterations`` matmuls per step), interleaved."""
        runs = {entry: partial(self.once, entry, iterations, designs.get(entry)) for entry in (*BASELINES, *designs)}
        return measuring.Interleaved(runs, 0, self.rounds, self.warmup)


def check(measurement: measuring.Measurement, n: int, reference: Sequence[torch.Tensor] | None) -> dict[str, Any]:
    """Correctness of every measured round: exact batch contents, order, and weights against the reference."""
    problems = []
    max_diff = 0.0
    for k, probe in enumerate(measurement.probes):
        if not probe.batches_exact:
            problems.append(f"round {k}: a batch did not hold its item's values")
        if probe.received != list(range(n)):
            problems.append(f"round {k}: received {probe.received}, expected 0..{n - 1} in order")
        if reference is not None and probe.final_weights:
            for got, want in zip(probe.final_weights, reference, strict=True):
                max_diff = max(max_diff, float((got.float() - want.float()).abs().max()))
    if max_diff > WEIGHTS_TOLERANCE:  # a baseline's too: every violation fails the run
        problems.append(f"weights differ from the synchronous path by {max_diff:.3g}")
    return dict(correct=not problems, weights_max_abs_diff=max_diff, problems=problems)


def gpu_kind(gpu_name: str) -> str:
    """The machine kind in a results file's name, from the GPU's name: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run of the code path")
    parser.add_argument("--quick", action="store_true",
                        help="fewer batches and rounds (on cpu the dry run is always the fewest that run every path)")
    parser.add_argument("--batch-mib", type=float, default=64.0)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--kind", default=None, help="machine kind in the results file name")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--designs", default=None, help="comma-separated registry names (default: all)")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("S5 needs CUDA (torch.cuda.is_available() is False); use --device cpu for a dry run", file=sys.stderr)
        return 2
    dry = device.type != "cuda"
    cols = 256 if dry else 2048
    rows = 64 if dry else max(cols, int(args.batch_mib * 2**20 / (4 * cols)))
    n = args.batches or (DRY_RUN_BATCHES if dry else (16 if args.quick else 32))
    rounds, warmup = (1, 0) if dry else ((2, 1) if args.quick else (5, 1))  # a dry run has nothing to warm up
    matmul = min(rows, cols, 64 if dry else 1024)
    names = list(runnable_designs()) if not args.designs else [s.strip() for s in args.designs.split(",")]
    unknown = [name for name in names if name not in DESIGNS]
    if unknown:
        print(f"unknown design(s) {unknown}; registered: {sorted(DESIGNS)}", file=sys.stderr)
        return 2
    unavailable = [reason for name in names if (reason := DESIGNS[name].unavailable_reason()) is not None]
    if unavailable:
        print("\n".join(unavailable), file=sys.stderr)
        return 2
    designs = {d.id: d for name in names for d in (DESIGNS[name], entries.opt_in_thread(DESIGNS[name]))
               if d is not None}

    torch.set_num_threads(workloads.TORCH_THREADS)
    with tempfile.TemporaryDirectory() as tmp:
        s5 = S5(device, n, rows, cols, matmul, rounds, warmup, Path(tmp))
        print(f"S5 on {device}: {n} batches of {rows}x{cols} float32 ({rows * cols * 4 / 2**20:.0f} MiB),"
              f" L (copy) {s5.l_ms:.3f} ms/batch, matmul {matmul} {s5.ms_per_matmul:.3f} ms", flush=True)
        if dry:
            print(f"S5 on {device}: {SKIPPED_ON_CPU}", flush=True)
        rows_out: list[dict[str, Any]] = []
        failures: list[str] = []
        calibrations: dict[str, Any] = {}
        for point, c_factor in POINTS.items():
            c_ms = c_factor * s5.l_ms
            step = s5.calibrated_iterations(c_ms)
            calibrations[f"S5 {point} C={c_ms:.3f}"] = step.as_note()  # the point: C alone can repeat
            # At least one matmul: a dry run's C (its copies cost nothing) is below Lightning's own per-batch cost
            # and calibrates to none, which would leave the step's compute unrun
            data = s5.point(max(1, int(step.value)), designs)
            base = {entry: data.measurement(entry) for entry in BASELINES}
            reference = base["baseline:regular"].probes[-1].final_weights
            t_serial = base["baseline:regular"].median_ms
            l_measured, c_measured = base["baseline:copy-only"].median_ms, base["baseline:compute-only"].median_ms
            c_raw = base["baseline:compute-only-raw"].median_ms
            t_ideal, t_ideal_raw = max(l_measured, c_measured), max(l_measured, c_raw)
            common = dict(L_ms=measuring.rounded(l_measured), C_target_ms=measuring.rounded(c_ms),
                          C_ms=measuring.rounded(c_measured), C_raw_ms=measuring.rounded(c_raw),
                          L_over_C=measuring.rounded(1.0 / c_factor),
                          L_over_C_measured=measuring.rounded(l_measured / c_measured), n_batches=n,
                          batch_mib=round(rows * cols * 4 / 2**20, 1))
            for entry in BASELINES:
                verdict = check(base[entry], n, reference if entry != "baseline:copy-only" else None)
                rows_out.append(dict(design=entry, role="baseline", point=point, **common,
                                     time_per_batch_ms=measuring.rounded(base[entry].median_ms),
                                     correct=verdict["correct"], rounds=base[entry].rounds))
                failures += [f"{point} {entry}: {p}" for p in verdict["problems"]]
            for entry, design in designs.items():
                try:
                    measurement = data.measurement(entry)
                except Exception as error:  # a design that cannot run this scenario: recorded, not fatal
                    failures.append(f"{point} {entry}: {type(error).__name__}: {error}")
                    rows_out.append(dict(design=entry, role="design", point=point, **common,
                                         error=f"{type(error).__name__}: {error}"))
                    continue
                verdict = check(measurement, n, reference)
                t = measurement.median_ms
                efficiency = overlap.efficiency(t_serial, t, t_ideal)
                rows_out.append(dict(
                    design=entry, role="design", configuration=entries.configuration_of(design), point=point, **common,
                    time_per_batch_ms=measuring.rounded(t), t_serial_ms=measuring.rounded(t_serial),
                    t_ideal_ms=measuring.rounded(t_ideal), efficiency=measuring.rounded(efficiency),
                    t_ideal_raw_ms=measuring.rounded(t_ideal_raw),
                    efficiency_raw_ideal=measuring.rounded(overlap.efficiency(t_serial, t, t_ideal_raw)),
                    correct=verdict["correct"], weights_max_abs_diff=verdict["weights_max_abs_diff"],
                    rounds=measurement.rounds,
                ))
                failures += [f"{point} {entry}: {p}" for p in verdict["problems"]]
                print(f"  {point:7s} {entry:24s} {t:8.3f} ms/batch  serial {t_serial:8.3f}"
                      f"  ideal {t_ideal:8.3f}  efficiency {efficiency:6.3f}  correct {verdict['correct']}", flush=True)

    setup = results.setup_info()
    gpu = torch.cuda.get_device_name(device) if not dry else "none (dry run on cpu)"
    kind = args.kind or ("dry-run-cpu" if dry else gpu_kind(gpu))
    setup.update(machine=f"{kind}: {gpu}; host {setup['machine'].split(': ', 1)[-1]}", machine_kind=kind,
                 gpu=gpu, cuda=torch.version.cuda or "none")
    document = {
        "schema": results.SCHEMA,
        "setup": setup,
        "targets": {"S5": dict(what="every design's results equal the synchronous path (S5)", metric="correct",
                               compare="==", threshold=True,
                               results=[dict(design=r["design"], point=r["point"], value=r.get("correct", False),
                                             interval=None, verdict="met" if r.get("correct") else "missed",
                                             met=bool(r.get("correct"))) for r in rows_out if r["role"] == "design"])},
        "scenarios": {"S5": rows_out},
        "notes": dict(mode="dry-run" if dry else ("quick" if args.quick else "measure"), rounds=rounds, warmup=warmup,
                      matmul_size=matmul, matmul_ms=round(s5.ms_per_matmul, 4), calibration=calibrations,
                      failures=failures, wall_s=round(time.perf_counter() - started, 1),
                      **(dict(measurement=SKIPPED_ON_CPU) if dry else {})),
    }
    # a dry run never lands among the committed results
    out = args.out or (results.PARTIAL_DIR if dry else results.RESULTS_DIR) / f"benchmarks-{kind}.json"
    results.write_json(out, document)
    print(f"wrote {out} in {time.perf_counter() - started:.0f} s; {len(failures)} problem(s)")
    for failure in failures:
        print("  PROBLEM:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
