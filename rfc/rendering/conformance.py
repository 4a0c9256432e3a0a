"""Conformance blocks: the matrix, expected failures and failures, the designs and each clause's tests."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rendering.markdown import cell, code, conformance_setup, no_results, relative_link, slugify, table
from rendering.registry_order import registry_key
from rendering.results import CONFORMANCE_COMMAND, FAIL, OUTCOME_KIND, PASS, SKIP, XFAIL, Inputs

MATRIX_PAGE = "matrix.md"  # the generated page (in the output directory) that holds the matrix and the reasons
# The class of a matrix cell's failure count: the site's CSS marks it red, the one thing red means there (as F<n>
# in the terminal); expected failures and skips are ordinary links.
FAILURE_CLASS = "matrix-failure"


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
    # the registry's order, whatever order the results file lists designs in; one the registry lacks after it
    design_order = sorted(dict.fromkeys([*(data.get("designs") or {}), *design_of.values()]), key=registry_key)
    variants = sorted(design_of, key=lambda v: (design_order.index(design_of[v]), registry_key(v)))
    return clauses, ordered_clauses, counts, design_of, variants


def clause_anchors(specification: Path) -> dict[str, str]:
    """``{clause: anchor}`` of the specification's ``## C<n> Title`` headings; empty when there is no such page."""
    if not specification.is_file():
        return {}
    headings = re.finditer(r"^## ((C\d+)\b.*?)\s*$", specification.read_text(encoding="utf-8"), re.MULTILINE)
    return {m.group(2): slugify(m.group(1)) for m in headings}


def reasons_anchor(design: str, clause: str | None = None) -> str:
    """The anchor of a design's expected failures (of one clause) on the matrix page."""
    return "xf-" + slugify(design if clause is None else f"{design} {clause}")


def failures_anchor(design: str) -> str:
    return "failures-" + slugify(design)


def _row_groups(variants: list[str], design_of: dict[str, str], counts) -> list[tuple[str, list[str]]]:
    """(design, its consecutive variants with identical counts): one matrix row each."""
    groups: list[tuple[str, list[str]]] = []
    for v in variants:
        if groups and groups[-1][0] == design_of[v] and counts[groups[-1][1][0]] == counts[v]:
            groups[-1][1].append(v)
        else:
            groups.append((design_of[v], [v]))
    return groups


def _row_label(design: str, variants: list[str]) -> str:
    if len(variants) == 1:
        return code(variants[0])
    options = [v[len(design) + 1:-1] if v.startswith(design + "[") and v.endswith("]") else v for v in variants]
    return f"{code(design)}<br><small>{cell(', '.join(options))}</small>"


def _matrix_cell(k: Counter, reasons: str, failures: str) -> str:
    ran = k[PASS] + k[XFAIL] + k[FAIL] + k[SKIP]
    if not ran:
        return "–"
    parts = [] if k[FAIL] or k[XFAIL] else ["✓"]
    if k[FAIL]:
        parts.append(f'**[!{k[FAIL]}]({failures} "{k[FAIL]} of {ran} failed, errored or passed unexpectedly")'
                     f'{{ .{FAILURE_CLASS} }}**')
    if k[XFAIL]:
        parts.append(f'[✗{k[XFAIL]}]({reasons} "{k[XFAIL]} of {ran} are expected failures: their reasons")')
    if k[SKIP]:
        parts.append(f'[s{k[SKIP]}]({failures} "{k[SKIP]} of {ran} skipped")')
    return " ".join(parts)


