"""The node's telemetry cost as `bench pipeline-peers` prints it."""

from __future__ import annotations

from kernelstream.bench.pipeline_input import (
    FleetSpec,
    fleet_batches,
    fleet_node_batches,
    node_cost,
)
from kernelstream.schemas import encode


def test_node_cost_times_the_node_path_over_the_fleets_batches() -> None:
    spec = FleetSpec(nodes=2, launches_per_s_per_kernel=400, seconds=0.5, max_launches=8)
    records = list(fleet_batches(spec))
    cost = node_cost(spec, rounds=1)
    assert cost["batches"] == len(records) > 8
    assert cost["launches"] == sum(len(r.t_end) for r in records)
    assert cost["batch_ns_per_launch"] > 0 and cost["binary_through_record_ns_per_launch"] > 0
    json_bytes = sum(len(encode(r)) for r in records)
    assert cost["encode"]["json"]["bytes_per_launch"] == json_bytes / cost["launches"]
    binary = [b.wire() for b in fleet_node_batches(spec)]
    assert cost["encode"]["binary"]["bytes_per_launch"] == sum(map(len, binary)) / cost["launches"]
