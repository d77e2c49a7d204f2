"""Predictive alerts on generated window series with a known answer.

Each scenario is a kernel's mean duration per window over hours: a flat baseline
with noise, then a slow drift, a step, a reversal, a daily-like seasonal swing or
nothing at all. The windows go through the detector (which sets the baseline the
threshold is relative to) and the forecaster exactly as the worker runs them
(:mod:`agents.logic.detection`, :mod:`agents.logic.forecast`). Because the series
are generated, the moment the true mean crosses the regression threshold is known,
so each scenario says:

- ``lead_s``: how long before the true crossing the first alert was raised
  (drifts; a missed drift is one with no alert before its crossing);
- ``false``: alerts raised on a series whose true mean never crosses (noise,
  seasonal, a step below the threshold, a reversal) or, for a step above it, raised
  before the step; ``false_per_h`` divides by the hours of such series;
- ``withdrawn``: whether an alert raised on a reversing trend was withdrawn;
- and how many findings per second the forecaster takes on one core.

Device scenarios (:mod:`bench.alerts_device`) do the same for a device's SM clock
sagging and its memory filling.

    kernelstream bench alerts [--seeds 5] [--window-s 10]
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.forecast import Forecaster, ForecastSettings
from kernelstream.agents.logic.windowing import Windower, WindowSpec, make_example_batch
from kernelstream.bench.alerts_device import (
    DEVICE_SCENARIOS,
    run_device_scenario,
    summarize_device,
)
from kernelstream.bench.results import dated_stem
from kernelstream.schemas import Alert, WindowAggregate

__all__ = [
    "SCENARIOS",
    "Scenario",
    "ScenarioResult",
    "command",
    "run_scenario",
    "summarize",
    "windows_of",
]

_H = 3600.0
_BASE_US = 100.0
_T0 = 1_700_000_000.0


@dataclass(frozen=True)
class Scenario:
    """A generated series: ``mean(t)`` relative to the baseline, noise, length, answer."""

    name: str
    hours: float
    mean: Callable[[np.ndarray], np.ndarray]  # hours since start -> multiple of baseline
    crossing_h: float | None  # when the true mean first reaches the threshold; None: never
    noise_cv: float = 0.03
    outliers: float = 0.0  # share of windows 1.5x slower (a noisy neighbour)
    step_h: float | None = None  # a step: alerts before it are false


def _ramp(start_h: float, per_h: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda h: 1.0 + per_h * np.clip(h - start_h, 0.0, None)


def _step(at_h: float, size: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda h: np.where(h >= at_h, 1.0 + size, 1.0)


def _reverse(start_h: float, peak_h: float, per_h: float) -> Callable[[np.ndarray], np.ndarray]:
    def f(h: np.ndarray) -> np.ndarray:
        up = np.clip(h - start_h, 0.0, peak_h - start_h)
        down = np.clip(h - peak_h, 0.0, None)
        return 1.0 + per_h * up - per_h * down

    return f


def _seasonal(amplitude: float, period_h: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda h: 1.0 + amplitude * np.sin(2 * math.pi * h / period_h)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("drift 10%/h", 4.0, _ramp(1.0, 0.10), crossing_h=3.0),
    Scenario("drift 40%/h", 2.0, _ramp(1.0, 0.40), crossing_h=1.5),
    Scenario("drift 4%/h", 7.0, _ramp(1.0, 0.04), crossing_h=6.0),
    Scenario("drift 10%/h, noise 8%", 4.0, _ramp(1.0, 0.10), crossing_h=3.0, noise_cv=0.08),
    Scenario("step +10% (stays below)", 4.0, _step(1.0, 0.10), crossing_h=None, step_h=1.0),
    Scenario("step +40% (no warning possible)", 3.0, _step(1.0, 0.40), 1.0, step_h=1.0),
    Scenario("rise 10%/h then reverse", 4.0, _reverse(1.0, 2.7, 0.10), crossing_h=None),
    Scenario("noise only 3%", 24.0, lambda h: np.ones_like(h), crossing_h=None),
    Scenario("noise only 8% + outliers", 24.0, lambda h: np.ones_like(h), None, 0.08, 0.01),
    Scenario("seasonal 8%, 1 h period", 24.0, _seasonal(0.08, 1.0), crossing_h=None),
    Scenario("seasonal 12%, 6 h period", 24.0, _seasonal(0.12, 6.0), crossing_h=None),
)


def _template() -> WindowAggregate:
    batch = make_example_batch([_T0 + 0.5], [_BASE_US], kernel="saxpy")
    windower = Windower(WindowSpec(size_s=1.0))
    windower.add(batch, _T0)
    (agg,) = windower.flush_all()
    return agg


def windows_of(
    sc: Scenario, seed: int, window_s: float, node: str = "n1"
) -> Iterator[WindowAggregate]:
    """The scenario's windows of one node, in event-time order."""
    rng = np.random.default_rng(seed)
    n = int(sc.hours * _H / window_s)
    hours = np.arange(n) * window_s / _H
    means = _BASE_US * sc.mean(hours) * (1.0 + sc.noise_cv * rng.standard_normal(n))
    if sc.outliers:
        means = np.where(rng.random(n) < sc.outliers, means * 1.5, means)
    base = _template().model_copy(update={"node": node})
    for i, mean in enumerate(np.maximum(means, 1.0)):
        start = _T0 + i * window_s
        yield base.model_copy(
            update={
                "window_start": start,
                "window_end": start + window_s,
                "duration_mean_us": float(mean),
                "count": 100,
                "seq_min": i * 100,
                "seq_max": i * 100 + 99,
            }
        )


