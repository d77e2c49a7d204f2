"""Device alerts: window aggregates of device samples, clock sag and memory fill forecasts."""

from __future__ import annotations

import orjson
import pytest

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.forecast import Forecaster
from kernelstream.agents.logic.windowing import Windower, WindowSpec, make_example_batch
from kernelstream.bench.alerts_device import DEVICE_SCENARIOS, run_device_scenario
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.backends.sim_drift import DeviceDrift
from kernelstream.kernels.devices import clocks_memory
from kernelstream.schemas import Alert, DeviceSample, SchemaError, WindowAggregate, decode, encode

_BY_NAME = {sc.name: sc for sc in DEVICE_SCENARIOS}
_GIB = float(1 << 30)


def _one_window(samples: list[DeviceSample], t: list[float] | None = None) -> WindowAggregate:
    w = Windower(WindowSpec(size_s=10.0))
    w.add(make_example_batch(t or [1.0, 2.0, 3.0], samples=samples), now=0.0)
    (agg,) = w.flush_all()
    return agg


# -- aggregation ----------------------------------------------------------------------


def test_a_window_aggregates_the_samples_of_its_batches() -> None:
    agg = _one_window(
        [
            DeviceSample(t=1.5, sm_clock_mhz=1400.0, mem_used_bytes=10 * _GIB),
            DeviceSample(t=2.5, sm_clock_mhz=1200.0, mem_used_bytes=12 * _GIB),
            DeviceSample(t=2.8, mem_used_bytes=11 * _GIB),  # NVML gave no clock this time
        ]
    )
    assert agg.schema_ == "ks.window/2"
    assert agg.device_samples == 3
    assert agg.sm_clock_mean_mhz == pytest.approx(1300.0)
    assert agg.mem_used_max_bytes == 12 * _GIB


def test_a_window_without_samples_has_no_device_fields() -> None:
    agg = _one_window([])
    assert (agg.device_samples, agg.sm_clock_mean_mhz, agg.mem_used_max_bytes) == (None,) * 3


def test_a_sample_outside_the_stream_open_windows_goes_to_its_latest_window() -> None:
    w = Windower(WindowSpec(size_s=1.0))
    batch = make_example_batch([0.1, 1.5], samples=[DeviceSample(t=7.0, sm_clock_mhz=900.0)])
    w.add(batch, now=0.0)
    first, second = w.flush_all()
    assert first.device_samples is None
    assert (second.device_samples, second.sm_clock_mean_mhz) == (1, 900.0)


def test_device_samples_survive_a_snapshot_and_restore() -> None:
    w = Windower(WindowSpec(size_s=10.0))
    sample = DeviceSample(t=1.5, sm_clock_mhz=1400.0, mem_used_bytes=10 * _GIB)
    w.add(make_example_batch([1.0], samples=[sample]), now=0.0)
    snapshot = orjson.loads(orjson.dumps(w.snapshot()))
    (agg,) = Windower.restore(snapshot).flush_all()
    assert (agg.device_samples, agg.sm_clock_mean_mhz, agg.mem_used_max_bytes) == (
        1,
        1400.0,
        10 * _GIB,
    )


def test_a_version_1_window_stays_valid_and_cannot_carry_device_fields() -> None:
    agg = _one_window([DeviceSample(t=1.5, sm_clock_mhz=1400.0)])
    old = agg.to_wire() | {"schema": "ks.window/1"}
    for name in ("device_samples", "sm_clock_mean_mhz", "mem_used_max_bytes"):
        old.pop(name)
    assert decode(orjson.dumps(old), WindowAggregate).device_samples is None
    with pytest.raises(SchemaError, match="added in /2"):
        decode(orjson.dumps(old | {"sm_clock_mean_mhz": 1400.0}), WindowAggregate)


def test_the_finding_carries_the_device_state_for_the_alert_agent() -> None:
    agg = _one_window([DeviceSample(t=1.5, sm_clock_mhz=1400.0, mem_used_bytes=10 * _GIB)])
    finding = Detector().classify(agg)
    assert finding.evidence["sm_clock_mean_mhz"] == 1400.0
    assert finding.evidence["mem_used_max_bytes"] == 10 * _GIB


