"""bench replay's windowing alone: both ways over the same messages, the same outcome."""

from __future__ import annotations

import math
import time

from kernelstream.app.settings import Settings
from kernelstream.bench.replay import _batches, windowing_alone


def test_windowing_alone_times_both_ways_on_the_same_messages() -> None:
    msgs = _batches(4_000, 100, time.time() - 3600.0)
    got = windowing_alone(Settings(), msgs, rounds=1)
    assert set(got) == {"chunks_ns_per_launch", "one_at_a_time_ns_per_launch"}
    assert all(math.isfinite(v) and v > 0 for v in got.values())