@dataclass
class ScenarioResult:
    """What the forecaster did on one run of one scenario."""

    name: str
    seed: int
    hours: float
    raised: list[float]  # hours since start of each raised alert
    withdrawn: int
    crossed: int
    lead_s: float | None  # before the true crossing (drifts)
    missed: bool
    false: int

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def run_scenario(
    sc: Scenario, seed: int, window_s: float = 10.0, settings: ForecastSettings | None = None
) -> ScenarioResult:
    """Feed one scenario through the detector and the forecaster; score the alerts."""
    detector, forecaster = Detector(), Forecaster(settings)
    alerts: list[Alert] = []
    baseline = None
    for agg in windows_of(sc, seed, window_s):
        finding = detector.classify(agg)
        baseline = finding.evidence.get("baseline_us", baseline)
        out, _ = forecaster.observe(finding)
        alerts += out
    raised = [(a.at - _T0) / _H for a in alerts if a.state == "raised"]
    lead = missed = None
    false = 0
    if sc.crossing_h is not None and sc.step_h is None:
        crossing_h = _true_crossing_h(sc, float(baseline or _BASE_US), forecaster)
        before = [h for h in raised if h < crossing_h]
        missed = not before
        lead = (crossing_h - before[0]) * _H if before else None
        false = sum(1 for h in raised if h < 0.9)  # before any drift began (at 1 h)
    elif sc.step_h is not None:
        cut = sc.step_h if sc.crossing_h is not None else math.inf
        false = sum(1 for h in raised if h < cut)
    elif sc.name.startswith("rise"):
        false = 0  # the trend was real while it rose; what counts is its withdrawal
    else:
        false = len(raised)
    return ScenarioResult(
        sc.name,
        seed,
        sc.hours,
        raised,
        sum(a.state == "withdrawn" for a in alerts),
        sum(a.state == "crossed" for a in alerts),
        lead,
        bool(missed),
        false,
    )


def throughput(streams: int = 20, hours: float = 1.0) -> dict[str, float]:
    """Findings per second through :meth:`Forecaster.observe` (one core): ``streams``
    devices running one kernel each, one-second windows (the worker's default), one
    fleet group, fed in event-time order as a worker owning the group sees them."""
    sc = SCENARIOS[0]
    findings = []
    for i in range(streams):
        detector = Detector()
        n = int(hours * _H)
        findings += [detector.classify(w) for w in windows_of(sc, i, 1.0, f"n{i}")][:n]
    findings.sort(key=lambda f: (f.window_end, f.id))
    forecaster = Forecaster()
    t0 = time.perf_counter()
    for f in findings:
        forecaster.observe(f)
    wall = time.perf_counter() - t0
    return {"findings": len(findings), "wall_s": wall, "findings_per_s": len(findings) / wall}


def _true_crossing_h(sc: Scenario, baseline_us: float, forecaster: Forecaster) -> float:
    """When the noise-free mean reaches the threshold the detector will apply (its
    baseline, measured on the first noisy windows, times the regression factor)."""
    hours = np.arange(0.0, sc.hours, 1 / 360)
    over = _BASE_US * sc.mean(hours) >= baseline_us * forecaster.settings.threshold_factor
    return float(hours[np.argmax(over)]) if over.any() else sc.hours


def _quiet_hours(sc: Scenario) -> float:
    """Hours of a scenario during which any alert is a false one."""
    if sc.crossing_h is None:
        return 0.0 if sc.name.startswith("rise") else sc.hours
    return sc.step_h if sc.step_h is not None else 0.9


