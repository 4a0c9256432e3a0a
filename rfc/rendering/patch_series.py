"""The patch to Lightning as a stack of pull requests: their commits, each item's code here and its lines in Lightning,
whether every commit runs on its own, and what a user of today's flavour notices. Rendered from
``rfc/results/patch-series.json`` (``python -m patch.series --summary``) and ``patch-prefixes.json``."""

from __future__ import annotations

from pathlib import Path

from harness_common import REPO_ROOT
from prototypes.patched import SERIES_MODULES
from rendering.code_pointers import PATCH_SUMMARY, no_code_of_its_own
from rendering.markdown import cell, code, commit_text, no_results
from rendering.results import Inputs, load_json

COMMAND = "python -m patch.series --out patches --summary rfc/results/patch-series.json"


def block_patch_series(inputs: Inputs, page_dir: Path) -> str:
    path = inputs.results_dir / PATCH_SUMMARY
    if not path.is_file():
        return no_results("the patch series summary", COMMAND)
    summary = load_json(path)
    items, pull_requests = summary["items"], summary["pull_requests"]
    with_edits = [item for item in items if item["code"]]
    added, removed = sum(i["added"] for i in items), sum(i["removed"] for i in items)
    files = sorted({f["path"] for item in items for f in item["files"]})
    commits = [commit for pull_request in pull_requests for commit in pull_request["commits"]]
    lines = [
        f"The patch to pytorch-lightning {summary['release']} is a stack of {len(pull_requests)} pull requests of"
        f" {len(commits)} commits in all, in the order a maintainer would merge them; {len(with_edits)} of the"
        f" {len(items)} items of the RFC's change list edit Lightning's code, adding {added} lines and removing"
        f" {removed} in {len(files)} files (`{COMMAND}`; `--layout repository` writes it for"
        " `src/lightning/pytorch/`). Each pull request's directory holds its patches and its description: what it"
        " changes and why, its commits, what a user notices, how to adapt, its CHANGELOG entries.",
        "",
        "| Pull request | Commit | Items | Lightning's lines (+/−) |",
        "| --- | --- | --- | --- |",
    ]
    for number, pull_request in enumerate(pull_requests, start=1):
        for index, commit in enumerate(pull_request["commits"]):
            title = f"{number}. {cell(pull_request['title'])}" if index == 0 else ""
            lines.append(f"| {title} | {cell(commit['subject'])} | {', '.join(map(str, commit['items']))} |"
                         f" +{commit['added']} −{commit['removed']} |")
    lines += ["", *budget_lines(summary), "", generator_line(REPO_ROOT)]
    lines += ["", "| Item | Code here | Lightning's lines (+/−) |", "| --- | --- | --- |"]
    for item in items:
        where = code(item["code"]) if item["code"] else f"{no_code_of_its_own(item)}: {item['part']}"
        lines.append(f"| {item['number']} | {where} | +{item['added']} −{item['removed']} |")
    lines += ["", *prefix_lines(inputs), "", *master_lines(inputs)]
    lines += ["", "What a user of today's flavour notices, item by item (each item's part of its commit's message):",
              ""]
    for item in items:
        lines.append(f"- **{item['number']}. {cell(item['title'])}.** {' '.join(item['why'].split())}")
    return "\n".join(lines)


def generator_lines(root: Path) -> dict[str, int]:
    """Non-blank lines of the Python under ``root/patch``: the items, the modules that write them into Lightning and
    make the stack (``SERIES_MODULES``), the stack's tests for Lightning, and the tools that run and judge it."""
    counts = dict.fromkeys(("items", "writer", "tests", "checks"), 0)
    for path in sorted((root / "patch").rglob("*.py")):
        parts = path.relative_to(root / "patch").parts
        kind = ("items" if parts[0] == "items" else "tests" if parts[0] == "tests_pytorch"
                else "writer" if path.stem in SERIES_MODULES and len(parts) == 1 else "checks")
        counts[kind] += sum(1 for line in path.read_text().splitlines() if line.strip())
    return counts


