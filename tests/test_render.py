"""The RFC render tool (``rfc/render.py``): results drive the tables, ``--check`` catches stale pages, missing
results give a note. Everything runs on a temporary RFC directory; committed files are never touched.

The results written here are synthetic fixtures built by the tests, not measurements.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

RENDER = Path(__file__).resolve().parent.parent / "rfc" / "render.py"

PAGE = """# A hand-written page

Text before the block stays exactly as written.

<!-- BEGIN GENERATED: standing -->
<!-- END GENERATED: standing -->

<!-- BEGIN GENERATED: matrix -->
anything in here is replaced
<!-- END GENERATED: matrix -->

Text after the block stays too.
"""


def _load_render():
    spec = importlib.util.spec_from_file_location("rfc_render", RENDER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


render = _load_render()


# A benchmark results file is named for the machine its setup names (harness_common.machine_file_name)
MACHINE = "x86_64 Linux, 2 CPUs"
BENCHMARKS_FILE = "benchmarks-x86_64-linux-2cpu.json"
PLOT = "efficiency-vs-ratio-x86_64-linux-2cpu.png"


def _setup(**extra):
    return {
        "machine": MACHINE, "python": "3.11", "torch": "2.x", "pytorch_lightning": "2.6.x",
        "torchdata": "0.x", "git_commit": "feedface" * 5, "generated_at": "2000-01-01T00:00:00+00:00", **extra,
    }


def conformance(outcome_of_last: str = "passed") -> dict:
    results = []
    for design, variants in (("alpha", ["alpha"]), ("beta", ["beta[depth=0]", "beta[depth=2]"])):
        for variant in variants:
            for clause in ("C1", "C2", "C3"):
                for n in range(2):
                    results.append(dict(design=design, variant=variant, clause=clause, outcome="passed", reason="",
                                        test_id=f"test_{clause.lower()}.py::test_{n}"))
    results[0].update(outcome="xfailed", reason="alpha counts step calls, not batches")
    results[-1].update(outcome=outcome_of_last, reason="")
    return {
        "schema": 1, "setup": _setup(),
        "clauses": {"C1": "Selection", "C2": "Items", "C3": "Exactly once, in order"},
        "designs": {"alpha": {"summary": "the alpha design"}, "beta": {"summary": "the beta design"}},
        "results": results,
    }


def benchmarks(beta_efficiency: float = 0.9) -> dict:
    s1 = []
    for design, eff in (("alpha", 0.05), ("beta", beta_efficiency)):
        for L in (5.0, 10.0, 20.0):
            serial, ideal = L + 10.0, max(L, 10.0)
            s1.append(dict(design=design, L_ms=L, C_ms=10.0, time_per_batch_ms=serial - eff * (serial - ideal),
                           t_serial_ms=serial, t_ideal_ms=ideal, efficiency=eff))
    return {
        "schema": 1, "setup": _setup(cpu_count=2, torch_threads=1),
        "targets": {"S1": {"what": "beta's efficiency at L = C", "metric": "efficiency", "compare": ">=",
                           "threshold": 0.95, "results": [dict(design="beta", value=beta_efficiency,
                                                               met=beta_efficiency >= 0.95)]}},
        "scenarios": {
            "S1": s1,
            "S2": [dict(design="alpha", speedup=1.2), dict(design="beta", speedup=1.7)],
            "S3": [dict(design="alpha", overhead_vs_regular=1.0, overhead_vs_raw=2.5)],
            "S4": [dict(design="beta[depth=2]", depth=2, efficiency=0.8, peak_rss_mb=123.4, peak_in_flight=3)],
        },
    }


@pytest.fixture
def rfc(tmp_path: Path) -> Path:
    """A temporary RFC directory: one hand-written page with markers, and results."""
    root = tmp_path / "rfc"
    (root / "results").mkdir(parents=True)
    (root / "page.md").write_text(PAGE)
    write_results(root, conformance(), benchmarks())
    return root


def write_results(root: Path, conf: dict | None, bench: dict | None) -> None:
    for name, data in (("conformance.json", conf), (BENCHMARKS_FILE, bench)):
        path = root / "results" / name
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(data))


def run(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``python rfc/render.py --rfc-dir ROOT ARGS``, in-process (the CLI itself runs in the last test)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = render.main(["--rfc-dir", str(root), *args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_render_then_check_passes_and_hand_written_text_is_kept(rfc):
    assert run(rfc).returncode == 0
    page = (rfc / "page.md").read_text()
    assert page.startswith("# A hand-written page\n\nText before the block stays exactly as written.\n\n")
    assert page.endswith("\n\nText after the block stays too.\n")
    assert "anything in here is replaced" not in page
    assert f"machine `{MACHINE}`" in page and "commit `feedfacefeed`" in page  # the setup line
    assert (rfc / "generated" / "matrix.md").is_file()
    assert (rfc / "generated" / "benchmarks.md").is_file()
    assert (rfc / "generated" / PLOT).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    check = run(rfc, "--check")
    assert check.returncode == 0, check.stderr
    again = run(rfc)
    assert again.returncode == 0 and "up to date" in again.stdout  # idempotent: nothing rewritten


def test_matrix_marks_each_clause_and_links_every_expected_failure_to_its_reason(rfc):
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert ('| `alpha` | [✗1](matrix.md#xf-alpha-c1 "1 of 2 are expected failures: their reasons") | ✓ | ✓ | '
            '[✗1](matrix.md#xf-alpha "1 of 6 are expected failures: their reasons") of 6 |') in matrix
    # beta's two variants have the same outcomes: one row names both
    assert "| `beta`<br><small>depth=0, depth=2</small> | ✓ | ✓ | ✓ | ✓ 6 |" in matrix
    assert "### `alpha`: 1 expected failure, 1 reason {#xf-alpha}" in matrix
    assert "#### C1 Selection (1 test) {#xf-alpha-c1}" in matrix
    assert "- alpha counts step calls, not batches<br><small>`test_c1.py::test_0`</small>" in matrix
    assert "No failures, errors, unexpected passes or skips." in matrix
    anchors = set(re.findall(r"\{#([\w-]+)\}", matrix))
    assert set(re.findall(r"\(matrix\.md#([\w-]+) ", matrix)) <= anchors  # every cell's link lands on its reasons


def test_pages_list_designs_and_variants_in_the_registrys_order_not_the_files(rfc):
    # the results file lists designs and variants by name, as the conformance run writes them
    variants = {"batch_processor": ["batch_processor"], "callback": ["callback"],
                "prefetcher": ["prefetcher[depth='auto']", "prefetcher[depth=0]", "prefetcher[depth=2]"],
                "upstream": ["upstream"]}
    results = [dict(design=design, variant=variant, clause="C1", outcome="passed", reason="",
                    test_id="test_c1.py::test_0") for design, mine in variants.items() for variant in mine]
    conf = {**conformance(), "designs": {design: {"summary": design} for design in variants}, "results": results}
    write_results(rfc, conf, benchmarks())
    assert run(rfc).returncode == 0
    matrix = (rfc / "generated" / "matrix.md").read_text()
    rows = [line.split(" | ")[0] for line in matrix.splitlines() if line.startswith("| `")]
    # upstream, prefetcher (what it ships, then its suite variants), batch_processor, callback: as the terminal
    assert rows == ["| `upstream`", "| `prefetcher`<br><small>depth=0, depth='auto', depth=2</small>",
                    "| `batch_processor`", "| `callback`"]


def test_red_marks_real_failures_only(rfc):
    assert run(rfc).returncode == 0
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert "[✗1](matrix.md#xf-alpha-c1 " in matrix and "matrix-failure" not in matrix  # an expected failure: plain
    write_results(rfc, conformance(outcome_of_last="failed"), benchmarks())
    assert run(rfc).returncode == 0
    assert "{ .matrix-failure }" in (rfc / "generated" / "matrix.md").read_text()
    css = (Path(__file__).resolve().parent.parent / "docs" / "css" / "extra.css").read_text()
    assert "td a.matrix-failure { color: var(--matrix-fail-color); }" in css
    assert "td a { color" not in css  # no other link in the matrix is red


def test_matrix_headers_link_to_the_specifications_clauses(rfc):
    (rfc / "specification.md").write_text("# Spec\n\n## C1 Selection\n\n## C3 Exactly once, in order\n")
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert '| Design | [C1](../specification.md#c1-selection "Selection") | <abbr title="Items">C2</abbr> | ' in matrix
    assert '[C3](../specification.md#c3-exactly-once-in-order "Exactly once, in order")' in matrix


def test_expected_failures_sharing_a_reason_are_one_item_per_clause(rfc):
    conf = conformance()
    reason = "beta drops the last batch"
    for result in conf["results"]:
        if result["design"] == "beta" and result["clause"] in ("C2", "C3"):
            result.update(outcome="xfailed", reason=reason)
        if result["variant"] == "beta[depth=2]" and result["clause"] == "C1" and result["test_id"].endswith("0"):
            result.update(outcome="xfailed", reason="only the deeper variant")
    write_results(rfc, conf, benchmarks())
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert "### `beta`: 5 expected failures, 2 reasons {#xf-beta}" in matrix
    # each clause's cell links to its own list; a reason that spans clauses is given under each, with its tests there
    assert matrix.count(reason) == 2
    assert f"- {reason}<br><small>`test_c2.py::test_0` · `test_c2.py::test_1`</small>" in matrix
    assert f"- {reason}<br><small>`test_c3.py::test_0` · `test_c3.py::test_1`</small>" in matrix
    assert "- only the deeper variant<br><small>`test_c1.py::test_0` (in `beta[depth=2]`)</small>" in matrix


def test_another_environments_conformance_run_joins_the_matrix_with_its_own_setup(rfc):
    gamma = conformance()
    gamma["setup"] = _setup(pytorch_lightning="2.6.x patched")
    gamma["results"] = [dict(r, design="gamma", variant="gamma") for r in gamma["results"] if r["design"] == "alpha"]
    gamma["designs"] = {"gamma": {"summary": "the gamma design"}}
    (rfc / "results" / "conformance-gammas.json").write_text(json.dumps(gamma))
    assert run(rfc).returncode == 0
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert "| `gamma` |" in matrix and "| `alpha` |" in matrix
    assert "*Setup (conformance.json):*" in matrix and "pytorch-lightning 2.6.x patched" in matrix
    assert "*Setup (conformance-gammas.json):*" in matrix
    # a design in two results files would count twice: refused, naming the file
    gamma["results"][0]["design"] = "alpha"
    (rfc / "results" / "conformance-gammas.json").write_text(json.dumps(gamma))
    result = run(rfc)
    assert result.returncode == 2 and "conformance-gammas.json: designs ['alpha']" in result.stderr


def test_a_page_shows_each_setup_line_once(rfc):
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    page = (rfc / "page.md").read_text()
    for text in (matrix, page):  # several blocks render from conformance.json; its setup line opens the first
        assert text.count("*Setup (conformance.json):*") == 1
    assert matrix.index("*Setup (conformance.json):*") < matrix.index("| Design |")


def test_a_changed_result_changes_the_tables_and_check_fails_until_rerendered(rfc):
    assert run(rfc).returncode == 0
    before_matrix = (rfc / "generated" / "matrix.md").read_text()
    before_bench = (rfc / "generated" / "benchmarks.md").read_text()
    before_page = (rfc / "page.md").read_text()
    png = rfc / "generated" / PLOT
    png_before = png.read_bytes()

    write_results(rfc, conformance(outcome_of_last="failed"), benchmarks(beta_efficiency=0.5))
    check = run(rfc, "--check")
    assert check.returncode == 1
    assert "generated/matrix.md" in check.stderr and "page.md" in check.stderr
    assert "generated/benchmarks.md" in check.stderr
    assert "python " in check.stderr and "render.py --rfc-dir" in check.stderr  # says how to fix it

    assert run(rfc).returncode == 0
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert matrix != before_matrix
    # a failure's count is the one mark in red (the CSS class), as F<n> is in the terminal
    failed = '**[!1](matrix.md#failures-beta "1 of {} failed, errored or passed unexpectedly"){{ .matrix-failure }}**'
    assert "| `beta[depth=0]` | ✓ | ✓ | ✓ | ✓ 6 |" in matrix
    assert f"| `beta[depth=2]` | ✓ | ✓ | {failed.format(2)} | {failed.format(6)} of 6 |" in matrix
    assert "### `beta`: 1 {#failures-beta}" in matrix
    assert "- **C3** `test_c3.py::test_1` (in `beta[depth=2]`): failed" in matrix
    bench = (rfc / "generated" / "benchmarks.md").read_text()
    assert bench != before_bench and "| `beta` | 1.00 | 15.0 | 0.50 | S1 **missed** |" in bench
    assert (rfc / "page.md").read_text() != before_page
    assert png.read_bytes() != png_before  # plot data changed: redrawn
    assert run(rfc, "--check").returncode == 0


def test_check_catches_a_hand_edited_table_and_a_missing_plot(rfc):
    run(rfc)
    page = rfc / "page.md"
    page.write_text(page.read_text().replace("[✗1]", "[✗2]"))
    check = run(rfc, "--check")
    assert check.returncode == 1 and "page.md: differs" in check.stderr
    run(rfc)
    (rfc / "generated" / PLOT).unlink()
    check = run(rfc, "--check")
    assert check.returncode == 1 and f"{PLOT}: missing" in check.stderr
    run(rfc)
    assert run(rfc, "--check").returncode == 0


def test_unchanged_plot_data_never_redraws_the_png(rfc):
    run(rfc)
    png = rfc / "generated" / PLOT
    png.write_bytes(b"\x89PNG\r\n\x1a\n not what this matplotlib draws")  # bytes from another version: fine
    stamp = png.stat().st_mtime_ns
    bench = benchmarks()
    bench["scenarios"]["S3"][0]["overhead_vs_raw"] = 9.0  # not plotted
    write_results(rfc, conformance(), bench)
    assert run(rfc).returncode == 0
    assert png.stat().st_mtime_ns == stamp
    assert run(rfc, "--check").returncode == 0


def test_missing_results_render_a_note_instead_of_crashing(rfc):
    write_results(rfc, None, None)
    result = run(rfc)
    assert result.returncode == 0, result.stderr
    matrix = (rfc / "generated" / "matrix.md").read_text()
    command = "`pytest tests/conformance --results rfc/results/conformance.json`"
    assert f"No conformance results yet:** run {command}" in matrix
    bench = (rfc / "generated" / "benchmarks.md").read_text()
    assert "No benchmark results yet:** run `" in bench
    assert "No conformance results yet" in (rfc / "page.md").read_text()
    assert not list((rfc / "generated").glob("*.png"))
    assert run(rfc, "--check").returncode == 0
    (rfc / "results").rmdir()  # not even the directory
    assert run(rfc, "--check").returncode == 0


def test_a_results_file_that_goes_away_leaves_a_stale_plot_that_check_reports(rfc):
    run(rfc)
    write_results(rfc, conformance(), None)
    check = run(rfc, "--check")
    assert check.returncode == 1 and f"{PLOT}: no results file renders it" in check.stderr
    run(rfc)
    assert not (rfc / "generated" / PLOT).exists()


def test_bad_input_is_an_error_not_a_traceback(rfc):
    (rfc / "results" / "conformance.json").write_text("{not json")
    result = run(rfc)
    assert result.returncode == 2 and "not valid JSON" in result.stderr and "Traceback" not in result.stderr
    write_results(rfc, conformance(), benchmarks())
    (rfc / "page.md").write_text("<!-- BEGIN GENERATED: nonsense -->\n<!-- END GENERATED: nonsense -->\n")
    result = run(rfc)
    assert result.returncode == 2 and "unknown generated block 'nonsense'" in result.stderr
    (rfc / "page.md").write_text("<!-- BEGIN GENERATED: matrix -->\nno end marker\n")
    result = run(rfc)
    assert result.returncode == 2 and "unbalanced" in result.stderr


def test_columns_follow_the_rows_keys(rfc):
    bench = benchmarks()
    bench["scenarios"]["S3"][0]["new_metric_ms"] = 1.5
    bench["scenarios"]["S3"][0]["samples"] = [1, 2, 3]  # not a scalar: left out
    write_results(rfc, conformance(), bench)
    run(rfc)
    text = (rfc / "generated" / "benchmarks.md").read_text()
    assert "`new_metric_ms`" in text and "samples" not in text


def test_the_command_line(rfc):
    """``python rfc/render.py --rfc-dir DIR [--check]`` as CI runs it (the committed pages: ``.ci/run``)."""
    cli = [sys.executable, str(RENDER), "--rfc-dir", str(rfc)]
    stale = subprocess.run([*cli, "--check"], capture_output=True, text=True, timeout=120)
    assert stale.returncode == 1 and "fix: run `python " in stale.stderr
    assert subprocess.run(cli, capture_output=True, text=True, timeout=120).returncode == 0
    fresh = subprocess.run([*cli, "--check"], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0 and "up to date" in fresh.stdout


def test_a_miss_never_reads_like_the_threshold(rfc):
    write_results(rfc, conformance(), benchmarks(beta_efficiency=0.9489))
    run(rfc)
    text = (rfc / "generated" / "benchmarks.md").read_text()
    assert "| `beta` | – | 0.9489 | – | – | **missed** |" in text


def test_clause_tests_block_lists_each_clauses_test_functions_once(rfc):
    (rfc / "spec.md").write_text("<!-- BEGIN GENERATED: clause-tests -->\n<!-- END GENERATED: clause-tests -->\n")
    assert run(rfc).returncode == 0
    spec = (rfc / "spec.md").read_text()
    # every variant runs the same tests: each function is listed once per clause, with its case count
    assert "| C2 | Items | `test_c2.py::test_0` (1)<br>`test_c2.py::test_1` (1) |" in spec
    assert spec.count("test_c3.py::test_0") == 1


def test_results_of_the_wrong_shape_are_rejected_once_at_load(rfc):
    bench = benchmarks()
    bench["scenarios"]["S2"] = [1.2, 1.7]  # rows must be objects
    write_results(rfc, conformance(), bench)
    result = run(rfc)
    assert result.returncode == 2 and "scenario 'S2' must be a list of row objects" in result.stderr
    conf = conformance()
    del conf["results"][0]["test_id"]
    write_results(rfc, conf, benchmarks())
    result = run(rfc)
    assert result.returncode == 2 and "results[0] must be an object with string 'design' and 'test_id'" in result.stderr


def test_benchmark_tables_lead_with_the_decision_and_flag_a_missed_calibration(rfc):
    bench = benchmarks()
    bench["scenarios"]["S1"] = [
        dict(design="alt:workers", role="alternative", point="L=C", L_over_C=1.0, L_over_C_measured=0.8,
             time_per_batch_ms=12.0, efficiency=0.8),
        dict(design="beta", role="design", default=True, point="L=C", L_over_C=1.0, L_over_C_measured=0.8,
             time_per_batch_ms=10.5, efficiency=0.96, vs_best_alternative=0.875, C_raw_ms=9.0),
        dict(design="baseline:regular", role="baseline", point="L=C", time_per_batch_ms=20.0),
    ]
    bench["scenarios"]["S1"][1]["efficiency_interval"] = [0.94, 0.97]
    reason = "measured L/C 0.80 is off the nominal 1.00 by more than 10%"
    bench["targets"] = {"S1": {"what": "efficiency at L = C", "metric": "efficiency", "compare": ">=",
                               "threshold": 0.95, "results": [dict(design="beta", value=0.96, interval=[0.94, 0.97],
                                                                   verdict="not judged", reason=reason, met=False,
                                                                   point="L=C", L_over_C=1.0, L_over_C_measured=0.8)]}}
    write_results(rfc, conformance(), bench)
    assert run(rfc).returncode == 0
    text = (rfc / "generated" / "benchmarks.md").read_text()
    # figures carry their 95 % interval; the row names its verdict
    assert "| `beta` | L=C | 0.80 | 10.5 | 0.96 [0.94, 0.97] | 0.875 | S1 not judged |" in text
    assert "| `alt:workers` *(alternative)* | L=C | 0.80 | 12.0 | 0.80 | – | – |" in text
    # the point missed its nominal ratio by more than 10 %: not judged, and the targets table says why
    assert ("| S1 | `efficiency` ≥ 0.95 | `beta` | L=C | 0.96 | [0.94, 0.97] | L/C 0.80 (**off** the nominal 1.00 by"
            f" more than 10 %) | not judged ({reason}) |") in text
    details = text.split("<details><summary>Measured L, C")[1].split("</details>")[0]
    assert "`baseline:regular` *(baseline)*" in details and "9.00" in details  # baselines and raw-loop figures
    assert text.count(f"*Setup ({BENCHMARKS_FILE}):*") == 1  # one setup line for the page


def test_the_thread_decision_is_read_off_the_verdicts(rfc):
    """Decision 2 favours a thread only when every S1 and S6 point shows it faster than the fastest alternative (the
    whole interval below 1); one point that is not distinguishable leaves the thread out, named."""
    (rfc / "decision.md").write_text("<!-- BEGIN GENERATED: decision -->\n<!-- END GENERATED: decision -->\n")

    def rendered(verdicts: list[str]) -> str:
        bench = benchmarks()
        intervals = {"met": [0.8, 0.95], "inconclusive": [0.95, 1.05], "missed": [1.02, 1.2]}
        bench["targets"] = {name: {"metric": "vs_best_alternative", "compare": "<=", "threshold": 1.0, "results": [
            dict(design="beta", point=point, value=sum(intervals[v]) / 2, interval=intervals[v], verdict=v,
                 met=v == "met")
            for point, v in zip(("L=C", "L=2C"), verdicts, strict=True)]}
            for name in ("S1-alternatives", "S6-alternatives")}
        write_results(rfc, conformance(), bench)
        assert run(rfc).returncode == 0
        return (rfc / "decision.md").read_text()

    favoured = "**Decision 2: the measurements favour a prefetch thread, which the stack lacks.**"
    assert favoured in rendered(["met", "met"])
    text = rendered(["met", "inconclusive"])
    assert "**Decision 2: no prefetch thread.**" in text and "faster than the fastest alternative at 2 of 4" in text
    assert "faster at S1 L=C: 0.875 [0.800, 0.950]" in text
    assert "not distinguishable at S1 L=2C: 1.00 [0.950, 1.05]" in text


def test_real_pipelines_table_shows_batches_per_epoch_and_merges_alike_variants(rfc):
    data = conformance()
    test = "test_c19_real_pipelines.py::test_train_pipeline_trains_every_batch_once_per_epoch"
    trained = {"alpha": [7, 7], "beta[depth=0]": [8, 8], "beta[depth=2]": [8, 8]}
    for variant, per_epoch in trained.items():
        data["results"].append(dict(
            design=variant.split("[")[0], variant=variant, clause="C19", test_id=f"{test}[TrainPipelineBase-sized-w0]",
            outcome="passed" if per_epoch == [8, 8] else "xfailed", reason="",
            measured={"batches_trained_per_epoch": per_epoch, "plain_loop_batches_per_epoch": [8, 8]},
        ))
    write_results(rfc, data, benchmarks())
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert "| Pipeline | Loader | `alpha` | `beta` |" in matrix  # beta's variants agree: one column
    assert "| `TrainPipelineBase` | `sized-w0` | 7 · 7 of 8 · 8 ✗ | 8 · 8 ✓ |" in matrix


def test_real_pipelines_table_shows_each_ranks_counts_on_two_ranks(rfc):
    data = conformance()
    test = "test_c19_torchrec_two_ranks.py::test_each_rank_trains_its_batches_once_per_epoch"
    runs = {"alpha": ([[6, 6], [6, 6]], [[8, 8], [8, 8]], "xfailed"), "beta": ([[8], []], [[], []], "xfailed"),
            "gamma": ([[8, 8], [8, 8]], [[8, 8], [8, 8]], "passed")}
    for design, (trained, plain_loop, outcome) in runs.items():
        data["results"].append(dict(
            design=design, variant=design, clause="C19", test_id=f"{test}[sized]", outcome=outcome, reason="",
            measured={"batches_trained_per_epoch": trained, "plain_loop_batches_per_epoch": plain_loop},
        ))
    write_results(rfc, data, benchmarks())
    run(rfc)
    matrix = (rfc / "generated" / "matrix.md").read_text()
    assert ("| `TrainPipelineSparseDist` | `2 ranks, sized` | 6 · 6 / 6 · 6 of 8 · 8 / 8 · 8 ✗ | 8 / none ✗ |"
            " 8 · 8 / 8 · 8 ✓ |") in matrix


# ------------------------------------------------------------------ the list's code pointers, read from [RFC n] tags
LIST_PAGE = """# RFC

