"""Latency histograms and the recent-maximum gauge behind the processes' metrics."""

from __future__ import annotations

import math

from kernelstream.agents.latency import LatencyHistogram, RecentMax


def test_histogram_buckets_are_cumulative_and_inclusive() -> None:
    h = LatencyHistogram((0.1, 1.0, 10.0))
    for v in (0.1, 0.2, 1.0, 50.0, -0.5):  # a negative latency (clocks apart) counts as 0
        h.observe(v)
    assert h.cumulative() == [(0.1, 2), (1.0, 4), (10.0, 4), (math.inf, 5)]
    assert h.count == 5 and math.isclose(h.sum, 51.3)


def test_recent_max_comes_down_after_its_window() -> None:
    """A since-start maximum never came down; this one forgets a stall after the window."""
    m = RecentMax(60.0)
    m.observe(0.0, 2.5)  # one stalled tick
    for t in range(1, 200):
        m.observe(float(t), 0.001)
        assert m.value(float(t)) == (2.5 if t < 60 else 0.001)
    assert m.value(1000.0) == 0.0  # nothing in the last minute


def test_recent_max_keeps_few_values() -> None:
    m = RecentMax(10.0)
    for t in range(100_000):
        m.observe(t * 0.001, float(100_000 - t))  # decreasing: each may become the maximum
        m.value(t * 0.001)
    assert len(m._q) <= 10_001
