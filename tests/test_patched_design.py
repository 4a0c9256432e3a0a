"""The ``patched`` registry entry (``prototypes.patched``): it runs only where the patched Lightning's marker is
installed from this checkout's ``patch/`` sources; elsewhere the default selection leaves it out, naming it is an
error, and ``pytest --design patched`` stops with one line naming the command that builds its environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch

import harness_common
import prototypes.patched as patched
from prototypes import DESIGNS, runnable_designs

DESIGN = DESIGNS["patched"]


def _installed_marker(sources: str | None) -> SimpleNamespace:
    return SimpleNamespace(RELEASE="2.6.6", PATCHES=0, SERIES="sha256:series", SOURCES=sources)


def test_with_a_stock_lightning_it_is_left_out_and_naming_it_is_an_error(monkeypatch):
    monkeypatch.setattr(patched, "installed_series", lambda: None)
    reason = DESIGN.unavailable_reason()
    assert reason is not None and f"build its environment with `{patched.BUILD_COMMAND}`" in reason
    assert "patched" not in runnable_designs()
    assert "patched" not in [design.name for design in harness_common.select_designs(None)]
    with pytest.raises(harness_common.SelectionError) as raised:
        harness_common.select_designs("upstream,patched")
    assert str(raised.value) == f"--design patched: {reason}"
    with pytest.raises(RuntimeError) as refused:  # a stock Trainer under this name would report stock behaviour
        DESIGN.trainer(**harness_common.QUIET)
    assert str(refused.value) == reason


def test_a_package_patched_from_other_patch_sources_is_stale(monkeypatch):
    monkeypatch.setattr(patched, "installed_series", lambda: _installed_marker("sha256:older-items"))
    reason = DESIGN.unavailable_reason()
    assert reason is not None and f"rebuild it with `{patched.BUILD_COMMAND}`" in reason
    assert "patched" not in runnable_designs()


def test_with_the_marker_of_this_checkouts_sources_it_runs_in_the_default_selection(monkeypatch):
    monkeypatch.setattr(patched, "installed_series", lambda: _installed_marker(patched.patch_sources_digest()))
    assert DESIGN.unavailable_reason() is None
    assert "patched" in [design.name for design in harness_common.select_designs(None)]
    assert {design.name for design in harness_common.select_designs("patched")} == {"patched"}
    assert type(DESIGN.trainer(**harness_common.QUIET)) is pl.Trainer and DESIGN.changes_lightning_loops


def test_the_sources_digest_follows_every_item_and_the_engine(tmp_path):
    checkout = Path(patched.PATCH_DIR).parent
    copy = tmp_path / "patch"
    shutil.copytree(checkout / "patch", copy, ignore=shutil.ignore_patterns("__pycache__"))
    digest = patched.patch_sources_digest(copy)
    assert digest == patched.patch_sources_digest()
    (copy / "items" / "new_item.py").write_text("X = 1\n")
    with_item = patched.patch_sources_digest(copy)
    assert with_item not in (None, digest)
    (copy / "lightning_tests.py").write_text("# the runner of Lightning's tests does not change the package\n")
    assert patched.patch_sources_digest(copy) == with_item
    for source in (copy / f"{name}.py" for name in ("statements", "stack", "series", "descriptions", "migration")):
        before = patched.patch_sources_digest(copy)
        source.write_text(source.read_text() + "\n# edited\n")
        assert patched.patch_sources_digest(copy) not in (None, before), source
    (copy / "edits.py").unlink()
    assert patched.patch_sources_digest(copy) is None  # no checkout: nothing to compare


@pytest.mark.skipif(patched.installed_series() is not None,
                    reason="this environment has the patched package; the stop is for one without it")
@pytest.mark.timeout(180)
def test_pytest_design_patched_stops_with_one_line_naming_the_build_command():
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/conformance", "--design", "patched", "-p", "no:cacheprovider"],
        cwd=root, capture_output=True, text=True, timeout=170,
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    assert lines == [f"ERROR: --design patched: {patched.unavailable_reason()}"]
    assert patched.BUILD_COMMAND in lines[0]


class _TwoPerCall(pl.LightningModule):
    """Takes two batches per call: over three batches its second call is cut short by the end of the data."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, dataloader_iter):
        batches = [next(dataloader_iter)[0] for _ in range(2)]
        return sum(self.layer(batch).sum() for batch in batches)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.skipif(patched.unavailable_reason() is not None, reason="needs the patched package of this checkout")
@pytest.mark.timeout(120)
def test_the_patched_package_warns_of_a_call_cut_short_with_its_public_category():
    from pytorch_lightning.utilities.warnings import CutShortCallWarning

    trainer = DESIGN.trainer(**harness_common.QUIET)
    with pytest.warns(CutShortCallWarning, match="ran out of data"):
        trainer.fit(_TwoPerCall(), train_dataloaders=torch.utils.data.DataLoader(torch.randn(3, 2), batch_size=1))
