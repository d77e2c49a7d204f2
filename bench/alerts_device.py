"""Device alerts on generated scenarios with a known answer: clocks sagging, memory filling.

Each scenario is a simulated A100's device samples over hours (two per ten-second
window, from :func:`kernels.backends.sim_drift.device_state`, the model a sim node
reports), carried by the launch batches of a flat kernel. The batches go through the
windower, the detector and the forecaster exactly as the worker runs them, so the
windows' device aggregates are the real ones. Because the drift is generated, the
moment the noise-free clock reaches ``clock_sag_fraction`` of the boost clock (or
memory ``memory_fill_fraction`` of the total) is known; each run says how long before
it the first alert of that metric came (``lead_s``), whether it was missed, and how
many device alerts were false (raised on a series that never crosses, before a drift
began, or before a step).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.forecast import Forecaster, ForecastSettings
from kernelstream.agents.logic.windowing import Windower, WindowSpec, make_example_batch
from kernelstream.kernels.backends.sim_drift import DeviceDrift, device_state
from kernelstream.kernels.devices import clocks_memory, get_device_spec
from kernelstream.schemas import Alert, DeviceSample, LaunchBatch

__all__ = ["DEVICE_SCENARIOS", "DeviceScenario", "run_device_scenario", "summarize_device"]

_H = 3600.0
_T0 = 1_700_000_000.0
_MODEL = "A100-SXM4-80GB"
_CLOCK = "sm_clock_mean_mhz"
_MEMORY = "mem_used_max_bytes"
_SAMPLE_S = 5.0


@dataclass(frozen=True)
class DeviceScenario:
    """A drift of one device, its length, and the metric that crosses (None: none)."""

    name: str
    hours: float
    drift: DeviceDrift
    crosses: str | None

    @property
    def quiet_h(self) -> float:
        """Hours during which any device alert is false."""
        if self.crosses is None:
            return self.hours
        return min(self.drift.start_h, self.drift.step_h) - 0.1


DEVICE_SCENARIOS: tuple[DeviceScenario, ...] = (
    DeviceScenario("clock sag 5%/h", 6.0, DeviceDrift(clock_sag_per_h=0.05, start_h=1.0), _CLOCK),
    DeviceScenario("clock sag 20%/h", 3.0, DeviceDrift(clock_sag_per_h=0.2, start_h=1.0), _CLOCK),
    DeviceScenario("memory leak 10%/h", 9.0, DeviceDrift(memory_per_h=0.1, start_h=1.0), _MEMORY),
    DeviceScenario("memory leak 40%/h", 4.0, DeviceDrift(memory_per_h=0.4, start_h=1.0), _MEMORY),
    DeviceScenario(
        "clock step -10% (stays above)", 6.0, DeviceDrift(clock_step=0.1, step_h=1.0), None
    ),
    DeviceScenario(
        "memory step +30% (stays below)", 6.0, DeviceDrift(memory_step=0.3, step_h=1.0), None
    ),
    DeviceScenario("noise only", 24.0, DeviceDrift(), None),
    DeviceScenario("noise only, clock 3%", 24.0, DeviceDrift(clock_cv=0.03, memory_cv=0.01), None),
)


def _batches(sc: DeviceScenario, seed: int, window_s: float) -> Iterator[LaunchBatch]:
    """One batch of ten launches per window, carrying the samples taken in it."""
    spec = get_device_spec(_MODEL)
    rng = np.random.default_rng(seed)
    per = max(int(window_s / _SAMPLE_S), 1)
    for i in range(int(sc.hours * _H / window_s)):
        start = _T0 + i * window_s
        times = [start + (k + 0.5) * window_s / per for k in range(per)]
        samples = [
            DeviceSample(t=t, **device_state(spec, sc.drift, (t - _T0) / _H, rng)) for t in times
        ]
        launches = [start + (k + 0.5) * window_s / 10 for k in range(10)]
        durations = (100.0 * (1 + 0.03 * rng.standard_normal(10))).tolist()
        yield make_example_batch(launches, durations, samples=samples, seq_start=i * 10)


def _true_crossing_h(sc: DeviceScenario, settings: ForecastSettings) -> float | None:
    """When the noise-free clock or memory reaches its threshold (None: never)."""
    if sc.crosses is None:
        return None
    quiet = DeviceDrift(**{**sc.drift.__dict__, "clock_cv": 0.0, "memory_cv": 0.0})
    boost, memory, _ = clocks_memory(_MODEL)
    spec, rng = get_device_spec(_MODEL), np.random.default_rng(0)
    for h in np.arange(0.0, sc.hours, 1 / 360):
        s = device_state(spec, quiet, float(h), rng)
        if (sc.crosses == _CLOCK and s["sm_clock_mhz"] <= settings.clock_sag_fraction * boost) or (
            sc.crosses == _MEMORY and s["mem_used_bytes"] >= settings.memory_fill_fraction * memory
        ):
            return float(h)
    return None


def run_device_scenario(
    sc: DeviceScenario, seed: int, window_s: float = 10.0, settings: ForecastSettings | None = None
) -> dict[str, Any]:
    """Feed one scenario through windower, detector and forecaster; score its device alerts."""
    settings = settings or ForecastSettings()
    windower = Windower(WindowSpec(size_s=window_s, idle_timeout_s=3 * window_s))
    detector, forecaster = Detector(), Forecaster(settings)
    alerts: list[Alert] = []
    for batch in _batches(sc, seed, window_s):
        windower.add(batch, batch.t_end[-1])
        for agg in windower.poll(batch.t_end[-1]):
            alerts += forecaster.observe(detector.classify(agg))[0]
    for agg in windower.flush_all():
        alerts += forecaster.observe(detector.classify(agg))[0]
    raised = [
        (a.metric, (a.at - _T0) / _H) for a in alerts if a.scope == "device" and a.state == "raised"
    ]
    crossing = _true_crossing_h(sc, settings)
    right = [h for m, h in raised if m == sc.crosses and crossing is not None and h < crossing]
    false = sum(1 for m, h in raised if h < sc.quiet_h or m != sc.crosses)
    return {
        "name": sc.name,
        "seed": seed,
        "raised": raised,
        "withdrawn": sum(a.scope == "device" and a.state == "withdrawn" for a in alerts),
        "lead_s": (crossing - right[0]) * _H if right and crossing is not None else None,
        "missed": sc.crosses is not None and not right,
        "false": false,
    }


def summarize_device(results: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
    """Per scenario: median and least lead, misses, false alarms; and the table."""
    lines = [
        f"{'device scenario':34} {'runs':>4} {'lead med':>9} {'lead min':>9} {'missed':>6} "
        f"{'false':>5} {'raised':>6}"
    ]
    quiet_h = 0.0
    for sc in DEVICE_SCENARIOS:
        rs = [r for r in results if r["name"] == sc.name]
        leads = [r["lead_s"] / 60 for r in rs if r["lead_s"] is not None]
        quiet_h += sc.quiet_h * len(rs)
        med = f"{np.median(leads):7.0f} m" if leads else "      -  "
        least = f"{min(leads):7.0f} m" if leads else "      -  "
        lines.append(
            f"{sc.name:34} {len(rs):4d} {med:>9} {least:>9} {sum(r['missed'] for r in rs):6d} "
            f"{sum(r['false'] for r in rs):5d} {sum(len(r['raised']) for r in rs):6d}"
        )
    false = sum(r["false"] for r in results)
    missed = sum(r["missed"] for r in results)
    crossing = {sc.name for sc in DEVICE_SCENARIOS if sc.crosses is not None}
    drifts = sum(1 for r in results if r["name"] in crossing)
    summary = {
        "false_per_h": false / quiet_h,
        "quiet_h": quiet_h,
        "missed": missed,
        "drifts": drifts,
    }
    lines.append(
        f"device false alarms: {summary['false_per_h']:.3f} per hour over {quiet_h:.0f} quiet "
        f"device-hours (target < 0.1); missed: {missed} of {drifts} (target 0)"
    )
    return summary, "\n".join(lines)
