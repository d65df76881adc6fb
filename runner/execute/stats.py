"""Summaries of timing samples and the A/A noise floor (pure Python: usable in parent and child)."""
from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no samples")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """median/min/max/p10/p90 and spread = (p90 - p10) / median in percent."""
    med = percentile(samples, 50)
    p10, p90 = percentile(samples, 10), percentile(samples, 90)
    return {
        "median": med,
        "min": min(samples),
        "max": max(samples),
        "p10": p10,
        "p90": p90,
        "spread_pct": 100.0 * (p90 - p10) / med if med > 0 else 0.0,
        "samples": len(samples),
    }


def aa_noise(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """The same kernel timed in two interleaved slots: how far apart two identical things look.

    ``aa_noise_pct`` is |1 - median of the per-round ratios| in percent (what the schema records);
    the p10/p90 of the per-round ratio say how much a single round can wander.
    """
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    if not ratios:
        raise ValueError("A/A noise needs paired samples")
    med = percentile(ratios, 50)
    return {
        "aa_noise_pct": abs(1.0 - med) * 100.0,
        "aa_ratio_median": med,
        "aa_ratio_p10": percentile(ratios, 10),
        "aa_ratio_p90": percentile(ratios, 90),
        "aa_medians_pct": abs(1.0 - percentile(a, 50) / percentile(b, 50)) * 100.0,
    }
