"""C4 Device and transfer hooks: each received batch passed the three transfer hooks exactly once."""

import pytest

from tests.conformance.harness import KINDS, IterStepModule, make_loader, make_trainer

pytestmark = pytest.mark.clause("C4")

TRAIL = ("before", "transfer", "after")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (1, 2, 3)], ids=str)
def test_every_batch_passes_each_transfer_hook_once(design, kind, pattern):
    module = IterStepModule(pattern, wrap_transfer=True)
    make_trainer(design).fit(module, make_loader(kind))
    received = module.record.received
    assert received, "the step received no batch"
    trails = dict(module.record.transfer_trail)
    missing = [batch for batch in received if batch not in trails]
    assert not missing, f"batches that reached the step without passing on_before_batch_transfer: {missing}"
    wrong = {batch: trail for batch, trail in module.record.transfer_trail if trail != TRAIL}
    assert not wrong, f"hooks each batch passed, expected {TRAIL}: {wrong}"


def test_batches_arrive_on_the_module_device_in_its_precision(design):
    # precision="64-true" makes the regular flavour convert float inputs to float64 before the transfer hooks;
    # a raw float32 batch would fail against the float64 layer. On a GPU this also checks the device.
    module = IterStepModule((2,))
    make_trainer(design, precision="64-true").fit(module, make_loader())
    assert module.record.placements
    assert set(module.record.placements) == {(module.device, module.dtype)}
