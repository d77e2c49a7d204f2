"""How ``kernelstream bench tuning`` scores a run: online cost and the verdict per space.

Two figures beside the evaluations-to-5% ones of :mod:`bench.tuning`:

- **cumulative regret** (online cost): a tuner in production runs every configuration
  it tries. Each evaluation is one window of launches of the configuration evaluated;
  a configuration that fails to run costs its window at the configuration kept so far
  (the node falls back to it); once a method has ended (its budget, or its own stopping
  rule), the configuration it kept, its best, runs on. After ``n`` windows the regret
  is the summed mean time of those windows divided by ``n`` windows at the optimum:
  1.0 is a method that ran the optimum from the first window. "Never tune" holds the
  start configuration: its regret is the start's time over the optimum's.
- **verdict**: kernelstream against the best peer of the space (the Kernel Tuner
  strategy or random search with the lowest median evaluations to 5%, most seeds
  reached on a tie): *beats* when it reaches 5% on at least as many seeds with a
  median no higher, and is better in one of the two; *ties* when both are equal;
  *loses* otherwise.
- **paired log ratio** (the fleet and the warm start): the same seed run two ways, one
  node against four or warm against cold, with the same launch noise (common random
  numbers, :class:`kernels.backends.trace.LaunchNoise`). The mean over seeds of the log
  ratio of the two counts, with a 90% t interval, says how far apart the two are and how
  sure that is; a ratio of two medians from a handful of heavy-tailed counts says little.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "REGRET_AT",
    "best_peer",
    "cumulative_regret",
    "never_tune",
    "paired_log_ratio",
    "regret_summary",
    "verdict",
]

REGRET_AT = (50, 100, 200)


def cumulative_regret(times: Sequence[float], start_us: float, opt_us: float, n: int) -> float:
    """Summed mean time of the first ``n`` windows over ``n`` windows at the optimum.

    ``times`` are the true mean times of the configurations evaluated, in order (``inf``
    for one that failed). A failed one costs its window at the best so far (the start
    before anything ran); windows after the last evaluation run the best so far.

    >>> cumulative_regret([4.0, 2.0, math.inf], start_us=4.0, opt_us=1.0, n=4)
    2.5
    """
    best = math.inf  # of the configurations run so far
    total = 0.0
    for t in times[:n]:
        if math.isfinite(t):
            best = min(best, t)
            total += t
        else:
            total += best if math.isfinite(best) else start_us
    kept = best if math.isfinite(best) else start_us
    total += kept * max(0, n - len(times))
    return total / (n * opt_us)


def regret_summary(
    runs: Sequence[Sequence[float]], start_us: float, opt_us: float, budget: int
) -> dict[str, float]:
    """Median cumulative regret over seeds after each of :data:`REGRET_AT` (within budget)."""
    return {
        f"after_{n}": float(np.median([cumulative_regret(t, start_us, opt_us, n) for t in runs]))
        for n in REGRET_AT
        if n <= budget and runs
    }


def never_tune(start_us: float, opt_us: float, budget: int) -> dict[str, float]:
    """The start configuration held fixed: the reference row of the regret table."""
    return {f"after_{n}": start_us / opt_us for n in REGRET_AT if n <= budget}


def best_peer(methods: Mapping[str, Mapping[str, Any]], peers: Sequence[str]) -> str | None:
    """The peer with the lowest median evaluations to 5% (most seeds reached on a tie)."""
    present = [p for p in peers if p in methods]
    return min(
        present,
        key=lambda p: (methods[p]["within_5pct"]["median"], -methods[p]["within_5pct"]["reached"]),
        default=None,
    )


def verdict(
    methods: Mapping[str, Mapping[str, Any]], peers: Sequence[str]
) -> dict[str, Any] | None:
    """kernelstream against the best of ``peers`` on reach and median (module docstring).

    None when kernelstream or every peer has no runs on the space.
    """
    peer = best_peer(methods, peers)
    if peer is None or "kernelstream" not in methods:
        return None
    ours, theirs = methods["kernelstream"]["within_5pct"], methods[peer]["within_5pct"]
    reach = (ours["reached"], theirs["reached"])
    median = (ours["median"], theirs["median"])
    if reach[0] < reach[1] or median[0] > median[1]:
        word = "loses"
    elif reach[0] > reach[1] or median[0] < median[1]:
        word = "beats"
    else:
        word = "ties"
    return {"result": word, "peer": peer, "reached": list(reach), "median": list(median)}


def paired_log_ratio(
    a: Sequence[int | None], b: Sequence[int | None], miss: int
) -> dict[str, Any] | None:
    """Mean over seeds of ``log(a / b)`` with its standard error and 90% t interval.

    ``a[i]`` and ``b[i]`` are counts of the same seed (None: not reached, counted as
    ``miss``). None with fewer than two seeds. A positive mean: ``a`` needs more.

    >>> r = paired_log_ratio([40, 90, None], [10, 30, 100], miss=401)
    >>> round(r["mean"], 3), r["seeds"]
    (1.291, 3)
    """
    from scipy.stats import t

    if len(a) != len(b):
        raise ValueError(f"paired counts of different lengths: {len(a)} and {len(b)}")
    n = len(a)
    if n < 2:
        return None
    logs = np.log(
        [
            (x if x is not None else miss) / (y if y is not None else miss)
            for x, y in zip(a, b, strict=True)
        ]
    )
    mean, se = float(logs.mean()), float(logs.std(ddof=1) / math.sqrt(n))
    half = float(t.ppf(0.95, n - 1)) * se
    return {"mean": mean, "se": se, "ci90": [mean - half, mean + half], "seeds": n}
