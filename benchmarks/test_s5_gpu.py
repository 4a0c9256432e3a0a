"""S5 GPU: skipped without CUDA. With CUDA, runs ``benchmarks/gpu_s5.py --quick`` (every design, correctness
checked against the synchronous path) and fails if it reports a problem. The measurement is the script itself,
``python benchmarks/gpu_s5.py``, which writes ``rfc/results/benchmarks-<gpu kind>.json``.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_s5

pytestmark = [
    pytest.mark.benchmark(group="S5 GPU (quick script run, wall time)"),
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="S5 needs CUDA; on a GPU machine run `python benchmarks/gpu_s5.py`"
    ),
]


@pytest.mark.timeout(600)
def test_s5_gpu_quick(benchmark, tmp_path) -> None:
    out = tmp_path / "benchmarks-s5-quick.json"
    rc = benchmark.pedantic(gpu_s5.main, args=(["--quick", "--out", str(out)],), rounds=1, warmup_rounds=0)
    assert rc == 0, f"gpu_s5 --quick reported problems; see {out} and the captured output"
