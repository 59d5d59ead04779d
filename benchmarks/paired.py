"""Two modes measured in alternation, compared pair by pair: the ratio of their speeds with a bootstrap interval.

On a shared 2-core machine whose speed drifts by 5-40 % from minute to minute, a benchmark runs each configuration
right after the other on the same input (a prompt, or a round of requests), so that a pair meets one state of the
machine. ``paired_ratio`` resamples the pairs (a pair stays a pair: the input's length and the machine's speed of the
moment cancel within it) and reports the ratio of the two modes' speeds over all of them with a percentile interval;
``verdict`` reads it against 1. Pure Python: benchmarks/workloads_cpu.py (per prompt) and benchmarks/serving_cpu.py
(per round of requests through Triton) use it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def paired_ratio(
    base: Sequence[float],
    other: Sequence[float],
    base_work: Sequence[float] | None = None,
    other_work: Sequence[float] | None = None,
    resamples: int = 4000,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """How much faster ``other`` ran than ``base``, pair i of each measured together: seconds ``base[i]`` and
    ``other[i]`` for the work ``base_work[i]`` and ``other_work[i]`` (tokens; default 1 each: the same work in both),
    the ratio of speeds sum(other_work) / sum(other) over sum(base_work) / sum(base) (> 1: ``other`` faster), with a
    percentile bootstrap interval at ``level`` over the pairs. Seeded: the same figures give the same interval."""
    n = len(base)
    bw = list(base_work) if base_work is not None else [1.0] * n
    ow = list(other_work) if other_work is not None else [1.0] * n
    if not n or len(other) != n or len(bw) != n or len(ow) != n:
        raise ValueError(f"paired_ratio: {n} against {len(other)} passes")

    def ratio(idx: Sequence[int]) -> float:
        return (sum(ow[i] for i in idx) / sum(other[i] for i in idx)) / (
            sum(bw[i] for i in idx) / sum(base[i] for i in idx)
        )

    rng = random.Random(seed)
    ratios = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2
    lo, hi = ratios[int(tail * (resamples - 1))], ratios[int((1.0 - tail) * (resamples - 1))]
    return {"ratio": round(ratio(range(n)), 4), "lo": round(lo, 4), "hi": round(hi, 4), "level": level, "pairs": n}


def verdict(interval: dict) -> str:
    """``at least``: the point estimate is >= 1; ``within noise``: below 1 but the interval reaches 1; ``below``: the
    whole interval is under 1."""
    if interval["ratio"] >= 1.0:
        return "at least"
    return "within noise" if interval["hi"] >= 1.0 else "below"
