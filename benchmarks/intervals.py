"""How sure a figure is: a 95 % interval for the median of per-round values, and the verdict it allows.

Every judged figure is computed once per interleaved round (the entries of one round ran back to back, under the same
load), so a figure's rounds are independent samples of it. Its value is their median and its interval the
distribution-free confidence interval of the median from order statistics: with n rounds the number of rounds below
the true median is Binomial(n, 1/2), so the k-th smallest and k-th largest round bound the median with probability
1 - 2 P(X < k). No assumption about the shape of the noise (a busy machine only ever adds time, so it is skewed); at
least ``MIN_ROUNDS`` rounds are needed for any 95 % interval.

A verdict compares the interval, not the value, with the target: met when the whole interval is on the target's
side, missed when the whole interval is on the other side, inconclusive when it straddles the threshold.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95
MET, MISSED, INCONCLUSIVE, NOT_JUDGED = "met", "missed", "inconclusive", "not judged"
VERDICTS = (MET, MISSED, INCONCLUSIVE, NOT_JUDGED)


def _order_statistic(n: int, confidence: float = CONFIDENCE) -> int:
    """The largest k (1-based, 0 if none) with P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2."""
    tail, k, below = (1.0 - confidence) / 2.0, 0, 0.0
    for j in range(n + 1):
        below += math.comb(n, j) / 2.0**n  # P(X <= j)
        if below > tail:
            break
        k = j + 1
    return k


MIN_ROUNDS = next(n for n in range(1, 64) if _order_statistic(n) >= 1)  # 6 at 95 %


def median_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """A ``CONFIDENCE`` interval for the median of ``values`` (None with fewer than ``MIN_ROUNDS`` values)."""
    finite = sorted(v for v in values if v is not None and not math.isnan(v))
    k = _order_statistic(len(finite))
    if k == 0:
        return None
    return finite[k - 1], finite[len(finite) - k]


def summary(values: Sequence[float], digits: int = 4) -> dict[str, Any]:
    """``value`` (the median) and ``interval`` ([low, high] or None) of per-round figures, rounded for the JSON."""
    finite = [v for v in values if v is not None and not math.isnan(v)]
    interval = median_interval(finite)
    return dict(
        value=round(statistics.median(finite), digits) if finite else None,
        interval=None if interval is None else [round(interval[0], digits), round(interval[1], digits)],
    )


def verdict(interval: Sequence[float] | None, compare: str, threshold: float) -> str:
    """met, missed or inconclusive for an interval against ``value compare threshold``; not judged without one."""
    if interval is None:
        return NOT_JUDGED
    low, high = interval
    if compare == ">=":
        return MET if low >= threshold else MISSED if high < threshold else INCONCLUSIVE
    if compare == "<=":
        return MET if high <= threshold else MISSED if low > threshold else INCONCLUSIVE
    raise ValueError(f"compare must be '>=' or '<=', got {compare!r}")