def generator_line(root: Path) -> str:
    """What makes the series here, and why it is made rather than kept as patches."""
    counts = generator_lines(root)
    writer = ", ".join(f"`{name}`" for name in SERIES_MODULES)
    return (f"What makes the series: {counts['items']:,} non-blank lines of Python in `patch/items/` say what goes into"
            f" Lightning and where, and {counts['writer']:,} write it into Lightning's classes and make the stack"
            f" ({writer}). The stack's tests for Lightning are {counts['tests']:,} more, and the tools that run and"
            f" judge it {counts['checks']:,}. The series is made, not kept as patches, so that the same items make it"
            " on the release and on master, and an item whose place moved stops with an error naming the place.")


def budget_lines(summary: dict) -> list[str]:
    """The lines the stack adds to the package's modules by kind, against the budget the RFC holds it to."""
    kinds = summary.get("added_source")
    if kinds is None:
        return []
    total, budget = sum(kinds.values()), summary["source_lines_budget"]
    verdict = "within" if total <= budget else f"{total - budget} lines **over**"
    return [
        f"Of the lines added, {total} are in the package's modules (its tests and the CHANGELOG aside):"
        f" {kinds['code']} of code, {kinds['docstrings']} of docstrings, {kinds['comments']} of comments and"
        f" {kinds['blank']} blank; {verdict} the budget of {budget} lines a reviewer's pass takes in."
    ]


def block_patch_migration(inputs: Inputs, page_dir: Path) -> str:
    """What a user of today's flavour notices under the stack and how to adapt, each change with the tests that show
    it (``patch/migration.py``, written into the series summary)."""
    path = inputs.results_dir / PATCH_SUMMARY
    if not path.is_file():
        return no_results("the patch series summary", COMMAND)
    rows = load_json(path).get("migration") or []
    table = ["| Today | With the stack | How to adapt | Items | Shown by |", "| --- | --- | --- | --- | --- |"]
    table += [f"| {cell(row['old'])} | {cell(row['new'])} | {cell(row['adapt'])} |"
              f" {', '.join(map(str, row['items']))} | {'<br>'.join(code(test) for test in row['tests'])} |"
              for row in rows]
    return "\n".join(table)


PREFIXES_FILE = "patch-prefixes.json"  # written by `python -m patch.prefixes --json rfc/results/patch-prefixes.json`
PREFIXES_COMMAND = "python -m patch.prefixes --json rfc/results/patch-prefixes.json"


def prefix_lines(inputs: Inputs) -> list[str]:
    """Whether each commit of the stack works on its own: the smoke run of every prefix (``patch.prefixes``)."""
    path = inputs.results_dir / PREFIXES_FILE
    if not path.is_file():
        return [no_results("smoke runs of the stack's prefixes", PREFIXES_COMMAND)]
    data = load_json(path)
    commits = data["commits"]
    failing = [row for row in commits if not row["passed"]]
    revision = commit_text(data["setup"]) or "an unrecorded commit"
    lines = [
        f"Each commit on its own, applied in order from the first (`{PREFIXES_COMMAND}`, at {revision}): a smoke run"
        " of a regular module and of one taking `dataloader_iter` (each fitted with validation twice per epoch, then"
        f" validated and asked to predict) passes after {len(commits) - len(failing)} of the {len(commits)} commits"
        + (", so the stack is not yet bisectable. The commits that fail:" if failing else "; CI runs it on every"
           " change."),
    ]
    if failing:
        lines += ["", "| Commit | what fails |", "| --- | --- |"]
        lines += [f"| {row['commit']}. {cell(row['subject'])} | {cell(row['last_line'][:160])} |" for row in failing]
    return lines


MASTER_FILE = "patch-prefixes-master.json"
MASTER_COMMAND = ("python -m patch.prefixes --repository LIGHTNING_GIT_DIR --commit COMMIT"
                  " --json rfc/results/patch-prefixes-master.json")