def block_matrix(inputs: Inputs, page_dir: Path) -> str:
    """The conformance matrix: design x clause, each cell passed or linked to the reasons its tests fail."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    clauses, ordered, counts, design_of, variants = conformance_parts(data)
    if not variants:
        return conformance_setup(data) + "\n\nThe results file holds no test outcomes."
    specification = inputs.rfc_dir / "specification.md"
    anchors = clause_anchors(specification)
    spec_link = relative_link(specification, page_dir)
    matrix_link = relative_link(inputs.out_dir / MATRIX_PAGE, page_dir)

    def header(c: str) -> str:
        title = cell(clauses[c]).replace('"', "&quot;")
        return f'[{c}]({spec_link}#{anchors[c]} "{title}")' if c in anchors else f'<abbr title="{title}">{c}</abbr>'

    headers = ["Design"] + [header(c) for c in ordered] + ["All"]
    rows = []
    for design, group in _row_groups(variants, design_of, counts):
        failures = f"{matrix_link}#{failures_anchor(design)}"
        row, total = [_row_label(design, group)], Counter()
        for c in ordered:
            k = counts[group[0]].get(c, Counter())
            total.update(k)
            row.append(_matrix_cell(k, f"{matrix_link}#{reasons_anchor(design, c)}", failures))
        summary = _matrix_cell(total, f"{matrix_link}#{reasons_anchor(design)}", failures)
        row.append(f"{summary} {sum(total.values())}" if summary == "✓" else f"{summary} of {sum(total.values())}")
        rows.append(row)
    legend = (
        "✓: every test of the clause passed. ✗*n*: *n* tests are expected failures of the design; the link leads "
        "to their reasons. **!*n***, in red: *n* tests failed, errored or passed unexpectedly (red marks nothing "
        "else). s*n*: *n* skipped. –: no "
        "test of the clause ran. *All*: every clause together, out of the tests the design ran. A row stands for "
        "each variant it names (they have the same outcomes); a cell's tooltip gives its counts."
    )
    key = "Clauses: " + " · ".join(f"**{c}** {cell(clauses[c])}".strip() for c in ordered)
    grid = table(headers, rows, ["---"] + [":---:"] * (len(ordered) + 1))
    return "\n\n".join([conformance_setup(data),
                         f'<div class="conformance-matrix" markdown>\n\n{grid}\n\n</div>', legend, key])


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


def _only_in(variants: list[str], all_variants: list[str]) -> str:
    """`` (in `a`, `b`)`` when a test's outcome holds for some of its design's variants, else nothing."""
    variants = sorted(set(variants), key=registry_key)
    if set(variants) == set(all_variants):
        return ""
    return " (in " + ", ".join(code(v) for v in variants) + ")"


def _tests_line(tests: list[tuple[str, list[str]]], all_variants: list[str]) -> str:
    """Test ids grouped by test function: ``file::test`` followed by each parametrization that applies."""
    by_function: dict[str, list[str]] = defaultdict(list)
    for test_id, vs in tests:
        function, bracket, params = test_id.partition("[")
        by_function[function].append((code(bracket + params) if bracket else "") + _only_in(vs, all_variants))
    return " · ".join(" ".join([code(function), *(c.strip() for c in cases if c)])
                      for function, cases in by_function.items())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _per_design(inputs: Inputs, kinds: set[str], empty: str, render) -> str:
    """The results of the given kinds per design; ``render(design, groups, all_variants, clauses)`` makes each."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    groups = _outcome_groups(data, kinds)
    if not groups:
        return conformance_setup(data) + "\n\n" + empty
    clauses, _, _, design_of, variants = conformance_parts(data)
    out = [conformance_setup(data)]
    for design in dict.fromkeys(design_of[v] for v in variants):
        mine = {k: v for k, v in groups.items() if k[0] == design}
        if mine:
            out.append(render(design, mine, [v for v in variants if design_of[v] == design], clauses))
    return "\n\n".join(out)


def _by_clause(mine) -> dict[str, dict[str, list[tuple[str, list[str]]]]]:
    """clause -> reason -> [(test id, variants)], clauses in contract order and tests in id order."""
    grouped: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for (_, clause, test_id, _, reason), vs in sorted(mine.items(), key=lambda kv: (clause_key(kv[0][1]), kv[0][2])):
        grouped[clause][reason].append((test_id, vs))
    return grouped


def block_expected_failures(inputs: Inputs, page_dir: Path) -> str:
    """Every expected failure, per design and clause, grouped by reason: each reason once, then the tests it covers."""

    def render(design: str, mine, all_variants: list[str], clauses: dict[str, str]) -> str:
        out = [f"### {code(design)}: {_count(len(mine), 'expected failure')}, "
               f"{_count(len({key[4] for key in mine}), 'reason')} {{#{reasons_anchor(design)}}}"]
        for clause, reasons in _by_clause(mine).items():
            title = " ".join(filter(None, [clause, cell(clauses.get(clause, ""))]))
            tests = _count(sum(len(tests) for tests in reasons.values()), "test")
            out.append(f"#### {title} ({tests}) {{#{reasons_anchor(design, clause)}}}")
            out.append("\n".join(f"- {cell(reason) or 'no reason given'}<br>"
                                 f"<small>{_tests_line(tests, all_variants)}</small>"
                                 for reason, tests in reasons.items()))
        return "\n\n".join(out)

    return _per_design(inputs, {XFAIL}, "No expected failures.", render)


def block_failures(inputs: Inputs, page_dir: Path) -> str:
    """Every failure, error, unexpected pass and skip, per design and clause."""

    def render(design: str, mine, all_variants: list[str], clauses: dict[str, str]) -> str:
        items = [
            f"- **{clause}** {code(test_id)}{_only_in(vs, all_variants)}: {outcome}"
            + (f": {cell(reason)}" if reason else "")
            for (_, clause, test_id, outcome, reason), vs in sorted(
                mine.items(), key=lambda kv: (clause_key(kv[0][1]), kv[0][2]))
        ]
        return f"### {code(design)}: {len(mine)} {{#{failures_anchor(design)}}}\n\n" + "\n".join(items)

    return _per_design(inputs, {FAIL, SKIP}, "No failures, errors, unexpected passes or skips.", render)


def block_designs(inputs: Inputs, page_dir: Path) -> str:
    """The designs the conformance results cover: name, one-line summary (from the registry) and variants run."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    summaries = {k: (v or {}).get("summary", "") for k, v in (data.get("designs") or {}).items()}
    _, _, _, design_of, variants = conformance_parts(data)
    names = sorted(dict.fromkeys([*summaries, *design_of.values()]), key=registry_key)
    if not names:
        return conformance_setup(data) + "\n\nNo designs in the results file."
    rows = []
    for name in names:
        mine = [v for v in variants if design_of[v] == name]
        rows.append([code(name), cell(summaries.get(name, "")) or "–", ", ".join(code(v) for v in mine) or "not run"])
    return conformance_setup(data) + "\n\n" + table(
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
    return conformance_setup(data) + "\n\n" + table(
        ["Clause", "Title", "Tests (cases per design variant)"], rows)
