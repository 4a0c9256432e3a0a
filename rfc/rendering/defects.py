"""The specification's table of the defects the conformance suite is proven to catch, clause by clause.

``defects_block(results)`` renders ``rfc/results/defects.json``, which ``python -m tests.test_defect_catalogue
rfc/results/defects.json`` writes: one row per catalogued defect, the design it was applied to, what the broken
design does, and the tests of its clause that failed against it (a missed defect says so in bold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.markdown import cell, no_results, setup_line
from rendering.results import Inputs, load_json

COMMAND = "python -m tests.test_defect_catalogue rfc/results/defects.json"


def _design(defect: dict[str, Any]) -> str:
    options = defect.get("options") or {}
    spelled = ",".join(f"{key}={value!r}" for key, value in sorted(options.items()))
    return f"`{defect['design']}[{spelled}]`" if spelled else f"`{defect['design']}`"


def defects_block(results: dict[str, Any] | None) -> str:
    """The block's Markdown: a summary line, the setup line and one row per defect, in clause order."""
    if not results or not results.get("defects"):
        return no_results("defect catalogue results", COMMAND)
    defects = results["defects"]
    titles = results.get("clauses") or {}
    clause_number = {clause: position for position, clause in enumerate(titles)}
    ordered = sorted(defects, key=lambda d: clause_number.get(d["clause"], len(titles)))
    caught = [d for d in defects if d.get("caught")]
    covered = sorted({d["clause"] for d in caught}, key=lambda c: clause_number.get(c, len(titles)))
    uncovered = [c for c in titles if c not in covered]
    summary = (f"The suite caught **{len(caught)} of {len(defects)}** catalogued defects, each in the clause it "
               f"breaks; clauses with a caught defect: {len(covered)} of {len(titles)}"
               + (f" (none yet for {', '.join(uncovered)})." if uncovered else "."))
    rows = ["| Clause | Defect | Applied to | The broken design | Caught by (tests that failed) |",
            "| --- | --- | --- | --- | --- |"]
    for defect in ordered:
        failed = defect.get("failed") or []
        verdict = "<br>".join(f"`{test}`" for test in failed) if defect.get("caught") else (
            f"**missed** ({defect.get('ran', 0)} tests passed)")
        clause = defect["clause"]
        title = titles.get(clause, "")
        rows.append(f"| {clause} {cell(title)} | `{defect['name']}` | {_design(defect)} | {cell(defect['what'])} "
                    f"| {verdict} |")
    return "\n\n".join([summary, setup_line(results.get("setup") or {}, "defects.json"), "\n".join(rows)])


def block_defects(inputs: Inputs, page_dir: Path) -> str:
    """The defects the conformance suite is proven to catch, clause by clause (``rfc/results/defects.json``)."""
    path = inputs.results_dir / "defects.json"
    return defects_block(load_json(path) if path.is_file() else None)
