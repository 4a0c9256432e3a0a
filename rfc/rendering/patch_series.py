"""The patch series to Lightning, item by item: what each patch changes, where its code is here, and what a user of
today's flavour notices. Rendered from ``rfc/results/patch-series.json`` (``python -m patch.series --summary``)."""

from __future__ import annotations

from pathlib import Path

from rendering.code_pointers import PATCH_SUMMARY
from rendering.markdown import cell, code, no_results
from rendering.results import Inputs, load_json

COMMAND = "python -m patch.series --out patches --summary rfc/results/patch-series.json"


def block_patch_series(inputs: Inputs, page_dir: Path) -> str:
    path = inputs.results_dir / PATCH_SUMMARY
    if not path.is_file():
        return no_results("the patch series summary", COMMAND)
    summary = load_json(path)
    items = summary["items"]
    with_edits = [item for item in items if item["code"]]
    added, removed = sum(i["added"] for i in items), sum(i["removed"] for i in items)
    files = sorted({f["path"] for item in items for f in item["files"]})
    lines = [
        f"The series for pytorch-lightning {summary['release']} has {len(items)} patches, one per item of the list"
        f" above, in its order; {len(with_edits)} edit Lightning's code, adding {added} lines and removing {removed}"
        f" in {len(files)} files (`{COMMAND}`; `--layout repository` writes it for `src/lightning/pytorch/`).",
        "",
        "| Item | Code here | Lightning's lines (+/−) |",
        "| --- | --- | --- |",
    ]
    for item in items:
        where = code(item["code"]) if item["code"] else f"no edits of its own: {item['part']}"
        lines.append(f"| {item['number']} | {where} | +{item['added']} −{item['removed']} |")
    lines += ["", "What a user of today's flavour notices, patch by patch (each patch's message):", ""]
    for item in items:
        lines.append(f"- **{item['number']}. {cell(item['title'])}.** {' '.join(item['why'].split())}")
    return "\n".join(lines)
