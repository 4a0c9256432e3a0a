"""Conformance blocks: the matrix, expected failures and failures, the designs and each clause's tests."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rendering.markdown import cell, code, no_results, setup_line, table
from rendering.results import CONFORMANCE_COMMAND, FAIL, OUTCOME_KIND, PASS, SKIP, XFAIL, Inputs


def clause_key(clause: str) -> tuple[int, str]:
    m = re.fullmatch(r"C(\d+)", clause)
    return (int(m.group(1)), clause) if m else (10**6, clause)


def conformance_parts(data: dict[str, Any]):
    clauses: dict[str, str] = dict(data.get("clauses") or {})
    counts: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))  # variant -> clause -> kind
    design_of: dict[str, str] = {}
    for r in data["results"]:
        variant = r.get("variant") or r["design"]
        design_of[variant] = r["design"]
        clause = r.get("clause") or "?"
        clauses.setdefault(clause, "")
        kind = OUTCOME_KIND.get(r.get("outcome", ""), FAIL)
        counts[variant][clause][kind] += 1
    ordered_clauses = sorted(clauses, key=clause_key)
    design_order = list(dict.fromkeys([*(data.get("designs") or {}), *design_of.values()]))
    variants = sorted(design_of, key=lambda v: (design_order.index(design_of[v]), variant_sort_key(v)))
    return clauses, ordered_clauses, counts, design_of, variants


def variant_sort_key(variant: str) -> list[Any]:
    # natural sort: name[depth=2] before name[depth=10]
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", variant)]


def block_matrix(inputs: Inputs, page_dir: Path) -> str:
    """The conformance matrix: design variant x clause, passed/expected-fail/fail counts."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    clauses, ordered, counts, design_of, variants = conformance_parts(data)
    if not variants:
        return setup_line(data["setup"], "conformance.json") + "\n\nThe results file holds no test outcomes."
    any_skip = any(c[SKIP] for v in counts.values() for c in v.values())
    headers = ["Design variant"] + [f'<abbr title="{cell(clauses[c])}">{c}</abbr>' for c in ordered] + ["Total"]
    if any_skip:
        headers.append("Skipped")
    rows = []
    for v in variants:
        row = [code(v)]
        total = Counter()
        for c in ordered:
            k = counts[v].get(c, Counter())
            total.update(k)
            row.append(_matrix_cell(k))
        row.append(_matrix_cell(total))
        if any_skip:
            row.append(str(total[SKIP]))
        rows.append(row)
    legend = (
        "Each cell: **passed/expected failures/failures** (failures include errors and unexpected passes; "
        "a bold cell has failures; – means no test of that clause ran). Clauses: "
        + "; ".join(f"{c} {clauses[c]}".strip() for c in ordered)
        + "."
    )
    return "\n\n".join([setup_line(data["setup"], "conformance.json"), table(headers, rows), legend])


def _matrix_cell(k: Counter) -> str:
    if not (k[PASS] or k[XFAIL] or k[FAIL]):
        return "–"
    text = f"{k[PASS]}/{k[XFAIL]}/{k[FAIL]}"
    return f"**{text}**" if k[FAIL] else text


def _outcome_groups(data: dict[str, Any], kinds: set[str]):
    """(design, clause, test_id, outcome, reason) -> variants, for results of the given kinds."""
    groups: dict[tuple[str, str, str, str, str], list[str]] = defaultdict(list)
    for r in data["results"]:
        kind = OUTCOME_KIND.get(r.get("outcome", ""), FAIL)
        if kind not in kinds:
            continue
        key = (r["design"], r.get("clause") or "?", r["test_id"], r.get("outcome", "?"), r.get("reason") or "")
        groups[key].append(r.get("variant") or r["design"])
    return groups


def _variants_text(variants: list[str], all_variants: list[str]) -> str:
    variants = sorted(set(variants), key=variant_sort_key)
    if len(all_variants) > 1 and set(variants) == set(all_variants):
        return "all"
    return ", ".join(code(v) for v in variants)


