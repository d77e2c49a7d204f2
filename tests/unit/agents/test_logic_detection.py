"""Roofline classification on hand-made window aggregates."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kernelstream.agents.logic.detection import Detector, DetectorThresholds, finding_id
from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.schemas.records import WindowAggregate

# Ridge point of this device: 20000 / 2000 = 10 FLOP/B.
PEAK_GBS, PEAK_GFLOPS = 2000.0, 20000.0


def agg(**over: Any) -> WindowAggregate:
    base: dict[str, Any] = {
        "node": "n1",
        "device_index": 0,
        "device_model": "A100",
        "kernel": "k",
        "workload": "k",
        "problem_size": [1024],
        "config": {"block": 128},
        "config_id": "block=128",
        "window_start": 10.0,
        "window_end": 11.0,
        "count": 100,
        "failures": 0,
        "duration_mean_us": 100.0,
        "duration_p50_us": 100.0,
        "duration_p95_us": 110.0,
        "duration_min_us": 90.0,
        "duration_max_us": 120.0,
        "duration_std_us": 5.0,
        "busy_fraction": 0.9,
        "idle_gap_mean_us": 2.0,
        "achieved_gbs": 1600.0,
        "achieved_gflops": 400.0,
        "bw_fraction": 0.8,
        "flops_fraction": 0.02,
        "arithmetic_intensity": 0.25,
        "occupancy": 1.0,
        "waves": 8.0,
        "peak_gbs": PEAK_GBS,
        "peak_gflops": PEAK_GFLOPS,
        "launch_overhead_us": 3.0,
        "seq_min": 0,
        "seq_max": 99,
    }
    base.update(over)
    return WindowAggregate(**base)


COMPUTE = {"arithmetic_intensity": 50.0, "bw_fraction": 0.3}


@pytest.mark.parametrize(
    ("over", "expected", "evidence_key"),
    [
        ({}, "memory_efficient", "bw_fraction"),
        ({"bw_fraction": 0.2}, "memory_bottleneck", "arithmetic_intensity"),
        ({**COMPUTE, "flops_fraction": 0.7}, "compute_bound", "flops_fraction"),
        ({**COMPUTE, "flops_fraction": 0.3}, "balanced", "ridge_point"),
        ({"duration_mean_us": 5.0}, "launch_bound", "launch_overhead_us"),
        ({"bw_fraction": 0.2, "waves": 0.4}, "under_utilization", "waves"),
        ({"bw_fraction": 0.2, "waves": 2.25}, "under_utilization", "tail_fraction"),
        ({"bw_fraction": 0.2, "occupancy": 0.125}, "under_utilization", "occupancy"),
        (
            {"bw_fraction": 0.2, "busy_fraction": 0.1, "idle_gap_mean_us": 900.0},
            "under_utilization",
            "idle_gap_mean_us",
        ),
        ({**COMPUTE, "flops_fraction": 0.1, "waves": 0.5}, "under_utilization", "waves"),
        ({"count": 0, "failures": 5, "duration_mean_us": 0.0}, "balanced", "failures"),
    ],
)
def test_classifications(over: dict[str, Any], expected: str, evidence_key: str) -> None:
    f = Detector().classify(agg(**over))
    assert f.classification == expected, f.summary
    assert evidence_key in f.evidence
    assert f.evidence["ridge_point"] == 10.0
    assert f.summary.endswith(".") and "k with block=128 on n1:0" in f.summary


def test_efficient_kernel_with_full_tail_is_not_under_utilized() -> None:
    # An integer number of waves has no partial tail.
    f = Detector().classify(agg(bw_fraction=0.2, waves=2.0))
    assert f.classification == "memory_bottleneck"
    assert f.evidence["tail_fraction"] == 0.0


def test_under_utilization_reports_every_cause() -> None:
    f = Detector().classify(agg(bw_fraction=0.1, waves=0.5, occupancy=0.1))
    causes = str(f.evidence["underuse_causes"])
    assert "waves" in causes and "occupancy" in causes


def test_finding_is_deterministic_and_carries_measurement() -> None:
    a, b = Detector().classify(agg()), Detector().classify(agg())
    assert a == b
    assert a.id == "n1:0/k/block=128/10.000000" == finding_id(agg()) == Detector().finding_id(agg())
    assert (a.count, a.failures, a.duration_mean_us) == (100, 0, 100.0)


def test_regression_against_own_baseline() -> None:
    d = Detector(DetectorThresholds(baseline_windows=2))
    for w in range(2):
        assert d.classify(agg(window_start=float(w))).classification == "memory_efficient"
    ok = d.classify(agg(window_start=2.0, duration_mean_us=115.0))
    assert ok.classification == "memory_efficient"
    assert ok.evidence["baseline_us"] == 100.0
    slow = d.classify(agg(window_start=3.0, duration_mean_us=130.0, bw_fraction=0.6))
    assert slow.classification == "regression"
    assert slow.evidence["regression_ratio"] == pytest.approx(1.3)
    # Baselines are per config: another config starts its own.
    other = d.classify(agg(config_id="block=256", duration_mean_us=130.0))
    assert other.classification == "memory_efficient"
    # Windows with too few launches neither build nor trigger a baseline.
    few = d.classify(agg(window_start=4.0, count=3, duration_mean_us=500.0))
    assert few.classification != "regression"


def test_gpu_without_known_peaks_is_not_placed_on_a_roofline() -> None:
    # What a trace file from a GPU missing in kernels/devices.py produces (DeviceSpec.unknown).
    unknown: dict[str, Any] = {"peak_gbs": 0.0, "peak_gflops": 0.0, "bw_fraction": 0.0}
    unknown |= {"flops_fraction": 0.0}
    unknown |= {"occupancy": 0.0, "waves": 0.0, "device_model": "AMD Instinct MI250X"}
    d = Detector(DetectorThresholds(baseline_windows=1))
    f = d.classify(agg(**unknown))
    assert f.classification == "roofline_unknown"
    assert f.evidence["roofline_known"] is False and f.evidence["ridge_point"] == 0.0
    assert "no datasheet peaks of AMD Instinct MI250X" in f.summary
    # Launch-bound and regression verdicts need no roofline and still come.
    assert d.classify(agg(**unknown, duration_mean_us=2.0)).classification == "launch_bound"
    slow = d.classify(agg(**unknown, window_start=12.0, duration_mean_us=150.0))
    assert slow.classification == "regression"
    assert Detector().classify(agg()).evidence["roofline_known"] is True


def test_snapshot_restore_keeps_baselines() -> None:
    d = Detector(DetectorThresholds(baseline_windows=1))
    d.classify(agg())
    r = Detector.restore(json.loads(json.dumps(d.snapshot())))
    assert r.classify(agg(duration_mean_us=200.0)).classification == "regression"
    assert r.snapshot() == d.snapshot() | {"baselines": r.snapshot()["baselines"]}
    with pytest.raises(SnapshotError):
        Detector.restore({"version": 0})


def test_thresholds_validated() -> None:
    with pytest.raises(LogicSettingsError, match="regression_factor"):
        DetectorThresholds(regression_factor=0.9)
    with pytest.raises(LogicSettingsError, match="min_occupancy"):
        DetectorThresholds(min_occupancy=-0.1)


def test_findings_say_where_the_occupancy_came_from() -> None:
    compiled = Detector().classify(
        agg(bw_fraction=0.1, occupancy=0.1, resources_source="nvrtc 12.9 sm_90")
    )
    assert compiled.classification == "under_utilization"
    assert compiled.evidence["occupancy_source"] == "nvrtc 12.9 sm_90"
    assert "occupancy 10% (registers and shared memory: nvrtc 12.9 sm_90)" in compiled.summary
    # a window from a producer that does not say (older nodes): the estimate
    older = Detector().classify(agg(bw_fraction=0.1, occupancy=0.1))
    assert older.evidence["occupancy_source"] == "estimate"


_CASES = [
    {},
    {"bw_fraction": 0.2},
    {**COMPUTE, "flops_fraction": 0.7},
    {**COMPUTE, "flops_fraction": 0.3},
    {"duration_mean_us": 5.0},
    {"bw_fraction": 0.2, "waves": 0.4, "occupancy": 0.1},
    {"count": 0, "failures": 5, "duration_mean_us": 0.0},
    {"peak_gbs": 0.0, "peak_gflops": 0.0},
    {"resources_source": "nvrtc 12.9 sm_90", "config": {"block": 128, "unroll": True}},
    {
        "schema": "ks.window/2",
        "sm_clock_mean_mhz": 1410.0,
        "mem_used_max_bytes": 3.2e9,
        "node": "ノード-1",
        "kernel": 'k"quoted\\',
    },
]


@pytest.mark.parametrize("over", _CASES)
def test_the_published_bytes_are_the_records(over: dict[str, Any]) -> None:
    """classify_wire writes the finding without its record: the bytes encode gives the
    record, the same classification, window after window (baselines forming, then a
    regression judged against them)."""
    from kernelstream.schemas import Finding, decode, encode

    by_record, by_wire = (
        Detector(DetectorThresholds(baseline_windows=2)),
        Detector(DetectorThresholds(baseline_windows=2)),
    )
    for w, mean in enumerate([100.0, 100.0, 100.0, 300.0]):
        window = {"window_start": 10.0 + w, "window_end": 11.0 + w}
        a = agg(**({"duration_mean_us": mean} | window | over))
        record = by_record.classify(a)
        classification, value = by_wire.classify_wire(a)
        assert value == encode(record)
        assert classification == record.classification
        assert decode(value, Finding) == record


def test_a_finding_with_a_number_that_is_not_finite_is_refused_either_way() -> None:
    from pydantic import ValidationError

    from kernelstream.schemas import Finding

    a = agg()
    evidence: dict[str, float | int | str | bool] = {"ratio": float("inf")}
    kw: dict[str, Any] = {"id": "x", "classification": "balanced", "summary": "s."}
    with pytest.raises(ValidationError):
        Finding.of_window(a, evidence=evidence, **kw)
    with pytest.raises(ValidationError):
        Finding.wire_of_window(a, evidence=evidence, **kw)
