"""bench worker-path: both passes see every launch and the worker closes windows."""

from __future__ import annotations

from kernelstream.bench.worker_path import measure


def test_worker_path_measures_both_passes_on_the_same_input() -> None:
    r = measure(seconds=1.5, batch=500, rounds=1)
    assert r["launches"] > 0 and r["messages"] > 0
    # 64 streams (16 nodes x 4 kernels): the second of input before the last is closed.
    assert r["windows"] >= 64
    assert r["worker_ns_per_launch"] > 0 and r["ceiling_ns_per_launch"] > 0
    assert r["ratio"] == r["ceiling_ns_per_launch"] / r["worker_ns_per_launch"]
