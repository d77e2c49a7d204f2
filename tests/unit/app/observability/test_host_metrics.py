"""The node's copy and host-gap counters, from the chunks a host-patterned sim runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from kernelstream.app.observability.metrics import HostTally, exported_names
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.runner import WorkloadRunner
from kernelstream.kernels.transfers import HostPattern


class _Tally:
    def __init__(self, tally: HostTally) -> None:
        self.tally = tally

    def collect(self) -> Iterator[Metric]:
        yield from self.tally.families(["n1"], ["transpose", "matmul"])


def test_copies_gaps_and_waits_are_counted_per_kernel_and_direction() -> None:
    dev = SimDevice("A100-SXM4-80GB")
    work = [w for w in dev.workloads() if w.name == "transpose"]
    pattern = HostPattern(8 << 20, 1 << 20, pinned=False, sync_every=1)
    runner = WorkloadRunner(dev, work, host_patterns={"transpose": pattern})
    tally = HostTally()
    launches = 0
    for k in range(6):
        for chunk in runner.tick(100.0 + 0.05 * k):
            tally.observe(chunk)
            launches += len(chunk.t_end)
    reg = CollectorRegistry()
    reg.register(_Tally(tally))
    labels = {"node": "n1", "kernel": "transpose", "direction": "h2d", "pinned": "0"}
    h2d_bytes = reg.get_sample_value("kernelstream_node_copy_bytes_total", labels)
    h2d_s = reg.get_sample_value("kernelstream_node_copy_seconds_total", labels)
    assert h2d_bytes == launches * (8 << 20)
    assert h2d_s is not None and h2d_bytes / h2d_s == pytest.approx(0.85 * 31.5e9 / 2, rel=1e-3)
    waits = reg.get_sample_value(
        "kernelstream_node_host_waits_total", {"node": "n1", "kernel": "transpose"}
    )
    assert waits == launches
    # known label values are exported at 0 before anything happens
    idle = {"node": "n1", "kernel": "matmul", "direction": "d2d", "pinned": "1"}
    assert reg.get_sample_value("kernelstream_node_copy_bytes_total", idle) == 0
    for name in ("copy_bytes", "copy_seconds", "host_gap_seconds", "host_waits"):
        assert f"kernelstream_node_{name}_total" in exported_names()
