"""What a scenario runs for the designs (its entries), which configuration each is, and what its row adds.

An entry is one thing measured at a scenario point, named by its key: a baseline (``baseline:<name>``), an
alternative a user has today (``alt:<name>``), or a design in one configuration (the variant's registry id). Which
configurations of a design run, and which of them a target judges, follows from what the design declares
(``prototypes.common.Design``), never from its name; a row names its configuration (``configuration``):

- ``SHIPS``: the registered configuration (``Design.options``), what a user gets without asking. The targets on a
  design's own cost and behaviour (S2, S3, S3-regular) judge it.
- ``OPT_IN_THREAD``: ``Design.thread_options``, the configuration that gives a design shipping without a thread its
  prefetch thread. The overlap targets (S1, S6 and their alternatives) measure the thread, and the RFC decides on
  the thread from them, so they judge this configuration, and the S1 floors a design promises
  (``promised_s1_efficiency``) are asserted on it. A design that prefetches (``prefetch_depth_option``) without
  declaring ``thread_options`` is judged on what it ships (``thread_configuration``).
- every other depth a scenario asks for: measured and shown, not judged (S4 judges every fixed depth).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.measuring import Interleaved, Probe
from prototypes import DESIGNS
from prototypes.common import Design

SHIPS, OPT_IN_THREAD = "ships", "opt-in thread"


def opt_in_thread(design: Design) -> Design | None:
    """A registered design with its opt-in prefetch thread (``Design.thread_options``); None when it declares none,
    or when those options are what it ships."""
    if not design.thread_options:
        return None
    variant = design.variant(**design.thread_options)
    return None if variant.id == design.id else variant


def thread_configuration(design: Design) -> str | None:
    """Which configuration of a registered design the overlap targets judge: its opt-in thread where it declares
    one, else what it ships where it prefetches; None for a design that does not prefetch."""
    if opt_in_thread(design) is not None:
        return OPT_IN_THREAD
    return SHIPS if design.prefetch_depth_option else None


def configuration(entry: Design, design: Design) -> str | None:
    """What the entry ``entry`` (a variant of the registered ``design``) is: ``SHIPS``, ``OPT_IN_THREAD`` or
    neither (None: another depth)."""
    if entry.id == design.id:
        return SHIPS
    thread = opt_in_thread(design)
    return OPT_IN_THREAD if thread is not None and entry.id == thread.id else None


def configuration_of(entry: Design) -> str | None:
    """``configuration`` of an entry of a design in the registry."""
    return configuration(entry, DESIGNS[entry.name])


def is_thread_configuration(entry: Design) -> bool:
    """Whether the entry is the configuration the overlap targets judge (and the S1 promises are asserted on)."""
    kind = configuration_of(entry)
    return kind is not None and kind == thread_configuration(DESIGNS[entry.name])


def design_entries(depths: Sequence[int], with_opt_in_thread: bool = True) -> dict[str, Design]:
    """Entry key -> design: every registered design this environment can run, as it ships, its opt-in thread
    (``with_opt_in_thread``), and every design that prefetches (``Design.prefetch_depth_option``) also at each of
    ``depths`` (each kept once)."""
    entries: dict[str, Design] = {}
    for design in (design for design in DESIGNS.values() if design.unavailable_reason() is None):
        thread = opt_in_thread(design) if with_opt_in_thread else None
        depths_of_design = [design.variant(**{design.prefetch_depth_option: depth})
                            for depth in depths] if design.prefetch_depth_option else []
        for entry in (design, *([thread] if thread is not None else []), *depths_of_design):
            entries.setdefault(entry.id, entry)
    return entries


def design_fields(entry: Design) -> dict[str, Any]:
    """What every design row of a scenario says about its entry: the variant's id, its depth and configuration
    (``default``: it is what the design ships, as files before ``configuration`` said it)."""
    kind = configuration_of(entry)
    return dict(design=entry.id, role="design", depth=depth_of(entry), configuration=kind, default=kind == SHIPS)


# The design the thread is weighed against (the same contract, no thread) composed with what users already use.
SIMPLER_DESIGN = "batch_processor"


def simpler_design_alternatives(compositions: Sequence[str] = ("workers", "nodes-prefetch")) -> dict[str, tuple]:
    """Alternative entry -> (design, composition) for the simpler design over DataLoader workers and over torchdata
    ``nodes`` prefetching (empty when that design is not registered)."""
    design = DESIGNS.get(SIMPLER_DESIGN)
    if design is None:
        return {}
    return {f"alt:{design.id}+{composition}": (design, composition) for composition in compositions}


def versus_fixed_depths(data: Interleaved, entry: str, design: Design, entries: dict[str, Design]) -> dict[str, Any]:
    """For an entry whose depth the design chooses itself (``"auto"``): its time per batch over each fixed-depth
    entry of the same design, per round with a 95 % interval. Once it settles on a depth, the ratio to that depth
    is the spread between two identical configurations, which is what noise alone does to a ratio."""
    if isinstance(depth_of(design), int) or not design.prefetch_depth_option or entry not in entries:
        return {}
    fixed = {depth_of(d): key for key, d in entries.items()
             if d.name == design.name and isinstance(depth_of(d), int) and key != entry}
    return {"vs_fixed_depth": {str(depth): data.ratio(entry, key) for depth, key in sorted(fixed.items())}}


def depth_of(design: Design) -> Any:
    """The prefetch depth a design entry runs at (None for a design that does not prefetch)."""
    option = design.prefetch_depth_option
    return design.options.get(option) if option else None


def off_main_share(probes: Sequence[Probe]) -> float | None:
    """The median over rounds of each run's share of batches loaded (or transferred) off the main thread."""
    shares = [s for s in (p.off_main_share() for p in probes) if s is not None]
    return round(statistics.median(shares), 4) if shares else None
