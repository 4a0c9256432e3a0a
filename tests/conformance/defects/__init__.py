"""A catalogue of realistic defects, each of which the clause it breaks must catch (``tests/test_defect_catalogue.py``).

A defect is one entry: the clause it breaks, the real design it is applied to, one attribute of that design
(a method, a property or a function the design imports) and what replaces it, and the suite's tests that must
fail. ``defect.applied()`` registers the broken design as ``defect_<name>`` and patches the attribute for the
duration of a run; nothing is edited on disk. Adding a defect::

    Defect("batch_size_in_batches", "C10", "prefetcher", "infers `self.log`'s batch size as the number of batches",
           (log_batch_size, "samples_in"), _instead(lambda batches: len(batches) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED)

``broken`` receives the original attribute and returns its replacement. ``select`` is a ``-k`` expression that
narrows the tests to the cases that can catch the defect, to keep the catalogue fast.

    python -m tests.test_defect_catalogue rfc/results/defects.json   # run the catalogue, write its outcomes
"""

from tests.conformance.defects.catalogue import CATALOGUE
from tests.conformance.defects.defect import Defect

__all__ = ["CATALOGUE", "Defect"]
