"""``prototypes.coupling``: the private Lightning names a design uses, read from source, for the RFC's lists."""

from __future__ import annotations

import sys
import textwrap

import pytest

from prototypes import DESIGNS
from prototypes.coupling import Use, coupling_of, design_module, lightning_private_names, private_uses_in_source


def test_the_public_api_designs_use_no_private_name():
    for name in ("upstream", "callback"):
        assert coupling_of(design_module(DESIGNS[name])).names == (), name


def test_the_loop_changing_designs_are_coupled_through_their_shared_module():
    found = {name: coupling_of(design_module(DESIGNS[name])) for name in ("batch_processor", "prefetcher")}
    for name, coupling in found.items():
        assert "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop" in coupling.shared.imported, name
        assert "_should_check_val_fx" in coupling.shared.overridden, name  # in prototypes.lightning_changes
        assert "_logger_connector" in coupling.shared.accessed, name
        assert not set(coupling.own.names) & set(coupling.shared.names), f"{name}: a shared name counted as its own"
        assert coupling.own.names, f"{name}: a design that changes Lightning's loops has couplings of its own"
    assert found["batch_processor"].shared == found["prefetcher"].shared  # the same modules, the same change


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
    assert found.own.imported == ("pytorch_lightning.loops.fit_loop._FitLoop",)
    assert found.own.overridden == ("_should_accumulate",)
    assert found.own.accessed == ("_logger_connector",)
    assert found.shared.names == ()  # it imports no shared prototypes module


def test_each_use_is_found_on_its_line_and_every_import_form_counts():
    source = textwrap.dedent('''
        import pytorch_lightning.trainer.connectors._private_module
        from lightning_fabric.utilities.data import _auto_add_worker_init_fn
        from pytorch_lightning import Trainer

        def run(trainer):
            return trainer.fit_loop._data_fetcher
    ''')
    assert private_uses_in_source(source) == [
        Use("imported", "pytorch_lightning.trainer.connectors._private_module", 2),
        Use("imported", "lightning_fabric.utilities.data._auto_add_worker_init_fn", 3),
        Use("accessed", "_data_fetcher", 7),
    ]


def test_a_mixin_of_a_lightning_class_writes_lightning_attributes():
    source = textwrap.dedent('''
        from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop

        class Draining:
            def drain(self):
                self._batches_that_stepped += 1   # the loop's attribute, written from its mixin

        class Loop(Draining, _TrainingEpochLoop):
            pass
    ''')
    assert private_uses_in_source(source) == [
        Use("imported", "pytorch_lightning.loops.training_epoch_loop._TrainingEpochLoop", 2),
        Use("accessed", "_batches_that_stepped", 6),
    ]


def test_lightning_private_names_come_from_the_installed_sources():
    names = lightning_private_names()
    assert {"_TrainingEpochLoop", "_should_check_val_fx", "_logger_connector"} <= names
    assert "_own_counter" not in names
