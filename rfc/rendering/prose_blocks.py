"""Blocks for sentences that restate the code or the results: the decisions on a page's first screen, what a design
ships, its user code, the variants the suite runs, the clauses it meets, and the size of the runs a rule rests on.

Each is rendered from the registry (``prototypes.DESIGNS``), a design module's docstring or the committed
results, so that ``python rfc/render.py --check`` fails when the prose and its source part.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

from prototypes import DESIGNS
from prototypes.coupling import design_module
from rendering.conformance import MATRIX_PAGE, reasons_anchor
from rendering.markdown import code, no_results
from rendering.results import CONFORMANCE_COMMAND, Inputs
from rendering.standing import link_in_rfc, stance

USER_CODE_RE = re.compile(r"^User code::\n\n(?P<body>(?:    .*\n|\n)+)", re.MULTILINE)
# The runs the drain-end rule of C17 rests on: the variant and the clauses of the specification's rationale.
END_RULE_VARIANT = "prefetcher[depth=2]"
END_RULE_CLAUSES = ("C5", "C14", "C17")


def shipping_sentence(name: str) -> str:
    """What a design ships: its registered configuration, and whether a prefetch thread runs by default."""
    design = DESIGNS[name]
    text = f"{code(name)} ships as {code(design.id)}" + (
        f" ({code(f'options={dict(design.options)!r}')})" if design.options else " (no options)")
    if not design.thread_options:
        return text
    if dict(design.options) == dict(design.thread_options):
        return text + ": **its prefetch thread runs by default** (the options are its `thread_options`)"
    thread = design.variant(**design.thread_options).id
    return text + f": **no prefetch thread by default**; the thread is opt-in, {code(thread)} (its `thread_options`)"


def user_code(name: str) -> str:
    """The ``User code::`` example of a design module's docstring, as a Python code block."""
    module = importlib.import_module(design_module(DESIGNS[name]))
    match = USER_CODE_RE.search(module.__doc__ or "")
    if not match:
        raise ValueError(f"{module.__name__}: its docstring has no 'User code::' example for the design page")
    lines = [line.removeprefix("    ") for line in match.group("body").rstrip().splitlines()]
    return "```python\n" + "\n".join(lines) + "\n```"


def suite_variants(name: str) -> str:
    """The configurations the conformance suite runs for a design by default: its options, then ``suite_variants``."""
    design = DESIGNS[name]
    ids = [design.id] + [design.variant(**options).id for options in design.suite_variants]
    text = f"The conformance suite runs {code(ids[0])} (the registered default)"
    if len(ids) > 1:
        others = [code(i) for i in ids[1:]]
        listed = others[0] if len(others) == 1 else ", ".join(others[:-1]) + " and " + others[-1]
        text += f", then {listed} (its `Design.suite_variants`)"
    return text + "."


def conformance_stance(inputs: Inputs, page_dir: Path, name: str) -> str:
    """The clauses a design meets in the committed run, and its expected failures per clause."""
    if not inputs.conformance:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    found = stance(inputs.conformance, name)
    if found is None:
        return f"The committed conformance run does not include {code(name)}."
    text = f"In the committed run, {code(name)} meets {len(found.met)} of {len(found.tested)} clauses in every variant"
    if found.missed:
        text += f" (not {', '.join(found.missed)})"
    expected = [f"{c} ×{n}" for c, n in found.expected_failures.items() if n]
    failures = [f"{c} ×{n}" for c, n in found.failures.items() if n]
    if expected:
        matrix = link_in_rfc(inputs, page_dir, f"generated/{MATRIX_PAGE}#{reasons_anchor(name)}")
        text += f"; its expected failures, each with its reason in the [matrix]({matrix}): " + ", ".join(expected)
    else:
        text += "; it has no expected failure"
    if failures:
        text += "; **failures:** " + ", ".join(failures)
    return text + "." + _gaps(inputs.conformance, name)


def _gaps(conformance: dict, name: str) -> str:
    """Each gap of the design's expected-failures file once: its key, its sentence and how many tests it explains
    in the committed run (results written before the files named gaps have none to list)."""
    gaps = ((conformance.get("designs") or {}).get(name) or {}).get("gaps") or {}
    if not gaps:
        return ""
    explained: dict[str, int] = {}
    for row in conformance.get("results") or []:
        if row.get("design") == name and row.get("outcome") == "xfailed" and row.get("gap"):
            explained[row["gap"]] = explained.get(row["gap"], 0) + 1
    lines = [f"- {code(key)} ({explained.get(key, 0)} tests): {sentence}" for key, sentence in sorted(gaps.items())]
    return (f"\n\nIts gaps, each named once in `tests/conformance/expected_failures/{name}.txt` and referred to by"
            " key from the tests it explains:\n\n" + "\n".join(lines))


def block_end_rule_runs(inputs: Inputs, page_dir: Path) -> str:
    """How many of the suite's tests and TorchRec runs the chosen drain-end rule passes (C17's rationale)."""
    if not inputs.conformance:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    mine = [r for r in inputs.conformance["results"] if (r.get("variant") or r["design"]) == END_RULE_VARIANT]
    steps = [r for r in mine if r.get("clause") in END_RULE_CLAUSES]
    pipelines = [r for r in mine if r.get("clause") == "C19"]
    if not steps:
        return f"The committed conformance run does not include {code(END_RULE_VARIANT)}."

    def passed(rows: list) -> str:
        expected = sum(r.get("outcome") == "xfailed" for r in rows)
        return (f"{sum(r.get('outcome') == 'passed' for r in rows)} of {len(rows)}"
                + (f" (and records {expected} expected failures)" if expected else ""))

    return (f"Under the chosen rule {code(END_RULE_VARIANT)} passes {passed(steps)} tests of "
            f"{', '.join(END_RULE_CLAUSES)} (the suite's steps) and {passed(pipelines)} C19 runs (TorchRec's "
            "pipelines) in the committed run.")


def _per_design(make: Callable[[Inputs, Path, str], str], doc: str) -> dict[str, Callable[[Inputs, Path], str]]:
    blocks = {}
    for name in DESIGNS:
        def block(inputs: Inputs, page_dir: Path, name: str = name) -> str:
            return make(inputs, page_dir, name)

        block.__doc__ = doc
        blocks[name] = block
    return blocks


PROSE_BLOCKS: dict[str, Callable[[Inputs, Path], str]] = {
    "end-rule-runs": block_end_rule_runs,
    **{f"ships-{n}": b for n, b in _per_design(lambda i, p, n: shipping_sentence(n) + ".",
                                               "What a design ships, from the registry.").items()},
    **{f"user-code-{n}": b for n, b in _per_design(lambda i, p, n: user_code(n),
                                                   "A design's user code, from its module's docstring.").items()},
    **{f"suite-variants-{n}": b for n, b in _per_design(lambda i, p, n: suite_variants(n),
                                                        "The variants the suite runs, from the registry.").items()},
    **{f"conformance-{n}": b for n, b in _per_design(conformance_stance,
                                                     "The clauses a design meets, from the results.").items()},
}
