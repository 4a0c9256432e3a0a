"""The benchmark targets as the pages show them: each target's rule, a result's figure with its interval and verdict,
the targets table, and which targets a scenario row meets or misses."""

from __future__ import annotations

import json
from typing import Any

from harness_common import RATIO_TOLERANCE
from rendering.markdown import cell, code, fmt_number, is_number, is_scalar, table
from rendering.registry_order import registry_key


def target_rule(spec: dict[str, Any]) -> str:
    metric, compare, threshold = spec.get("metric"), spec.get("compare"), spec.get("threshold")
    if metric is None or compare is None or threshold is None:
        return "–"
    shown = fmt_number(str(metric), threshold) if is_number(threshold) else cell(threshold)
    return f"{code(metric)} {cell(str(compare).replace('>=', '≥').replace('<=', '≤'))} {shown}"


VERDICT_TEXT = {"met": "met", "missed": "**missed**", "inconclusive": "*inconclusive*", "not judged": "not judged"}


def verdict_of(result: dict[str, Any]) -> str | None:
    """A judged result's verdict: met, missed, inconclusive or not judged (files without one: from ``met``)."""
    if result.get("verdict") in VERDICT_TEXT:
        return result["verdict"]
    met = result.get("met")
    return "met" if met is True else "missed" if met is False else None


def verdict(result: dict[str, Any]) -> str:
    text = VERDICT_TEXT.get(verdict_of(result) or "", "–")
    if verdict_of(result) == "not judged" and result.get("reason"):
        text += f" ({cell(result['reason'])})"
    return text


def with_interval(metric: str, value: Any, interval: Any) -> str:
    """A median with its 95 % interval, e.g. ``0.93 [0.91, 0.95]``."""
    text = fmt_number(metric, value)
    if isinstance(interval, list) and len(interval) == 2 and all(is_number(v) for v in interval):
        text += f" [{fmt_number(metric, interval[0])}, {fmt_number(metric, interval[1])}]"
    return text


def target_result_cell(result: dict[str, Any], metric: str, threshold: Any = None) -> str:
    value = result.get("value")
    text = fmt_number(metric, value) if is_scalar(value) else code(json.dumps(value))
    if is_number(value) and is_number(threshold) and text == fmt_number(metric, threshold) and value != threshold:
        text = f"{value:.4f}"  # rounding would make a miss read like the threshold itself
    if result.get("interval"):
        text += with_interval(metric, value, result["interval"]).removeprefix(fmt_number(metric, value))
    if result.get("point") is not None:
        text = f"{cell(result['point'])}: {text}"
    if is_number(result.get("limit")):
        text += f" (limit {fmt_number(metric, result['limit'])})"
    return f"{text} {verdict(result)}"


def _off_nominal(measured: Any, nominal: Any) -> bool:
    """The benchmarks' ratio rule: a measured L/C or M/C further than ``RATIO_TOLERANCE`` from its nominal one."""
    return is_number(measured) and is_number(nominal) and nominal != 0 \
        and abs(measured / nominal - 1) > RATIO_TOLERANCE


def point_judged(row: dict[str, Any], metric: str) -> bool:
    """Whether the targets could judge ``row[metric]``: it has a 95 % interval and its point measured the ratio it
    names (the reasons a benchmark result is "not judged")."""
    interval = row.get(f"{metric}_interval")
    has_interval = isinstance(interval, list) and len(interval) == 2 and all(is_number(v) for v in interval)
    return has_interval and not any(_off_nominal(row.get(f"{ratio}_measured"), row.get(ratio))
                                    for ratio in ("L_over_C", "M_over_C"))


def _measured_ratio(result: dict[str, Any]) -> str:
    for ratio, label in (("M_over_C", "M/C"), ("L_over_C", "L/C")):  # S6 rows also carry the producer's L/C
        measured = result.get(f"{ratio}_measured")
        if is_number(measured):
            text = f"{label} {fmt_number(ratio, measured)}"
            nominal = result.get(ratio)
            if _off_nominal(measured, nominal):
                share = f"{RATIO_TOLERANCE * 100:.0f} %"
                text += f" (**off** the nominal {fmt_number(ratio, nominal)} by more than {share})"
            return text
    return "–"


def targets_table(targets: Any) -> str:
    """One row per judged result: target, rule, design, point, median, 95 % interval, measured ratio, verdict."""
    if not targets:
        return "No targets recorded in the results file."
    rows, notes = [], []
    for name, spec in targets.items():
        metric = str(spec.get("metric", ""))
        results = sorted(spec.get("results") or [], key=lambda r: registry_key(str(r.get("design", ""))))
        for r in results:
            value = r.get("value")
            shown = fmt_number(metric, value) if is_scalar(value) else code(json.dumps(value))
            threshold = spec.get("threshold")
            if is_number(value) and is_number(threshold) and shown == fmt_number(metric, threshold) \
                    and value != threshold:
                shown = f"{value:.4f}"  # rounding would make a miss read like the threshold itself
            if is_number(r.get("limit")):
                shown += f" (limit {fmt_number(metric, r['limit'])})"
            interval = r.get("interval")
            shown_interval = (with_interval(metric, value, interval).removeprefix(fmt_number(metric, value)).strip()
                              if interval else "–")
            rows.append([cell(name), target_rule(spec), code(r.get("design", "?")), cell(r.get("point") or "–"),
                         shown, shown_interval, _measured_ratio(r), verdict(r)])
        if not results:
            rows.append([cell(name), target_rule(spec), "–", "–", "–", "–", "–",
                         cell(spec.get("note") or "no result")])
        notes.append(f"- **{cell(name)}**: {cell(spec.get('what', ''))}")
    legend = ("Median over rounds, and its 95 % interval (order statistics of the per-round figures). Verdict: met or"
              " missed when the whole interval is on one side of the threshold, *inconclusive* when it straddles"
              " it, not judged (with the reason) when there is no interval or the point's measured ratio is off"
              " its nominal value.")
    return (table(["Target", "Rule", "Design", "Point", "Median", "95 % interval", "Measured ratio", "Verdict"], rows)
            + "\n\n" + legend
            + "\n\n<details><summary>What each target judges</summary>\n\n" + "\n".join(notes) + "\n\n</details>")


def row_verdicts(row: dict[str, Any], scenario: str, targets: dict[str, Any]) -> str:
    """The targets this row is judged by, each met or missed ("–": none applies). A row of a scenario measured at
    several world sizes or steps carries a verdict only where the target judged that row; a baseline, an alternative
    or a control never does."""
    if row.get("role", "design") != "design":
        return "–"
    out = []
    for name, spec in (targets or {}).items():
        if name.split("-")[0] != scenario:
            continue
        if scenario == "S3" and row.get("flavour") != ("regular" if name == "S3-regular" else "dataloader_iter"):
            continue
        for r in spec.get("results") or []:
            # a result names no world size or step: where a scenario has several per design (S7), the row it judged
            # is the one whose figure it holds
            several = "world_size" in row or "step" in row
            if several and r.get("value") != row.get(spec.get("metric")):
                continue
            if r.get("design") == row.get("design") and r.get("point") == row.get("point"):
                out.append(f"{cell(name)} {VERDICT_TEXT.get(verdict_of(r) or '', '–')}")
    return "<br>".join(out) or "–"
