"""Transfer and host-stall findings, from sim nodes running host patterns.

Each scenario runs a sim device through the real runner and batcher, sends the
batches through the columnar decoder (as a worker reads them), and checks that
exactly the expected findings come out, with the numbers that justify them.
"""

from __future__ import annotations

import math

import pytest

from kernelstream.agents.logic.transfers import summarize, transfer_findings
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.devices import get_device_spec
from kernelstream.kernels.runner import LaunchBatcher, WorkloadRunner
from kernelstream.kernels.space import SearchSpace
from kernelstream.kernels.transfers import HostPattern
from kernelstream.schemas.columnar import LaunchColumns, decode_launch_columns

A100 = "A100-SXM4-80GB"
MIB = 1 << 20


def run(pattern: HostPattern, kernel: str = "transpose", scale: float = 1.0) -> list[LaunchColumns]:
    """One second of a sim A100 running ``kernel`` with ``pattern``, as a worker decodes it."""
    dev = SimDevice(A100, seed=3, problem_scale=scale)
    work = [w for w in dev.workloads() if w.name == kernel]
    runner = WorkloadRunner(dev, work, host_patterns={kernel: pattern})
    batcher = LaunchBatcher(dev, "n1", max_launches=500)
    batches = []
    t0 = 1_700_000_000.0
    for k in range(21):
        for chunk in runner.tick(t0 + 0.05 * k):
            batches += batcher.add(chunk, t0)
    batches += batcher.flush()
    return [decode_launch_columns(b.wire()) for b in batches]


def classes(pattern: HostPattern, kernel: str = "transpose", scale: float = 1.0) -> set[str]:
    s = summarize(run(pattern, kernel, scale))
    assert s is not None
    return {f.classification for f in transfer_findings(s, get_device_spec(A100), {})}


def test_healthy_step_has_no_finding() -> None:
    # 1 MiB each way from pinned memory on two streams, under a 0.8 ms transpose.
    assert classes(HostPattern(MIB, MIB, pinned=True, streams=2)) == set()


def test_large_pageable_copies_on_one_stream() -> None:
    found = classes(HostPattern(64 * MIB, 16 * MIB, pinned=False, streams=1))
    assert found == {"transfer_bound", "pageable_copies", "no_overlap"}


def test_pinned_copies_on_one_stream_do_not_overlap() -> None:
    found = classes(HostPattern(4 * MIB, 4 * MIB, pinned=True, streams=1))
    assert found == {"no_overlap"}


def test_short_kernels_behind_long_host_gaps_are_launch_bound() -> None:
    assert classes(HostPattern(), kernel="transpose", scale=1e-4) == {"launch_bound"}
    # The same kernels issued 16 at a time (a CUDA graph) are not.
    assert classes(HostPattern(batch=16), kernel="transpose", scale=1e-4) == set()


def test_synchronize_after_every_launch() -> None:
    assert "host_sync" in classes(HostPattern(sync_every=1), kernel="transpose", scale=1e-4)
    assert "host_sync" not in classes(HostPattern(sync_every=8), kernel="transpose", scale=1e-4)


def test_transfer_bound_evidence_is_achieved_against_peak_link_bandwidth() -> None:
    s = summarize(run(HostPattern(64 * MIB, 0, pinned=True)))
    assert s is not None
    (bound,) = [
        f
        for f in transfer_findings(s, get_device_spec(A100), {})
        if f.classification == "transfer_bound"
    ]
    assert bound.evidence["h2d_peak_gbs"] == 31.5  # PCIe 4.0 x16, per direction
    # the sim's pinned copies run at 85% of the link
    assert bound.evidence["h2d_gbs"] == pytest.approx(0.85 * 31.5, rel=0.01)
    # 64 MiB at 26.8 GB/s is 2.5 ms against a 0.8 ms kernel and a 10 us gap
    assert float(bound.evidence["copy_share"]) == pytest.approx(2.50 / 3.31, abs=0.01)


def test_pinned_buffers_gain_what_the_pageable_finding_expected() -> None:
    before = summarize(run(HostPattern(32 * MIB, 8 * MIB, pinned=False)))
    assert before is not None
    space = SearchSpace("t", {"pinned": (0, 1), "streams": (1, 2, 4)}, {"pinned": 0, "streams": 1})
    found = {
        f.classification: f
        for f in transfer_findings(
            before, get_device_spec(A100), {"pinned": 0, "streams": 1}, space
        )
    }
    pageable = found["pageable_copies"]
    assert pageable.knob == {"pinned": 1, "streams": 1}
    assert found["no_overlap"].knob == {"pinned": 0, "streams": 2}
    after = summarize(run(HostPattern(32 * MIB, 8 * MIB, pinned=False).with_config(pageable.knob)))
    assert after is not None
    measured = (before.step_us / before.launches) / (after.step_us / after.launches) - 1
    assert measured == pytest.approx(pageable.expected_gain, rel=0.05)
    assert pageable.evidence["h2d_pinned_source"] == "modelled"


def test_knobs_the_kernel_does_not_declare_are_advice() -> None:
    s = summarize(run(HostPattern(64 * MIB, 0, pinned=False)))
    assert s is not None
    for f in transfer_findings(s, get_device_spec(A100), {"tile": 8}):
        assert f.knob is None and f.advice


def test_overlap_is_measured_from_the_timeline() -> None:
    serial = summarize(run(HostPattern(4 * MIB, 4 * MIB, streams=1)))
    double = summarize(run(HostPattern(4 * MIB, 4 * MIB, streams=2)))
    assert serial is not None and double is not None
    # end times travel to 1 us, so back-to-back intervals may touch by a fraction of one
    assert serial.overlap_us / serial.copy_us < 0.001
    assert double.overlap_us / double.copy_us > 0.9


def test_v1_batches_have_no_summary() -> None:
    dev = SimDevice(A100)
    runner = WorkloadRunner(dev, dev.workloads()[:1])
    batcher = LaunchBatcher(dev, "n1")
    for chunk in runner.tick(1.0) + runner.tick(1.1):
        batcher.add(chunk, 1.0)
    cols = [LaunchColumns.from_batch(b.record()) for b in batcher.flush()]
    assert cols and summarize(cols) is None
    assert not math.isnan(len(cols))
