"""The specification's count of what a step call communicates under DDP (``rfc/rendering/collective_counts.py``),
from synthetic conformance results built here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "rfc"))  # where `python rfc/render.py` finds it

from rendering.collective_counts import COUNT_TEST, block_ddp_counts  # noqa: E402
from rendering.results import Inputs  # noqa: E402

from prototypes import DESIGNS, RECOMMENDED  # noqa: E402


def result(variant: str, step: str, calls: list[int], total: list[int], drain_calls: tuple = (0, 0)) -> dict:
    measured = dict(calls=calls, drain_calls=list(drain_calls), total=total, host_reads=total,
                    stock_batches=[6, 6], stock_total=[6, 6], stock_host_reads=[6, 6])
    return dict(test_id=f"{COUNT_TEST}[{step}]", design=RECOMMENDED, variant=variant, clause="C16", outcome="passed",
                measured=measured)


def inputs(tmp_path: Path, *results: dict) -> Inputs:
    return Inputs(rfc_dir=tmp_path, results_dir=tmp_path, out_dir=tmp_path, command="render",
                  conformance=dict(schema=1, results=list(results)))


def test_the_counts_are_those_of_what_ships_with_what_a_call_costs_beyond_one(tmp_path):
    ships = DESIGNS[RECOMMENDED].id
    block = block_ddp_counts(inputs(
        tmp_path,
        result(f"{RECOMMENDED}[variant=2]", "1-per-call", [6, 6], [9, 9]),  # another variant: not what ships
        result(ships, "1-per-call", [6, 6], [7, 7]),
        result(ships, "async-handle", [7, 8], [8, 10], drain_calls=(2, 2)),
    ), tmp_path)
    assert f"`{ships}`, as it ships" in block
    assert "| one batch per call | 6 | 0 | 7 | 7 | 6 | 6 | 6 |" in block
    assert "| Lightning's async-handle pattern (pulls ahead) | 7 / 8 | 2 | 8 / 10 | 8 / 10 | 6 | 6 | 6 |" in block
    assert "Beyond one collective and one host read per step call: 1 / 2 per epoch" in block


def test_without_counts_the_block_says_so(tmp_path):
    block = block_ddp_counts(inputs(tmp_path), tmp_path)
    assert "holds no counts" in block
