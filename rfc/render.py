#!/usr/bin/env python3
"""Render the RFC's generated parts from the committed JSON results in ``rfc/results/``.

    python rfc/render.py            # (re)write the generated pages, blocks and plots
    python rfc/render.py --check    # exit 1, naming each stale file, if the committed pages are out of date, or
                                    # if a results file predates a change to the sources it measured

What it writes:

* ``rfc/generated/matrix.md``: the conformance matrix (design x clause: passed, or a count linked to the
  reasons), every expected failure grouped by clause and reason, and every unexpected outcome.
* ``rfc/generated/benchmarks.md``: per machine (one ``benchmarks-<machine>.json`` each) the targets and the
  tables of scenarios S1-S7 (and any other scenario the file holds), the run notes, and the plots
  (``rfc/generated/<plot>-<machine>.png``), each with the JSON that describes what it draws beside it
  (``<plot>-<machine>.json``: every series' label, colour, marker and the series it stands for; see
  ``rendering/plot_series.py``).
* Blocks inside hand-written pages (any ``*.md`` under ``rfc/`` outside ``generated/`` and ``results/``)::

      <!-- BEGIN GENERATED: standing -->
      (replaced on every render; text outside the markers is never touched)
      <!-- END GENERATED: standing -->

  Block names: see ``BLOCKS`` in ``rendering/pages.py`` (``python rfc/render.py --list-blocks``).

* The code pointers of the RFC's list "What Lightning has to change": each item ends with an inline block
  ``code-item-<n>`` naming the classes and functions tagged ``[RFC n]`` in ``prototypes/``; a render fails, naming
  the item or the tag, on an item without a tag (unless it says ``*No prototype code:*`` and why) or a tag without an
  item (``rendering/code_pointers.py``).

Every block renders the setup line (machine, versions, commit) of the JSON it reads; a page shows each setup line
and each run warning once, where it first appears (``once_per_page`` in ``rendering/markdown.py``). Missing result
files render a "no results yet: run <command>" note. PNG staleness is judged from a hash of the plot's input data
recorded in the page (matplotlib's bytes are not stable across versions), so re-rendering unchanged data never
rewrites a committed PNG.

The work is done by the ``rendering`` package next to this script (one module per job); this is its command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Run as a script or loaded by path (tests): the ``rendering`` package sits next to this file, and what it shares
# with the suite and the benchmarks (``harness_common``, the registry in ``prototypes``) in the repository above it.
for _path in (HERE.parent, HERE):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from rendering.evidence import outdated_records  # noqa: E402
from rendering.pages import BLOCKS, display_path, plan, stale, write  # noqa: E402
from rendering.results import RenderError, load_inputs  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if any generated file is stale; write nothing")
    parser.add_argument("--rfc-dir", type=Path, default=HERE, help="the RFC directory (default: this script's)")
    parser.add_argument("--results", type=Path, help="results directory (default: RFC_DIR/results)")
    parser.add_argument("--out", type=Path, help="generated-pages directory (default: RFC_DIR/generated)")
    parser.add_argument("--list-blocks", action="store_true", help="list the block names usable in markers")
    args = parser.parse_args(argv)

    if args.list_blocks:
        for name, fn in BLOCKS.items():
            print(f"{name}: {(fn.__doc__ or '').strip().splitlines()[0] if fn.__doc__ else ''}")
        print("code-item-<n>: inline, in item n of the list 'What Lightning has to change': the code tagged [RFC n]")
        return 0

    rfc_dir = args.rfc_dir.resolve()
    results = (args.results or rfc_dir / "results").resolve()
    out = (args.out or rfc_dir / "generated").resolve()
    command = "python " + display_path(Path(__file__).resolve())
    for flag, value, default in (("--rfc-dir", rfc_dir, HERE), ("--results", results, rfc_dir / "results"),
                                 ("--out", out, rfc_dir / "generated")):
        if value != default.resolve():
            command += f" {flag} {display_path(value)}"
    try:
        inputs = load_inputs(rfc_dir, results, out, "python rfc/render.py")
        the_plan = plan(inputs)
    except RenderError as exc:
        print(f"render: error: {exc}", file=sys.stderr)
        return 2

    if args.check:
        problems = stale(inputs, the_plan)
        if problems:
            print("render --check: generated RFC content is stale:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            print(f"fix: run `{command}` and commit the result", file=sys.stderr)
            return 1
        outdated = outdated_records(results, rfc_dir.parent)
        if outdated:
            print("render --check: results older than the code they speak for:", file=sys.stderr)
            for line in outdated:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"render --check: {len(the_plan.texts)} pages and plot descriptions, and {len(the_plan.plots)} plots "
              "up to date")
        return 0

    written = write(inputs, the_plan)
    for path in written:
        print(f"wrote {display_path(path)}" if path.exists() else f"removed {display_path(path)}")
    if not written:
        print("render: everything up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