**What Lightning has to change** (a lead paragraph
that runs over two lines).

1. Count batches. *Code:* <!-- BEGIN GENERATED: code-item-1 --><!-- END GENERATED: code-item-1 -->.
2. Look ahead, a sentence that
   goes on. *Code:* <!-- BEGIN GENERATED: code-item-2 --><!-- END GENERATED: code-item-2 -->.
3. Document the flavour. *No prototype code:* it is Lightning's documentation.

The paragraph after the list.
"""

CODE = '''"""A design's module."""


# [RFC 1] a comment line above a class tags it
class Counter:
    def count(self):
        """Counts a batch ([RFC 1]): a docstring tags its own method."""

    # [RFC 2]
    @property
    def ahead(self):
        return None
'''


@pytest.fixture
def listed(rfc: Path) -> Path:
    """The temporary RFC with the list in its ``index.md``, and a ``prototypes`` package next to it with tags."""
    (rfc / "index.md").write_text(LIST_PAGE)
    code = rfc.parent / "prototypes"
    (code / "design").mkdir(parents=True)
    (code / "design" / "__init__.py").write_text("")
    (code / "design" / "loops.py").write_text(CODE)
    return rfc


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_each_items_code_is_rendered_from_its_tags(listed):
    assert run(listed).returncode == 0
    text = (listed / "index.md").read_text()
    assert ("*Code:* <!-- BEGIN GENERATED: code-item-1 -->in the prototypes, 2 definitions tagged `[RFC 1]` in "
            "`design`<!-- END GENERATED: code-item-1 -->.") in text
    assert "<!-- BEGIN GENERATED: code-item-2 -->in the prototypes, 1 definitions tagged `[RFC 2]`" in text
    assert run(listed, "--check").returncode == 0
    # a tag dropped from the code makes the committed page stale
    _edit(listed.parent / "prototypes" / "design" / "loops.py", " ([RFC 1])", "")
    assert run(listed, "--check").returncode == 1


def test_an_item_without_a_tag_fails_naming_the_item(listed):
    _edit(listed.parent / "prototypes" / "design" / "loops.py", "    # [RFC 2]\n", "")
    for args in ((), ("--check",)):
        result = run(listed, *args)
        assert result.returncode == 2
        assert "index.md: item 2 has no [RFC 2] tag in the code" in result.stderr and "Traceback" not in result.stderr


def test_a_tag_without_an_item_fails_naming_the_tag(listed):
    _edit(listed.parent / "prototypes" / "design" / "loops.py", "# [RFC 2]", "# [RFC 7]")
    result = run(listed, "--check")
    assert result.returncode == 2
    assert "prototypes/design/loops.py:9: [RFC 7] on `design.loops.Counter.ahead` names no item" in result.stderr


def test_a_tag_that_sits_on_no_definition_fails(listed):
    _edit(listed.parent / "prototypes" / "design" / "loops.py", "        return None", "        return None  # [RFC 1]")
    result = run(listed, "--check")
    assert result.returncode == 2 and "loops.py:12: [RFC 1] is not a tag" in result.stderr


def test_no_prototype_code_stands_for_a_tag_but_not_beside_one(listed):
    assert run(listed).returncode == 0  # item 3 has no tag and says why
    _edit(listed.parent / "prototypes" / "design" / "loops.py", "    # [RFC 2]\n", "    # [RFC 2]\n    # [RFC 3]\n")
    result = run(listed)
    assert result.returncode == 2 and "item 3 says '*No prototype code:*', but" in result.stderr


def test_an_item_with_tags_must_show_its_code(listed):
    _edit(listed / "index.md", " *Code:* <!-- BEGIN GENERATED: code-item-1 --><!-- END GENERATED: code-item-1 -->", "")
    result = run(listed)
    assert result.returncode == 2 and "item 1 does not show its code" in result.stderr


def test_an_items_block_sits_in_that_item(listed):
    _edit(listed / "index.md", "GENERATED: code-item-2 --><!-- END GENERATED: code-item-2",
          "GENERATED: code-item-1 --><!-- END GENERATED: code-item-1")
    result = run(listed)
    assert result.returncode == 2 and "item 2 holds block code-item-1, which belongs in item 1" in result.stderr
    (listed / "page.md").write_text("<!-- BEGIN GENERATED: code-item-1 --><!-- END GENERATED: code-item-1 -->\n")
    result = run(listed)
    assert result.returncode == 2 and "page.md: a code-item block outside the list's items" in result.stderr


def test_a_design_page_quotes_each_item_it_names(listed):
    designs = listed / "designs"
    designs.mkdir(exist_ok=True)
    page = designs / "a_design.md"
    page.write_text("# A design\n\nIt looks ahead as the RFC asks (item 2), and counts batches.\n")
    result = run(listed, "--check")
    assert result.returncode == 2 and "a_design.md: names item 2 without quoting it" in result.stderr
    _edit(page, "(item 2)", "(<!-- BEGIN GENERATED: quote-item-2 --><!-- END GENERATED: quote-item-2 -->)")
    assert run(listed).returncode == 0
    assert ("(<!-- BEGIN GENERATED: quote-item-2 -->item 2: *Look ahead, a sentence that goes on.*"
            "<!-- END GENERATED: quote-item-2 -->)") in page.read_text()
    # the item changes: the quote is stale until re-rendered, and a quote of no item fails
    _edit(listed / "index.md", "2. Look ahead, a sentence that", "2. Look two ahead, a sentence that")
    assert run(listed, "--check").returncode == 1
    _edit(page, "quote-item-2 -->)", "quote-item-2 -->) <!-- BEGIN GENERATED: quote-item-9 --><!-- END GENERATED: "
                                     "quote-item-9 -->")
    result = run(listed)
    assert result.returncode == 2 and "a block quote-item-9 quotes no item" in result.stderr


def test_the_rendered_thread_decision_and_what_ships_agree():
    """Decision 2 rendered from the committed benchmarks and what ships must agree: the recommended design loads
    no batch on a thread of its own, so the committed verdicts must not favour a thread. A measurement that flips
    the decision fails here until a thread ships."""
    from rendering.decision import thread_decision
    from rendering.results import load_inputs

    from prototypes import DESIGNS, RECOMMENDED

    rfc_dir = RENDER.parent
    inputs = load_inputs(rfc_dir, rfc_dir / "results", rfc_dir / "generated", "python rfc/render.py")
    thread_favoured, why = thread_decision(inputs.benchmarks)
    assert why, "no committed results judge the thread (targets S1-alternatives, S6-alternatives)"
    assert not DESIGNS[RECOMMENDED].thread_options and not thread_favoured, (
        "Decision 2's verdicts favour a prefetch thread, which the recommended design does not ship")


def test_the_decisions_name_what_ships_and_the_standing_table_only_registered_designs(rfc):
    """The first screen names the stack's size against its budget, or the command that writes it; the standing
    table has one line per registered design, none for a results-only entry."""
    from prototypes import DESIGNS

    (rfc / "first.md").write_text("<!-- BEGIN GENERATED: decisions -->\n<!-- END GENERATED: decisions -->\n\n"
                                  "<!-- BEGIN GENERATED: standing -->\n<!-- END GENERATED: standing -->\n")
    bench = benchmarks()
    bench["scenarios"]["S7"] = [{"design": "every_rank_has_a_batch", "vote_us": 1000.0}]
    write_results(rfc, conformance(), bench)
    assert run(rfc).returncode == 0
    text = (rfc / "first.md").read_text()
    assert "**What ships:** no results yet" in text or "**What ships:** the patch series summary" in text.lower() \
        or "python -m patch.series" in text.split("**What it costs**")[0]
    assert "**Never run:**" in text and "NCCL" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(DESIGNS)
    assert "every_rank_has_a_batch" not in text and "alpha" not in text.split("| Design")[1]
    # the evidence commit: one where every record ran at one, each of them where they differ
    assert "every record in `rfc/results/` ran at commit `feedfacefeed`" in text
    bench["setup"]["git_commit"] = "beadcafe" * 5
    write_results(rfc, conformance(), bench)
    assert run(rfc).returncode == 0
    assert "ran at 2 commits (`beadcafebead`, `feedfacefeed`)" in (rfc / "first.md").read_text()
    # a record that ran later with the same sources speaks for the same code; the first screen says so
    conf = conformance()
    for data in (conf, bench):
        data["setup"]["sources"] = {"designs": "d1", "suite": "s1"}
    write_results(rfc, conf, bench)
    assert run(rfc).returncode == 0
    assert ("every record in `rfc/results/` measured the code of commit `beadcafebead`. `conformance.json` ran at "
            "`feedfacefeed`, where every measured source was the same.") in (rfc / "first.md").read_text()
    bench["setup"]["sources"] = {"designs": "d2", "suite": "s1"}
    write_results(rfc, conf, bench)
    assert run(rfc).returncode == 0
    assert "ran at 2 commits (`beadcafebead`, `feedfacefeed`)" in (rfc / "first.md").read_text()


def test_design_page_blocks_restate_the_registry_the_docstring_and_the_results(rfc):
    """What a design page says about the code and the results is rendered: its user code is its module docstring's
    example, the suite's variants its registry entry's, its clauses and expected failures the results'."""
    import prototypes.batch_processor
    from prototypes import DESIGNS

    names = ["user-code-batch_processor", "suite-variants-prefetcher", "conformance-batch_processor",
             "end-rule-runs"]
    (rfc / "design.md").write_text("".join(f"<!-- BEGIN GENERATED: {n} -->\n<!-- END GENERATED: {n} -->\n\n"
                                           for n in names))
    data = conformance()
    for n, (clause, outcome) in enumerate([("C14", "xfailed"), ("C14", "xfailed"), ("C19", "passed")]):
        for variant, design in (("batch_processor", "batch_processor"), ("prefetcher[depth=2]", "prefetcher")):
            data["results"].append(dict(design=design, variant=variant, clause=clause, outcome=outcome,
                                        reason="one iterator per call", test_id=f"test_{n}.py::test"))
    write_results(rfc, data, benchmarks())
    assert run(rfc).returncode == 0
    text = (rfc / "design.md").read_text()
    example = prototypes.batch_processor.__doc__.split("User code::\n\n")[1].split("\n\n    trainer")[0]
    assert example.replace("\n    ", "\n").strip() in text
    prefetcher = DESIGNS["prefetcher"]
    assert f"The conformance suite runs `{prefetcher.id}` (the registered default)" in text
    assert all(f"`{prefetcher.variant(**options).id}`" in text for options in prefetcher.suite_variants)
    assert "`batch_processor` meets 1 of 2 clauses in every variant (not C14)" in text and "C14 ×2" in text
    assert "passes 0 of 2 (and records 2 expected failures) tests of C5, C14, C17" in text
    assert "and 1 of 1 C19 runs" in text


def lightning_tests_results() -> dict:
    runs = {name: {"python": f"/venv-{name}/bin/python", "wall_s": 1800.0,
                   "versions": {"python": "3.11", "torch": "2.x", "pytorch_lightning": "2.6.6"},
                   "counts": {"collected": 12, "ran": 10, "passed": passed, "failed": 10 - passed, "error": 0,
                              "skipped": 2, "xfailed": 0}} for name, passed in (("stock", 9), ("patched", 6))}
    differences = [
        {"test": "tests.tests_pytorch.loops.test_progress::test_counts[2]", "stock": "passed", "patched": "failed",
         "classification": "deliberate", "clause": "C6", "why": "asserts one batch per step call"},
        {"test": "tests.tests_pytorch.tuner.test_lr_finder::test_finder", "stock": "passed", "patched": "error",
         "classification": "regression", "item": 12, "why": "the finder's | step"},
        {"test": "tests.tests_pytorch.trainer.test_new::test_x", "stock": "passed", "patched": "failed",
         "classification": "unclassified"},
    ]
    return {"schema": 1, "checkout": {"path": "/lightning", "commit": "be98784a1a03581b7051"},
            "selection": ["loops", "tuner"], "runs": runs, "tests_run": 10, "passed_on_both": 6,
            "differences": differences, "classifications_without_a_difference": ["tests_pytorch.gone::test_old"]}


def test_lightning_tests_block_shows_both_runs_and_every_difference_with_its_classification(rfc):
    (rfc / "page.md").write_text("<!-- BEGIN GENERATED: lightning-tests -->\n<!-- END GENERATED: lightning-tests -->\n")
    assert run(rfc).returncode == 0
    assert "No results of Lightning's own tests yet:** run `python -m patch.lightning_tests" in (
        rfc / "page.md").read_text()
    (rfc / "results" / "lightning-tests.json").write_text(json.dumps(lightning_tests_results()))
    assert run(rfc, "--check").returncode == 1
    assert run(rfc).returncode == 0
    text = (rfc / "page.md").read_text()
    assert ("commit `be98784a1a03`, directories `loops`, `tuner`) ran 10 tests on stock pytorch-lightning; "
            "**6 passed on both** builds and **3 differ**: 1 deliberate") in text
    assert "1 regressions, 0 not repeated when run again on both builds, 1 not yet classified." in text
    assert "| passed | 9 | 6 |" in text and "| wall time (min) | 30 | 30 |" in text
    assert ("- `loops.test_progress::test_counts`: passed on stock, failed patched; deliberate (C6): asserts one"
            " batch") in text
    assert "error patched; **regression** (item 12): the finder's \\| step" in text
    assert "- `trainer.test_new::test_x`: passed on stock, failed patched; **unclassified**:" in text
    assert "**Stale classifications:** `tests_pytorch.gone::test_old`" in text
    assert "Note on this record" not in text
    assert run(rfc, "--check").returncode == 0
    # what a record says of how it was made is shown with it
    (rfc / "results" / "lightning-tests.json").write_text(json.dumps({**lightning_tests_results(),
                                                                     "note": "rebuilt from the run's junit files"}))
    assert run(rfc).returncode == 0
    assert "*Note on this record:* rebuilt from the run's junit files." in (rfc / "page.md").read_text()


def test_the_stack_tests_block_counts_those_that_show_their_change_and_lists_the_others(rfc):
    marker = "<!-- BEGIN GENERATED: lightning-stack-tests -->\n<!-- END GENERATED: lightning-stack-tests -->\n"
    (rfc / "page.md").write_text(marker)
    assert run(rfc).returncode == 0
    assert "No results of the tests the stack adds yet" in (rfc / "page.md").read_text()
    module = "tests.tests_pytorch.loops.test_dataloader_iter_fetcher"
    results = lightning_tests_results()
    updated = "tests.tests_pytorch.loops.test_fetchers::test_opt"
    results["stack_tests"] = [
        {"test": f"{module}::test_counts", "stock": "failed", "patched": "passed", "shows_the_change": True},
        {"test": f"{module}::test_done", "stock": "passed", "patched": "passed", "shows_the_change": False},
        {"test": f"{updated}[False]", "stock": "failed", "patched": "passed", "shows_the_change": True,
         "updated": True},
        {"test": f"{updated}[True]", "stock": "passed", "patched": "passed", "shows_the_change": False,
         "updated": True},
    ]
    (rfc / "results" / "lightning-stack-tests.json").write_text(json.dumps(results))
    assert run(rfc).returncode == 0
    text = (rfc / "page.md").read_text()
    assert "2 tests in 1 modules, of which **1 fail on stock pytorch-lightning" in text
    assert "1 tests in 2 parametrisations, of which **2 pass with the stack** and 1 fail on stock" in text
    # a long test id in a table may wrap between its words only (<wbr>), never inside one
    assert ("| <code>loops.<wbr>test&#95;<wbr>dataloader&#95;<wbr>iter&#95;<wbr>fetcher::<wbr>test&#95;<wbr>done</code>"
            " | passed | passed |") in text
    assert "test_opt[True]" not in text  # a parametrisation the change leaves alone, passing on both


def test_the_coverage_block_gives_the_share_of_added_statements_run_and_the_lines_not_run(rfc):
    marker = "<!-- BEGIN GENERATED: patch-coverage -->\n<!-- END GENERATED: patch-coverage -->\n"
    (rfc / "page.md").write_text(marker)
    assert run(rfc).returncode == 0
    assert "**No coverage of the stack's added lines yet:**" in (rfc / "page.md").read_text()
    results = {
        "schema": 1, "setup": {"git_commit": "0123456789abcdef", "git_dirty": True},
        "sources": "sha256:fedcba9876543210", "run": 9, "added_statements": 12, "share": 0.75,
        "target": 0.9, "met": False,
        "files": [{"path": "loops/fetchers.py", "added_statements": 10, "not_run": [{"line": 7, "text": "x = 1"},
                                                                                    {"line": 9, "text": "y"}]},
                  {"path": "loops/progress.py", "added_statements": 2, "not_run": []}],
    }
    (rfc / "results" / "patch-coverage.json").write_text(json.dumps(results))
    assert run(rfc).returncode == 0
    text = (rfc / "page.md").read_text()
    assert ("at commit `0123456789ab` (with uncommitted changes); the series of the `patch/` sources"
            " `fedcba987654`") in text
    assert "run **9 of the 12 statements it adds** to pytorch_lightning (75.0%; target 90%: **missed**)" in text
    assert "| `loops/fetchers.py` | 10 | 7, 9 |" in text
    assert "| `loops/progress.py` | 2 | none |" in text


def test_a_verdict_goes_to_the_row_the_target_judged_not_to_every_world_size():
    """S7's target judges 2 ranks and one step; the rows at other world sizes or steps of the same design carry no
    verdict, whatever their ratio."""
    from rendering.targets import row_verdicts

    targets = {"S7": {"metric": "overhead_vs_regular", "results": [
        dict(design="patched", value=1.004, interval=[1.0, 1.008], verdict="met", met=True)]}}
    judged = dict(design="patched", world_size=2, step="20ms", overhead_vs_regular=1.004)
    larger = dict(design="patched", world_size=8, step="20ms", overhead_vs_regular=1.15)
    tiny = dict(design="patched", world_size=2, step="tiny", overhead_vs_regular=1.2)
    assert row_verdicts(judged, "S7", targets) == "S7 met"
    assert row_verdicts(larger, "S7", targets) == "–" and row_verdicts(tiny, "S7", targets) == "–"
    control = dict(judged, role="control", configuration="vote as a broadcast")  # the same figure, by chance
    assert row_verdicts(control, "S7", targets) == "–"


def test_the_s7_block_shows_a_control_beside_the_judged_row_without_a_verdict(tmp_path):
    from rendering.first_screen import block_s7, costs_line
    from rendering.results import Inputs

    row = dict(design="patched", role="design", configuration="ships", world_size=2, step="20ms", t_call_us=30000.0,
               t_regular_us=29400.0, overhead_vs_regular=1.02, overhead_vs_regular_interval=[1.012, 1.028])
    control = dict(row, role="control", configuration="vote as a broadcast", overhead_vs_regular=1.001,
                   overhead_vs_regular_interval=[0.991, 1.007])
    targets = {"S7": {"results": [dict(design="patched", value=1.02, interval=[1.012, 1.028], verdict="missed")]}}
    larger = dict(row, world_size=4, overhead_vs_regular=1.015, overhead_vs_regular_interval=[1.009, 1.018])
    inputs = Inputs(rfc_dir=tmp_path, results_dir=tmp_path, out_dir=tmp_path, command="render",
                    benchmarks={"x86-patched": {"scenarios": {"S7": [control, row, larger]}, "targets": targets}})
    block = block_s7(inputs, tmp_path)
    assert "| 4 |" not in block and "4 ranks: [the benchmarks](" in block  # the judged world size only, here
    lines = [line for line in block.splitlines() if line.startswith("| 2 ")]
    assert lines[0].startswith("| 2 | 20ms | 30.00 | 29.40 | 1.020 [1.012, 1.028] | ≤ 1.01: **missed** |")
    assert lines[1] == "| 2 | 20ms (vote as a broadcast, a control) | 30.00 | 29.40 | 1.001 [0.991, 1.007] | – |"
    assert "From `benchmarks-x86-patched.json`." in block  # one file: named once, not on every row
    assert "1.001" not in costs_line(inputs)  # the first screen states what ships


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True, timeout=30)


def test_check_fails_when_a_source_a_record_measured_changed_since_it_ran(rfc):
    import harness_common

    repo = rfc.parent  # the RFC directory in a repository of its own, with a design and a harness unit test
    for path in ("prototypes/design.py", "benchmarks/test_harness_unit.py"):
        (repo / path).parent.mkdir(exist_ok=True)
        (repo / path).write_text("MEASURED = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the measured code")
    conf, bench = conformance(), benchmarks()
    for data in (conf, bench):
        data["setup"]["sources"] = harness_common.source_digests(repo)
    write_results(rfc, conf, bench)
    assert run(rfc).returncode == 0 and run(rfc, "--check").returncode == 0

    (repo / "benchmarks/test_harness_unit.py").write_text("EDITED = 1  # a unit test of the harness measures nothing\n")
    (repo / "page.md").write_text("prose changes no measurement\n")
    assert run(rfc, "--check").returncode == 0

    (repo / "prototypes/design.py").write_text("MEASURED = 2\n")
    check = run(rfc, "--check")
    assert check.returncode == 1 and "results older than the code they speak for" in check.stderr
    assert "conformance.json: designs changed since it ran (commit feedfacefeed)" in check.stderr
    assert f"{BENCHMARKS_FILE}: designs changed since it ran" in check.stderr
    assert "re-run `pytest --benchmark-only`" in check.stderr

    del conf["setup"]["sources"]  # a record made before the digests existed
    (repo / "prototypes/design.py").write_text("MEASURED = 1\n")
    write_results(rfc, conf, bench)
    check = run(rfc, "--check")
    assert check.returncode == 1 and "conformance.json: carries no source digest" in check.stderr
    assert BENCHMARKS_FILE not in check.stderr
