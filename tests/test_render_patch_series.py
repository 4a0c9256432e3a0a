"""The RFC's patch-series block and the change list's pointers into the patch (``rfc/rendering/patch_series.py``,
``code_pointers``), from a synthetic series summary built here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "rfc"))  # where `python rfc/render.py` finds it

from rendering import code_pointers, patch_series  # noqa: E402
from rendering.results import Inputs  # noqa: E402


def inputs_with(tmp_path: Path, *items: dict) -> Inputs:
    """A summary of ``items`` in one pull request: item 1 and 2 in its first commit, each other in one of its own."""
    results = tmp_path / "results"
    results.mkdir()
    grouped = [[i for i in items if i["number"] <= 2], *([i] for i in items if i["number"] > 2)]
    commits = [dict(subject=f"commit of {[i['number'] for i in group]}", items=[i["number"] for i in group],
                    files=[f for i in group for f in i["files"]], added=sum(i["added"] for i in group),
                    removed=sum(i["removed"] for i in group)) for group in grouped if group]
    summary = dict(schema=2, release="9.9.9", items=list(items),
                   pull_requests=[dict(title="the one | pull request", commits=commits)])
    (results / code_pointers.PATCH_SUMMARY).write_text(json.dumps(summary))
    return Inputs(rfc_dir=tmp_path, results_dir=results, out_dir=tmp_path, command="render")


def item(number: int, code: str | None, files: list[tuple[str, int, int]], part: str = "") -> dict:
    return dict(number=number, title=f"change {number} | piped", code=code, part=part, why=f"why\n  {number}",
                files=[dict(path=p, added=a, removed=r) for p, a, r in files],
                added=sum(a for _, a, _ in files), removed=sum(r for _, _, r in files))


def test_the_block_sums_the_series_and_gives_each_patch_its_code_lines_and_message(tmp_path):
    inputs = inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1), ("loops/b.py", 2, 0)]),
                         item(2, None, [], part="item 1's code makes it"))
    block = patch_series.block_patch_series(inputs, tmp_path)
    assert "pytorch-lightning 9.9.9 is a stack of 1 pull requests of 1 commits in all" in block
    assert ("1 of the 2 items of the RFC's change list edit Lightning's code, adding 5 lines and removing 1 in 2"
            " files") in block
    assert "| 1. the one \\| pull request | commit of [1, 2] | 1, 2 | +5 −1 |" in block
    assert "| 1 | `patch/items/one.py` | +5 −1 |" in block
    assert "| 2 | no edits of its own: item 1's code makes it | +0 −0 |" in block
    assert "- **2. change 2 \\| piped.** why 2" in block


def test_the_block_names_the_command_without_a_summary(tmp_path):
    inputs = Inputs(rfc_dir=tmp_path, results_dir=tmp_path, out_dir=tmp_path, command="render")
    assert patch_series.COMMAND in patch_series.block_patch_series(inputs, tmp_path)


def test_an_item_pointer_ends_with_its_patch_or_says_it_is_not_in_the_series(tmp_path):
    inputs = inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)], part="the first half"),
                         item(2, "patch/items/two.py", [(f"f{n}.py", 1, 0) for n in range(4)]))
    assert code_pointers._in_the_patch(inputs, 1) == (
        "the stack, so far the first half: `patch/items/one.py` (`loops/a.py` +3 −1)")
    assert code_pointers._in_the_patch(inputs, 2).endswith("(+4 −0 lines in 4 files)")
    assert code_pointers._in_the_patch(inputs, 3) == "the stack: not in the series yet"


def test_an_item_without_prototype_code_points_at_its_patch_alone(tmp_path):
    inputs = inputs_with(tmp_path, item(14, "patch/items/fourteen.py", [("callbacks/c.py", 5, 1)]))
    block = code_pointers.block_code_item(14)(inputs, tmp_path)
    assert block == "the stack: `patch/items/fourteen.py` (`callbacks/c.py` +5 −1)"


def _cost(tmp_path: Path, rows: list[dict]) -> Inputs:
    setup = dict(machine="test-machine", batches=200, skip=20, git_commit="feedface" * 5, git_dirty=False,
                 generated_at="2000-01-01T00:00:00+00:00",
                 stock=dict(pytorch_lightning="9.9.9", torch="2.x", patch_series=None),
                 patched=dict(pytorch_lightning="9.9.9", torch="2.x", patch_series="sha256:" + "ab" * 32))
    (tmp_path / patch_series.COST_FILE).write_text(json.dumps(dict(schema=1, setup=setup, rows=rows)))
    return Inputs(rfc_dir=tmp_path, results_dir=tmp_path, out_dir=tmp_path, command="render")


def test_the_cost_block_gives_each_case_its_interval_and_verdict(tmp_path):
    inputs = _cost(tmp_path, [
        dict(case="regular", flavour="regular", pairs=24, ratio=1.004, interval=[0.998, 1.009], threshold=1.01,
             verdict="met"),
        dict(case="dataloader_iter", flavour="dataloader_iter", pairs=24, ratio=1.05, interval=[1.02, 1.07],
             threshold=1.03, verdict="inconclusive"),
        dict(case="stock-over-stock", flavour="dataloader_iter", pairs=24, ratio=1.0, interval=[0.99, 1.01]),
        dict(case=patch_series.WITHOUT_TRANSFER, flavour="dataloader_iter", pairs=24, ratio=1.02,
             interval=[1.01, 1.03]),
    ])
    block = patch_series.block_patch_cost(inputs, tmp_path)
    assert ("patched with its transfer left out, over today's flavour (the look-ahead's own work, which neither"
            " transfers) | 24 | 1.020 [1.010, 1.030] | – |") in block
    assert "| a regular `training_step(batch, batch_idx)`, patched over stock | 24 | 1.004 [0.998, 1.009] | ≤ 1.01: " \
           "**met** |" in block
    assert "| 1.050 [1.020, 1.070] | ≤ 1.03: **inconclusive** |" in block
    assert "(the method's own spread; a perfect method gives 1) | 24 | 1.000 [0.990, 1.010] | – |" in block
    assert "200 batches, timed from batch 20" in block and "series `sha256:abababababab`" in block
    assert "1 build(s) of stock and 1 of the patched package" in block


def test_the_cost_block_shows_the_instruction_counts_where_the_run_made_them(tmp_path):
    counts = dict(reference=[16446.0, 16446.0], measured=[16588.0, 16590.0], ratio=1.0087)
    inputs = _cost(tmp_path, [dict(case="regular", flavour="regular", pairs=24, ratio=1.004, interval=[0.998, 1.009],
                                   threshold=1.01, verdict="met", instructions=counts)])
    block = patch_series.block_patch_cost(inputs, tmp_path)
    assert "| ratio [95 % interval] | instructions | target |" in block
    assert "| 1.004 [0.998, 1.009] | 1.009 (16,589/16,446) (the builds differ) | ≤ 1.01: **met** |" in block


def test_the_cost_blocks_control_says_it_pairs_two_builds_of_stock_where_the_run_had_several(tmp_path):
    inputs = _cost(tmp_path, [dict(case="stock-over-stock", flavour="dataloader_iter", pairs=24, ratio=1.0,
                                   interval=[0.99, 1.01])])
    data = json.loads((tmp_path / patch_series.COST_FILE).read_text())
    data["setup"]["builds"] = dict(stock=2, patched=3)
    (tmp_path / patch_series.COST_FILE).write_text(json.dumps(data))
    block = patch_series.block_patch_cost(inputs, tmp_path)
    assert "2 build(s) of stock and 3 of the patched package" in block
    assert "| today's flavour, one build of stock over another (the builds' and the method's spread" in block


def test_further_cost_runs_are_listed_with_their_builds_and_not_judged(tmp_path):
    inputs = _cost(tmp_path, [dict(case="regular", flavour="regular", pairs=24, ratio=1.0, interval=[0.99, 1.01],
                                   threshold=1.01, verdict="met")])
    setup = json.loads((tmp_path / patch_series.COST_FILE).read_text())["setup"]
    setup["stock"]["patch_series"] = "sha256:" + "cd" * 32
    rows = [dict(case="regular", flavour="regular", pairs=12, ratio=1.017, interval=[1.003, 1.026], threshold=1.01,
                 verdict="inconclusive"),
            dict(case="stock-over-stock", flavour="dataloader_iter", pairs=12, ratio=1.0, interval=[0.99, 1.01])]
    (tmp_path / "patch-cost-trims.json").write_text(json.dumps(dict(schema=1, setup=setup, rows=rows)))
    block = patch_series.block_patch_cost(inputs, tmp_path)
    further = block.split("Further runs")[1]
    assert ("| `patch-cost-trims.json` | series `sha256:abababababab` over series `sha256:cdcdcdcdcdcd` | regular"
            " | 12 | 1.017 [1.003, 1.026] |") in further
    assert "inconclusive" not in further and further.count("| `patch-cost-trims.json`") == 1


def test_the_cost_block_names_the_command_without_results(tmp_path):
    inputs = Inputs(rfc_dir=tmp_path, results_dir=tmp_path, out_dir=tmp_path, command="render")
    assert patch_series.COST_COMMAND in patch_series.block_patch_cost(inputs, tmp_path)


def _prefixes(inputs: Inputs, failing: dict[int, str]) -> str:
    rows = [dict(commit=n, items=[n], subject=f"commit {n}", passed=n not in failing, last_line=failing.get(n, ""))
            for n in (1, 2)]
    prefixes = dict(schema=1, release="9.9.9", setup=dict(git_commit="feedface" * 5, git_dirty=False), commits=rows)
    (inputs.results_dir / patch_series.PREFIXES_FILE).write_text(json.dumps(prefixes))
    return patch_series.block_patch_series(inputs, inputs.out_dir)


def test_the_block_says_how_many_commits_work_on_their_own_and_names_those_that_fail(tmp_path):
    block = _prefixes(inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)])),
                      {1: "AttributeError: no | attribute"})
    assert "at commit `feedfacefeed`" in block
    assert "passes after 1 of the 2 commits, so the stack is not yet bisectable" in block
    assert "| 1. commit 1 | AttributeError: no \\| attribute |" in block


def test_the_block_says_every_commit_works_on_its_own_when_each_does(tmp_path):
    block = _prefixes(inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)])), {})
    assert "passes after 2 of the 2 commits; CI runs it on every change." in block
    assert "| Commit | what fails |" not in block


def test_the_block_names_the_prefix_command_without_its_results(tmp_path):
    block = patch_series.block_patch_series(inputs_with(tmp_path, item(1, None, [])), tmp_path)
    assert patch_series.PREFIXES_COMMAND in block


def _master(inputs: Inputs, applied: bool, failing: dict[int, str]) -> str:
    rows = [dict(commit=n, items=[n], subject=f"commit {n}", passed=n not in failing, last_line=failing.get(n, ""))
            for n in (1, 2)]
    git_am = dict(commit="c0ffee" * 7, applied=applied, patches=2, dropped=["docs/a.gif"],
                  error="" if applied else "Patch failed at 0002 commit 2")
    master = dict(schema=1, release="9.9.9", setup=dict(git_commit="feedface" * 5, git_dirty=False), commits=rows,
                  repository=dict(commit="c0ffee" * 7, date="2026-07-20T13:18:29+01:00", subject="Remove | guards",
                                  git_am=git_am))
    (inputs.results_dir / patch_series.MASTER_FILE).write_text(json.dumps(master))
    return patch_series.block_patch_series(inputs, inputs.out_dir)


def test_the_block_says_whether_the_stack_applies_to_master_and_runs_there(tmp_path):
    block = _master(inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)])), True, {})
    assert "On Lightning's master at `c0ffeec0ff` (2026-07-20, \"Remove \\| guards\")" in block
    assert "apply with a plain `git am` (the repository mirror used here lacks Lightning's 'docs/a.gif'" in block
    assert "passes after 2 of the 2 commits on master's code." in block


def test_the_block_says_where_the_stack_fails_on_master(tmp_path):
    block = _master(inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)])), False,
                    {2: "ImportError: x"})
    assert "do **not** apply with `git am`" in block and "`git am` says: Patch failed at 0002 commit 2" in block
    assert "| 2. commit 2 | ImportError: x |" in block


def test_the_block_counts_the_added_source_by_kind_against_its_budget(tmp_path):
    inputs = inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)]))
    path = inputs.results_dir / code_pointers.PATCH_SUMMARY
    summary = json.loads(path.read_text())
    summary.update(added_source=dict(code=700, docstrings=200, comments=60, blank=90), source_lines_budget=1000)
    path.write_text(json.dumps(summary))
    block = patch_series.block_patch_series(inputs, tmp_path)
    assert ("1050 are in the package's modules (its tests and the CHANGELOG aside): 700 of code, 200 of docstrings,"
            " 60 of comments and 90 blank; 50 lines **over** the budget of 1000") in block
    summary["added_source"]["code"] = 600
    path.write_text(json.dumps(summary))
    assert "; within the budget of 1000" in patch_series.block_patch_series(inputs, tmp_path)


def test_the_migration_block_gives_each_change_its_adaptation_and_tests(tmp_path):
    inputs = inputs_with(tmp_path, item(1, "patch/items/one.py", [("loops/a.py", 3, 1)]))
    path = inputs.results_dir / code_pointers.PATCH_SUMMARY
    summary = json.loads(path.read_text())
    summary["migration"] = [dict(old="counts | calls", new="counts batches", adapt="nothing", items=[1, 5],
                                 tests=["loops/test_a.py::test_one", "loops/test_b.py::test_two"])]
    path.write_text(json.dumps(summary))
    block = patch_series.block_patch_migration(inputs, tmp_path)
    assert ("| counts \\| calls | counts batches | nothing | 1, 5 | `loops/test_a.py::test_one`<br>"
            "`loops/test_b.py::test_two` |") in block


def test_the_first_screen_names_each_cost_case_and_judges_only_the_targets(tmp_path):
    from rendering.first_screen import costs_line

    inputs = _cost(tmp_path, [
        dict(case="dataloader_iter", flavour="dataloader_iter", pairs=24, ratio=1.062, interval=[1.053, 1.076],
             threshold=1.01, verdict="missed"),
        dict(case="stock-over-stock", flavour="dataloader_iter", pairs=24, ratio=1.0, interval=[0.99, 1.01]),
        dict(case=patch_series.OVER_REGULAR, flavour="dataloader_iter", pairs=24, ratio=0.956,
             interval=[0.95, 0.961]),
        dict(case=patch_series.WITHOUT_TRANSFER, flavour="dataloader_iter", pairs=24, ratio=1.024,
             interval=[1.018, 1.03]),
    ])
    line = costs_line(inputs)
    assert "a dataloader_iter module's batch 1.062 [1.053, 1.076] of stock's (target ≤ 1.01: missed)" in line
    assert "that batch 0.956 [0.950, 0.961] of stock's regular batch (shown, not judged" in line
    assert ("the flavour's batch with its transfer left out 1.024 [1.018, 1.030] of today's flavour (shown, not"
            " judged: the look-ahead's own work)") in line
    assert "1.000" not in line  # the method's control is for the cost block, not the first screen


def test_what_makes_the_series_counts_the_lines_of_each_part_of_patch(tmp_path):
    for path, lines in (("items/look_ahead.py", 3), ("items/__init__.py", 1), ("edits.py", 2), ("series.py", 4),
                        ("tests_pytorch/loops/test_x.py", 5), ("lightning_tests.py", 6), ("coverage.py", 1)):
        (tmp_path / "patch" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "patch" / path).write_text("x = 1\n\n" * lines)
    assert patch_series.generator_lines(tmp_path) == dict(items=4, writer=6, tests=5, checks=7)
    line = patch_series.generator_line(tmp_path)
    assert line.startswith("What makes the series: 4 non-blank lines of Python in `patch/items/`")
    assert "and 6 write it into Lightning's classes" in line
    assert "are 5 more, and the tools that run and judge it 7." in line