def summarize(results: list[ScenarioResult]) -> dict[str, Any]:
    """Per scenario and overall: leads, misses, false alarms per hour."""
    by: dict[str, list[ScenarioResult]] = {}
    for r in results:
        by.setdefault(r.name, []).append(r)
    rows, quiet_h, false = [], 0.0, 0
    for sc in SCENARIOS:
        rs = by.get(sc.name, [])
        if not rs:
            continue
        leads = [r.lead_s for r in rs if r.lead_s is not None]
        q = _quiet_hours(sc) * len(rs)
        quiet_h += q
        false += sum(r.false for r in rs)
        rows.append(
            {
                "scenario": sc.name,
                "runs": len(rs),
                "lead_min_median": float(np.median(leads)) / 60 if leads else None,
                "lead_min_min": min(leads) / 60 if leads else None,
                "missed": sum(r.missed for r in rs),
                "false": sum(r.false for r in rs),
                "quiet_h": q,
                "raised": sum(len(r.raised) for r in rs),
                "withdrawn": sum(r.withdrawn for r in rs),
                "crossed": sum(r.crossed for r in rs),
            }
        )
    drifts = [r for r in results if r.name.startswith("drift")]
    return {
        "rows": rows,
        "false_per_h": false / quiet_h if quiet_h else 0.0,
        "quiet_h": quiet_h,
        "missed_drifts": sum(r.missed for r in drifts),
        "drifts": len(drifts),
    }


def _table(summary: dict[str, Any]) -> str:
    lines = [
        f"{'scenario':34} {'runs':>4} {'lead med':>9} {'lead min':>9} {'missed':>6} "
        f"{'false':>5} {'raised':>6} {'withdr':>6} {'crossed':>7}"
    ]

    def m(x: float | None) -> str:
        return f"{x:7.0f} m" if x is not None else "      -  "

    for r in summary["rows"]:
        lines.append(
            f"{r['scenario']:34} {r['runs']:4d} {m(r['lead_min_median']):>9} "
            f"{m(r['lead_min_min']):>9} {r['missed']:6d} {r['false']:5d} {r['raised']:6d} "
            f"{r['withdrawn']:6d} {r['crossed']:7d}"
        )
    lines.append(
        f"false alarms: {summary['false_per_h']:.3f} per hour over {summary['quiet_h']:.0f} "
        f"quiet series-hours (target < 0.1); missed drifts: {summary['missed_drifts']} of "
        f"{summary['drifts']} (target 0)"
    )
    return "\n".join(lines)


@click.command("alerts")
@click.option("--seeds", type=int, default=5, show_default=True, help="Runs per scenario.")
@click.option("--window-s", type=float, default=10.0, show_default=True, help="Window length.")
@click.option(
    "--horizon-s",
    type=float,
    default=ForecastSettings().horizon_s,
    show_default=True,
    help="How far ahead a crossing is forecast (the worker's alert_horizon_s).",
)
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bench/results"),
    show_default=True,
)
def command(seeds: int, window_s: float, horizon_s: float, results_dir: Path) -> None:
    """Lead time, missed drifts and false alarms of predictive alerts on known scenarios."""
    settings = ForecastSettings(horizon_s=horizon_s)
    results = [
        run_scenario(sc, seed, window_s, settings) for sc in SCENARIOS for seed in range(seeds)
    ]
    summary = summarize(results)
    device_runs = [
        run_device_scenario(sc, seed, window_s, settings)
        for sc in DEVICE_SCENARIOS
        for seed in range(seeds)
    ]
    device_summary, device_table = summarize_device(device_runs)
    date = datetime.now(UTC).date().isoformat()
    cmd = (
        f"kernelstream bench alerts --seeds {seeds} --window-s {window_s:g} "
        f"--horizon-s {horizon_s:g}"
    )
    speed = throughput()
    text = (
        f"{cmd}\n{_table(summary)}\n{device_table}\n"
        f"forecaster: {speed['findings_per_s']:,.0f} findings/s on one core "
        f"({speed['findings']:,} findings of 20 streams, 1 s windows, one fleet group)\n"
    )
    stem = dated_stem(results_dir, "alerts", date)
    doc = {
        "date": date,
        "command": cmd,
        "settings": settings.__dict__,
        "machine": {"python": platform.python_version()},
        "summary": summary,
        "throughput": speed,
        "runs": [r.as_dict() for r in results],
        "device_summary": device_summary,
        "device_runs": device_runs,
    }
    Path(f"{stem}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    Path(f"{stem}.txt").write_text(text)
    click.echo(text)
