"""Latency distributions the processes keep for their metrics endpoints.

A :class:`LatencyHistogram` counts observations into fixed buckets (Prometheus'
cumulative ``le`` form is built from it at scrape time), so the hot path pays one
bisect and two additions per observation and no metrics library is imported here.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

__all__ = [
    "RECOMMENDATION_BUCKETS_S",
    "TICK_LAG_WINDOW_S",
    "WINDOW_BUCKETS_S",
    "LatencyHistogram",
    "RecentMax",
]

#: Event time of a window's end to the window's emission: at least the allowed
#: out-of-orderness, plus the node's batching delay and the worker's own work.
WINDOW_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
#: A recommendation's ``issued_at`` to the node applying it at a safe point.
RECOMMENDATION_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: A node's tick-lag gauge shows the worst overrun of this last stretch of time.
TICK_LAG_WINDOW_S = 60.0


@dataclass
class LatencyHistogram:
    """Counts of observations (seconds) per bucket; the last bucket is ``+Inf``.

    >>> h = LatencyHistogram((0.1, 1.0))
    >>> for v in (0.05, 0.5, 0.7, 3.0):
    ...     h.observe(v)
    >>> h.cumulative(), h.count, round(h.sum, 2)
    ([(0.1, 1), (1.0, 3), (inf, 4)], 4, 4.25)
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(init=False)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        """Count one observation; a negative one (clocks apart) counts as 0."""
        v = max(0.0, seconds)
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= it)`` per bucket, ending with ``+Inf``."""
        out, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class RecentMax:
    """The largest value observed in the last ``window_s`` seconds (0.0 when none).

    A gauge of a since-start maximum never comes down after one bad moment; this
    one forgets it after ``window_s``. Keeps only the values that can still be the
    maximum (a monotonic queue), so memory stays small at any rate.

    >>> m = RecentMax(10.0)
    >>> m.observe(0.0, 0.5); m.observe(1.0, 0.1)
    >>> m.value(5.0), m.value(10.5), m.value(11.5)
    (0.5, 0.1, 0.0)
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._q: deque[tuple[float, float]] = deque()  # (time, value), values decreasing

    def observe(self, t: float, value: float) -> None:
        """Record ``value`` at time ``t`` (seconds on any clock that only goes forward)."""
        while self._q and self._q[-1][1] <= value:
            self._q.pop()
        self._q.append((t, value))

    def value(self, now: float) -> float:
        """The maximum of the values observed after ``now - window_s``."""
        while self._q and self._q[0][0] <= now - self.window_s:
            self._q.popleft()
        return self._q[0][1] if self._q else 0.0
