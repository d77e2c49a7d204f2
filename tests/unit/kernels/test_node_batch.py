"""The node's batches: built from templates and arrays, on the wire as the record's bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.runner import LaunchBatcher, LaunchChunk, NodeBatch, WorkloadRunner
from kernelstream.kernels.transfers import HostPattern
from kernelstream.schemas import DeviceSample, encode
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.columnar import decode_launch_columns
from kernelstream.schemas.records import MAX_DURATION_US


class _CountingDevice(SimDevice):
    """A sim device that counts the launch plans asked of it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plans = 0

    def plan(self, workload: Any, config: Any) -> Any:
        self.plans += 1
        return super().plan(workload, config)


def _batches(dev: SimDevice, ticks: int = 12, **runner: Any) -> list[NodeBatch]:
    run = WorkloadRunner(dev, dev.workloads()[:2], **runner)
    batcher = LaunchBatcher(dev, "n1", max_launches=8, max_delay_s=0.1)
    out: list[NodeBatch] = []
    t0 = 1_700_000_000.0
    for k in range(ticks):
        now = t0 + 0.05 * k
        if k == 5:
            batcher.add_sample(DeviceSample(t=now, sm_util_pct=80.0, power_w=250.0))
        for chunk in run.tick(now):
            out += batcher.add(chunk, now)
        out += batcher.due(now)
    return out + batcher.flush()


def test_wire_bytes_are_the_records_in_both_formats() -> None:
    batches = _batches(SimDevice("A100-SXM4-80GB", seed=3))
    assert len(batches) > 8
    assert any(b.samples for b in batches) and any(not b.samples for b in batches)
    for b in batches:
        record = b.record()
        assert b.wire() == encode_launch_batch(record)
        assert b.wire(binary=False) == encode(record)
        cols = decode_launch_columns(b.wire())
        assert cols.meta.stream_key == b.stream_key == record.stream_key
        assert cols.meta.seq_start == b.seq_start
        assert cols.t_end.tolist() == record.t_end and len(b) == len(record.t_end)


def test_host_columns_travel_through_the_record() -> None:
    dev = SimDevice("A100-SXM4-80GB", seed=1)
    kernel = dev.workloads()[0].name
    pattern = HostPattern(h2d_bytes=1 << 20, pinned=False, sync_every=1)
    batches = _batches(dev, host_patterns={kernel: pattern})
    with_host = [b for b in batches if b.host]
    assert with_host
    for b in with_host:
        assert b.wire() == encode_launch_batch(b.record())
        cols = decode_launch_columns(b.wire())
        assert cols.host_gap_us is not None and len(cols.host_gap_us) == len(b)


def test_the_plan_and_header_are_built_once_per_kernel_and_configuration() -> None:
    dev = _CountingDevice("A100-SXM4-80GB", seed=0)
    batches = _batches(dev, ticks=20)
    assert len(batches) > 10
    assert dev.plans == 2  # two kernels, one configuration each
    by_stream: dict[str, set[int]] = {}
    for b in batches:
        by_stream.setdefault(b.stream_key, set()).add(id(b.template))
    assert all(len(ids) == 1 for ids in by_stream.values())


def test_a_new_workload_object_gets_a_new_template() -> None:
    # Same kernel name and configuration id, another problem size: another plan.
    dev = _CountingDevice("A100-SXM4-80GB", seed=0)
    w: Any = dev.workloads()[0]
    other = w.resized(tuple(2 * x for x in w.problem_size))
    batcher = LaunchBatcher(dev, "n1")
    cfg = w.space.start_config()
    cid = w.space.config_id(cfg)
    t = np.array([1.0, 2.0])
    d = np.array([5.0, 6.0])
    ok = np.array([True, True])
    batcher.add(LaunchChunk(w.name, w, dict(cfg), cid, 0, t, d, ok), 0.0)
    (a,) = batcher.flush()
    batcher.add(LaunchChunk(w.name, other, dict(cfg), cid, 2, t + 2, d, ok), 0.0)
    (b,) = batcher.flush()
    assert dev.plans == 2
    assert a.record().problem_size != b.record().problem_size


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("duration_us", float("nan")),
        ("duration_us", -1.0),
        ("duration_us", -float("inf")),
        ("duration_us", float("inf")),
        ("duration_us", MAX_DURATION_US * 1.001),
        ("t_end", float("inf")),
        ("t_end", float("nan")),
    ],
)
def test_a_column_the_model_refuses_is_refused_on_the_node(column: str, value: float) -> None:
    dev = SimDevice("A100-SXM4-80GB", seed=0)
    w = dev.workloads()[0]
    cfg = w.space.start_config()
    cols = {"t_end": np.array([1.0, 2.0, 3.0]), "duration_us": np.array([5.0, 6.0, 7.0])}
    cols[column][1] = value
    batcher = LaunchBatcher(dev, "n1")
    chunk = LaunchChunk(
        w.name,
        w,
        dict(cfg),
        w.space.config_id(cfg),
        0,
        cols["t_end"],
        cols["duration_us"],
        np.ones(3, dtype=bool),
    )
    batcher.add(chunk, 0.0)
    (b,) = batcher.flush()
    with pytest.raises(ValidationError, match=column):
        b.wire()
    with pytest.raises(ValidationError, match=column):
        b.wire(binary=False)


def test_flags_other_than_0_and_1_are_the_models_to_refuse() -> None:
    dev = SimDevice("A100-SXM4-80GB", seed=0)
    w = dev.workloads()[0]
    cfg = w.space.start_config()
    batcher = LaunchBatcher(dev, "n1")
    t, d = np.array([1.0, 2.0]), np.array([5.0, 6.0])
    batcher.add(
        LaunchChunk(w.name, w, dict(cfg), w.space.config_id(cfg), 0, t, d, np.array([1, 2])), 0.0
    )
    (b,) = batcher.flush()
    with pytest.raises(ValidationError, match="ok"):
        b.wire()


@pytest.mark.parametrize("value", [0.0, -0.0, MAX_DURATION_US])
def test_durations_at_the_models_bounds_are_the_records_bytes(value: float) -> None:
    # The node's own check reads the durations' bit patterns: -0.0 (which the model
    # takes) goes through the record, the largest duration the model takes does not;
    # both give the record's bytes.
    dev = SimDevice("A100-SXM4-80GB", seed=0)
    w = dev.workloads()[0]
    cfg = w.space.start_config()
    batcher = LaunchBatcher(dev, "n1")
    d = np.array([5.0, value, 7.0])
    t = np.array([1.0, 2.0, 3.0])
    chunk = LaunchChunk(w.name, w, dict(cfg), w.space.config_id(cfg), 0, t, d, np.ones(3, bool))
    batcher.add(chunk, 0.0)
    (b,) = batcher.flush()
    assert b.wire() == encode_launch_batch(b.record())
    assert decode_launch_columns(b.wire()).duration_us.tolist() == [5.0, value, 7.0]