def master_lines(inputs: Inputs) -> list[str]:
    """The stack made on Lightning's master: whether ``git am`` applies it there, and the smoke run of each commit."""
    path = inputs.results_dir / MASTER_FILE
    if not path.is_file():
        return [no_results("the stack on Lightning's master", MASTER_COMMAND)]
    data = load_json(path)
    repository, commits = data["repository"], data["commits"]
    applied, failing = repository["git_am"], [row for row in commits if not row["passed"]]
    dropped = applied["dropped"]
    lines = [
        f"On Lightning's master at `{repository['commit'][:10]}` ({repository['date'][:10]}, "
        f"\"{cell(repository['subject'])}\"), the same items make the stack for the repository (`{MASTER_COMMAND}`,"
        f" at {commit_text(data['setup']) or 'an unrecorded commit'}): its {applied['patches']} patches "
        + ("apply with a plain `git am`" if applied["applied"] else "do **not** apply with `git am`")
        # Lightning's paths, not this repository's: quoted, not in backticks
        + (f" (the repository mirror used here lacks Lightning's {', '.join(f'{p!r}' for p in dropped)}, which the"
           " stack does not touch; dropped from the index first)" if dropped else "")
        + f", and the smoke run passes after {len(commits) - len(failing)} of the {len(commits)} commits"
        + (" on master's code." if not failing else ". The commits that fail:"),
    ]
    if failing:
        lines += ["", "| Commit | what fails |", "| --- | --- |"]
        lines += [f"| {row['commit']}. {cell(row['subject'])} | {cell(row['last_line'][:160])} |" for row in failing]
    if not applied["applied"]:
        lines += ["", f"`git am` says: {cell(applied['error'][-300:])}"]
    return lines


COST_FILE = "patch-cost.json"  # written by `python -m benchmarks.patch_cost`
# Further runs of the same command (`--out rfc/results/patch-cost-<what>.json`): another build of the same series, or
# one series against another (`--stock-python` of a patched build); listed below the judged run, not judged
OTHER_COST_RUNS = "patch-cost-*.json"
OVER_REGULAR = "dataloader_iter-over-regular"  # benchmarks.patch_cost's case beside stock's regular step
WITHOUT_TRANSFER = "dataloader_iter-without-transfer"  # benchmarks.patch_cost's look-ahead without the transfer
COST_COMMAND = ("python -m benchmarks.patch_cost --stock-python STOCK_PY [STOCK_PY ...] --patched-python PATCHED_PY"
                " [PATCHED_PY ...]")
_CASES = {
    "regular": "a regular `training_step(batch, batch_idx)`, patched over stock",
    "dataloader_iter": "`training_step(self, dataloader_iter)`, patched over today's flavour",
    "stock-over-stock": "today's flavour over itself (the method's own spread; a perfect method gives 1)",
    OVER_REGULAR: ("`training_step(self, dataloader_iter)` patched, over stock's regular step (both"
                   " pass each batch through the transfer hooks)"),
    WITHOUT_TRANSFER: ("`training_step(self, dataloader_iter)` patched with its transfer left out, over today's"
                       " flavour (the look-ahead's own work, which neither transfers)"),
}
# the control where the pairs cycled over several builds of stock: each build over another one
_CONTROL_ACROSS_BUILDS = ("today's flavour, one build of stock over another (the builds' and the method's spread; a"
                          " perfect method gives 1)")


def patch_cost_verdicts(inputs: Inputs) -> list[str]:
    """The verdicts of the patch's judged cost cases (``patch-cost.json``), in file order; none without the file."""
    path = inputs.results_dir / COST_FILE
    if not path.is_file():
        return []
    return [row["verdict"] for row in load_json(path)["rows"] if "verdict" in row]