# -- bad input (real sizes: a 10,000-launch batch with the 1,000 samples allowed) -----------


def _wire_batch(samples: list[dict[str, float]]) -> bytes:
    n = 10_000
    batch = make_example_batch([1.0 + i * 1e-4 for i in range(n)])
    return orjson.dumps(batch.to_wire() | {"samples": samples})


def _good_samples() -> list[dict[str, float]]:
    return [
        {"t": 1.0 + i * 1e-3, "sm_clock_mhz": 1400.0, "mem_used_bytes": 1e10} for i in range(1000)
    ]


def test_good_samples_at_their_limit_are_accepted() -> None:
    from kernelstream.schemas import LaunchBatch

    assert len(decode(_wire_batch(_good_samples()), LaunchBatch).samples) == 1000


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"mem_used_bytes": -1.0}, "greater than or equal to 0"),
        ({"sm_clock_mhz": 1e12}, "less than or equal to 10000"),
        ({"mem_used_bytes": 1e18}, "less than or equal to"),
        ({"t": 0.5}, "not in time order"),
    ],
)
def test_impossible_samples_are_refused_by_the_schema(change: dict[str, float], said: str) -> None:
    from kernelstream.schemas import LaunchBatch

    samples = _good_samples()
    samples[500] = samples[500] | change
    with pytest.raises(SchemaError, match=said):
        decode(_wire_batch(samples), LaunchBatch)


def test_memory_used_beyond_the_device_total_is_refused_with_a_reason() -> None:
    total = clocks_memory("A100-SXM4-80GB")[1]
    agg = _one_window([DeviceSample(t=1.5, mem_used_bytes=total + 1.0)])
    alerts, problem = Forecaster().observe(Detector().classify(agg))
    assert alerts == []
    assert problem is not None and problem.code == "out_of_range"
    assert "more than its" in problem.reason


# -- forecasts -------------------------------------------------------------------------------


def test_a_sagging_clock_is_forecast_before_it_crosses() -> None:
    r = run_device_scenario(_BY_NAME["clock sag 5%/h"], seed=1)
    assert not r["missed"] and r["false"] == 0
    assert r["lead_s"] > 20 * 60
    assert [m for m, _ in r["raised"]] == ["sm_clock_mean_mhz"]


def test_a_memory_leak_is_forecast_before_it_fills_the_device() -> None:
    r = run_device_scenario(_BY_NAME["memory leak 10%/h"], seed=2)
    assert not r["missed"] and r["false"] == 0
    assert r["lead_s"] > 20 * 60
    assert [m for m, _ in r["raised"]] == ["mem_used_max_bytes"]


@pytest.mark.parametrize("name", ["noise only, clock 3%", "clock step -10% (stays above)"])
def test_noise_and_a_step_raise_no_device_alert(name: str) -> None:
    r = run_device_scenario(_BY_NAME[name], seed=3)
    assert r["raised"] == []


def _device_findings(drift: DeviceDrift, hours: float, model: str = "A100-SXM4-80GB") -> list:
    """Findings of ten-second windows whose samples follow ``drift`` on ``model``."""
    import numpy as np

    from kernelstream.kernels.backends.sim_drift import device_state
    from kernelstream.kernels.devices import get_device_spec

    spec, rng = get_device_spec("A100-SXM4-80GB"), np.random.default_rng(0)
    detector, out = Detector(), []
    w = Windower(WindowSpec(size_s=10.0))
    for i in range(int(hours * 360)):
        t = 1e9 + i * 10.0
        sample = DeviceSample(t=t + 5, **device_state(spec, drift, i / 360, rng))
        w.add(make_example_batch([t + 5], device_model=model, samples=[sample]), now=t)
        out += [detector.classify(a) for a in w.poll(t + 5)]
    return out