def _per_design(inputs: Inputs, kinds: set[str], empty: str, render) -> str:
    """One table per design of the results of the given kinds; ``render(groups, all_variants)`` makes it."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    groups = _outcome_groups(data, kinds)
    if not groups:
        return setup_line(data["setup"], "conformance.json") + "\n\n" + empty
    _, _, _, design_of, variants = conformance_parts(data)
    out = [setup_line(data["setup"], "conformance.json")]
    for design in dict.fromkeys(design_of[v] for v in variants):
        mine = {k: v for k, v in groups.items() if k[0] == design}
        if mine:
            out.append(render(mine, [v for v in variants if design_of[v] == design]))
    return "\n\n".join(out)


def block_expected_failures(inputs: Inputs, page_dir: Path) -> str:
    """Every expected failure, per design, grouped by reason: the clauses and tests (with variants) each covers."""

    def render(mine, all_variants: list[str]) -> str:
        by_reason: dict[str, list] = defaultdict(list)
        for key, vs in sorted(mine.items(), key=lambda kv: (clause_key(kv[0][1]), kv[0][2])):
            by_reason[key[4]].append((key, vs))
        rows = []
        for reason, tests in by_reason.items():
            clauses = ", ".join(dict.fromkeys(key[1] for key, _ in tests))
            listed = "<br>".join(f"{code(key[2])} ({_variants_text(vs, all_variants)})" for key, vs in tests)
            rows.append([clauses, cell(reason) or "–", listed])
        design = next(iter(mine))[0]
        reasons = f"{len(by_reason)} reason" + ("s" if len(by_reason) > 1 else "")
        return (f"**{code(design)}** ({len(mine)} tests, {reasons})\n\n"
                + table(["Clauses", "Reason", "Tests (variants)"], rows))

    return _per_design(inputs, {XFAIL}, "No expected failures.", render)


def block_failures(inputs: Inputs, page_dir: Path) -> str:
    """Every failure, error, unexpected pass and skip, per design."""

    def render(mine, all_variants: list[str]) -> str:
        rows = [[clause, code(test_id), outcome, _variants_text(vs, all_variants), cell(reason) or "–"]
                for (_, clause, test_id, outcome, reason), vs in sorted(
                    mine.items(), key=lambda kv: (clause_key(kv[0][1]), kv[0][2]))]
        design = next(iter(mine))[0]
        return f"**{code(design)}** ({len(mine)})\n\n" + table(["Clause", "Test", "Outcome", "Variants", "Reason"], rows)

    return _per_design(inputs, {FAIL, SKIP}, "No failures, errors, unexpected passes or skips.", render)


def block_designs(inputs: Inputs, page_dir: Path) -> str:
    """The designs the conformance results cover: name, one-line summary (from the registry) and variants run."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    summaries = {k: (v or {}).get("summary", "") for k, v in (data.get("designs") or {}).items()}
    _, _, _, design_of, variants = conformance_parts(data)
    names = list(dict.fromkeys([*summaries, *design_of.values()]))
    if not names:
        return setup_line(data["setup"], "conformance.json") + "\n\nNo designs in the results file."
    rows = []
    for name in names:
        mine = [v for v in variants if design_of[v] == name]
        rows.append([code(name), cell(summaries.get(name, "")) or "–", ", ".join(code(v) for v in mine) or "not run"])
    return setup_line(data["setup"], "conformance.json") + "\n\n" + table(
        ["Design", "Summary (from the registry)", "Variants the suite ran"], rows)


def block_clause_tests(inputs: Inputs, page_dir: Path) -> str:
    """The test ids that check each clause (test functions, with how many parametrized cases each runs per variant)."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    cases: dict[str, Counter] = defaultdict(Counter)
    counted = data["results"][0]["variant"] if data["results"] else None  # every variant runs the same tests
    for result in data["results"]:
        if result["variant"] == counted:
            cases[result["clause"]][result["test_id"].split("[")[0]] += 1
    titles = data.get("clauses") or {}
    rows = [
        [clause, cell(titles.get(clause, "")), "<br>".join(f"{code(test)} ({n})" for test, n in sorted(tests.items()))]
        for clause, tests in sorted(cases.items(), key=lambda kv: int(kv[0][1:]))
    ]
    return setup_line(data["setup"], "conformance.json") + "\n\n" + table(
        ["Clause", "Title", "Tests (cases per design variant)"], rows)