def block_patch_cost(inputs: Inputs, page_dir: Path) -> str:
    """The patch's cost per batch: S3's tiny run under the patched and the stock Lightning in lockstep pairs."""
    path = inputs.results_dir / COST_FILE
    if not path.is_file():
        return no_results("patch cost results", COST_COMMAND)
    data = load_json(path)
    setup = data["setup"]
    builds = setup.get("builds", dict(stock=1, patched=1))
    cases = {**_CASES, **({"stock-over-stock": _CONTROL_ACROSS_BUILDS} if builds["stock"] > 1 else {})}
    counted = all("instructions" in row for row in data["rows"])
    rows = []
    for row in data["rows"]:
        interval = row["interval"]
        shown = f"{row['ratio']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        target = f"≤ {row['threshold']}: **{row['verdict']}**" if "threshold" in row else "–"
        instructions = f" {_instructions_cell(row['instructions'])} |" if counted else ""
        rows.append(f"| {cases.get(row['case'], cell(row['case']))} | {row['pairs']} | {shown} |{instructions}"
                    f" {target} |")
    return "\n".join([
        f"Time per batch of S3's run (tiny model, batch size 1, {setup['batches']} batches, timed from batch "
        f"{setup['skip']}), patched over stock, in lockstep pairs over {builds['stock']} build(s) of stock and "
        f"{builds['patched']} of the patched package (`python -m benchmarks.patch_cost`). A target is met or missed "
        "only when the whole 95 % interval is on one side of it.",
        *(["", "Instructions: Python bytecode instructions per batch in the same window, each side counted alone; "
           "patched over stock. A count has no spread, so no interval (the cell says where builds differ). Shown, "
           "not judged: an instruction's time varies."] if counted else []),
        "",
        f"| Case | pairs | ratio [95 % interval] |{' instructions |' if counted else ''} target |",
        f"| --- | ---: | --- |{' --- |' if counted else ''} --- |",
        *rows,
        "",
        f"*Setup ({COST_FILE}):* machine `{setup['machine']}`; stock pytorch-lightning "
        f"{setup['stock']['pytorch_lightning']}, patched {setup['patched']['pytorch_lightning']} (series "
        f"`{str(setup['patched']['patch_series'])[:19]}`); torch {setup['stock']['torch']}; commit "
        f"`{str(setup.get('git_commit', ''))[:12]}`{' (dirty)' if setup.get('git_dirty') else ''}; run "
        f"{setup.get('generated_at', '')}.",
        *_other_cost_runs(inputs),
    ])


def _instructions_cell(counts: dict) -> str:
    """Instructions per batch of the measured side over the reference's, and their ratio (``benchmarks.patch_cost``'s
    ``instructions``)."""
    means = {side: sum(counts[side]) / len(counts[side]) for side in ("measured", "reference")}
    differ = any(len(set(counts[side])) > 1 for side in means)
    return (f"{counts['ratio']:.3f} ({means['measured']:,.0f}/{means['reference']:,.0f})"
            + (" (the builds differ)" if differ else ""))


def _build(side: dict) -> str:
    series = side.get("patch_series")
    return f"series `{series[:19]}`" if series else f"stock {side['pytorch_lightning']}"


def _other_cost_runs(inputs: Inputs) -> list[str]:
    """The further runs of the cost command (``OTHER_COST_RUNS``), each case with its interval: what separates two
    runs, or two builds, beyond one run's interval."""
    rows = []
    for path in sorted(inputs.results_dir.glob(OTHER_COST_RUNS)):
        setup = load_json(path)["setup"]
        for row in load_json(path)["rows"]:
            if row["case"] == "stock-over-stock":
                continue
            interval = row["interval"]
            shown = f"{row['ratio']:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
            rows.append(f"| `{path.name}` | {_build(setup['patched'])} over {_build(setup['stock'])} | "
                        f"{cell(row['flavour'])} | {row['pairs']} | {shown} | "
                        f"`{str(setup.get('git_commit', ''))[:12]}`, {setup.get('generated_at', '')} |")
    if not rows:
        return []
    return ["", "Further runs of the same command, not judged (a second build of a series in an environment of its "
            "own, or one series over another):", "", "| Run | builds | flavour | pairs | ratio [95 % interval] | "
            "commit, run |", "| --- | --- | --- | ---: | --- | --- |", *rows]