def test_a_device_alert_names_the_device_and_is_withdrawn_when_the_leak_stops() -> None:
    leak_then_freed = DeviceDrift(
        memory_per_h=0.4, start_h=0.5, stop_h=2.0, memory_step=-0.5, step_h=2.0
    )
    fc, alerts = Forecaster(), []
    for f in _device_findings(leak_then_freed, 4.0):
        alerts += fc.observe(f)[0]
    raised = [a for a in alerts if a.state == "raised"]
    assert raised and all(a.scope == "device" for a in raised)
    first = raised[0]
    assert (first.key, first.node, first.device_index) == ("n1:0", "n1", 0)
    assert (first.kernel, first.config_id, first.metric) == (None, None, "mem_used_max_bytes")
    assert first.threshold == pytest.approx(0.95 * 80 * _GIB)
    assert first.slope_per_h > 0 and "memory used" in first.summary
    assert any(a.state == "withdrawn" and a.id == first.id for a in alerts)
    assert decode(encode(first), Alert) == first


def test_an_unknown_device_model_raises_no_device_alert() -> None:
    fc = Forecaster()
    sag = DeviceDrift(clock_sag_per_h=0.2, start_h=0.5)
    alerts = [a for f in _device_findings(sag, 3.0, "Mystery GPU") for a in fc.observe(f)[0]]
    assert alerts == []


def test_a_clock_alert_reports_clock_units_not_negated_ones() -> None:
    fc = Forecaster()
    sag = DeviceDrift(clock_sag_per_h=0.1, start_h=0.5)
    alerts = [a for f in _device_findings(sag, 3.0) for a in fc.observe(f)[0]]
    first = next(a for a in alerts if a.state == "raised")
    assert first.metric == "sm_clock_mean_mhz"
    assert first.threshold == pytest.approx(0.8 * 1410.0)
    assert first.threshold < first.level < 1410.0 * 1.05
    assert first.slope_per_h < 0


def test_alert_versions() -> None:
    agg_alert = dict(
        id="device|n1:0|sm_clock_mean_mhz|1.000",
        state="raised",
        scope="device",
        key="n1:0",
        metric="sm_clock_mean_mhz",
        device_model="A100-SXM4-80GB",
        baseline=1400.0,
        threshold=1128.0,
        level=1300.0,
        slope_per_h=-50.0,
        confidence=0.99,
        points=40,
        at=1.0,
        summary="s",
    )
    assert Alert.model_validate(agg_alert).schema_ == "ks.alert/2"
    with pytest.raises(ValueError, match="added in /2"):
        Alert.model_validate(agg_alert | {"schema": "ks.alert/1"})
    with pytest.raises(ValueError, match="names its kernel"):
        Alert.model_validate(agg_alert | {"scope": "stream"})


# -- sim -------------------------------------------------------------------------------------


def test_a_sim_device_reports_its_clock_and_memory_and_can_drift() -> None:
    flat = SimDevice("A100-SXM4-80GB").sample()
    assert flat is not None
    assert 0.9 * 1410 < flat["sm_clock_mhz"] <= 1410.0
    assert flat["mem_used_bytes"] == pytest.approx(0.2 * 80 * _GIB, rel=0.05)
    sagged = SimDevice("A100-SXM4-80GB", drift=DeviceDrift(clock_step=0.5, step_h=0.0)).sample()
    assert sagged is not None and sagged["sm_clock_mhz"] < 0.6 * 1410
    assert "sm_clock_mhz" not in (SimDevice("T4").sample() or {})


def test_a_sim_node_drifts_as_its_setting_says() -> None:
    from kernelstream.app.node.runtime import _open
    from kernelstream.app.settings import Settings

    settings = Settings(sim_drift='{"clock_step": 0.5, "step_h": 0}')
    device, _ = _open(settings)
    sample = device.sample()
    assert sample is not None and sample["sm_clock_mhz"] < 0.6 * 1410


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{", "not JSON"),
        ("[1]", "JSON object"),
        ('{"clock_sag": 0.1}', "unknown fields"),
        ('{"memory_per_h": "fast"}', "finite numbers"),
        ('{"memory_per_h": true}', "finite numbers"),
        ('{"memory_per_h": NaN}', "finite numbers"),
    ],
)
def test_a_bad_sim_drift_setting_says_what_is_wrong(text: str, said: str) -> None:
    from pydantic import ValidationError

    from kernelstream.app.settings import Settings

    with pytest.raises(ValidationError, match=said):
        Settings(sim_drift=text)
