"""``prototypes.coupling``: the private Lightning names a design uses, read from source, for the RFC's lists."""

from __future__ import annotations

import sys
import textwrap

import pytest

from prototypes import IMPLEMENTATIONS
from prototypes.coupling import coupling_of, design_module, lightning_private_names


def test_the_public_api_designs_use_no_private_name():
    for name in ("upstream", "callback"):
        assert coupling_of(design_module(IMPLEMENTATIONS[name])).names == (), name


def test_the_loop_changing_designs_are_coupled_through_their_shared_module():
    for name in ("batch_processor", "prefetcher"):
        found = coupling_of(design_module(IMPLEMENTATIONS[name]))
        assert "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop" in found.imported, name
        assert "_should_check_val_fx" in found.overridden, name  # written once, in prototypes.lightning_changes
        assert "_logger_connector" in found.accessed, name


@pytest.fixture
def outside_module(tmp_path, monkeypatch):
    package = tmp_path / "coupling_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "design.py").write_text(textwrap.dedent('''
        from pytorch_lightning.loops.fit_loop import _FitLoop
        from pytorch_lightning import Trainer


        class Loop(_FitLoop):
            def _should_accumulate(self):        # overrides Lightning's private method
                return self._own_counter > 0   # a private attribute of its own: not coupling


        class Helper:
            def _should_accumulate(self):        # not a Lightning class: its own method, not an override
                self._results = None           # its own attribute, whatever Lightning calls its own
                return False


        def run(trainer: Trainer):
            return trainer._logger_connector    # reads a private Lightning attribute
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "coupling_probe.design"
    sys.modules.pop("coupling_probe", None)


def test_imports_overrides_and_attributes_are_told_apart(outside_module):
    found = coupling_of(outside_module)
    assert found.imported == ("pytorch_lightning.loops.fit_loop._FitLoop",)
    assert found.overridden == ("_should_accumulate",)
    assert found.accessed == ("_logger_connector",)


def test_lightning_private_names_come_from_the_installed_sources():
    names = lightning_private_names()
    assert {"_TrainingEpochLoop", "_should_check_val_fx", "_logger_connector"} <= names
    assert "_own_counter" not in names
