"""Predictive alerts: forecasts over generated window series with a known answer."""

from __future__ import annotations

import math

import pytest

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.errors import LogicSettingsError
from kernelstream.agents.logic.forecast import Forecaster, ForecastSettings
from kernelstream.bench.alerts import SCENARIOS, Scenario, windows_of
from kernelstream.schemas import Alert, Finding, decode, encode

_BY_NAME = {sc.name: sc for sc in SCENARIOS}


def findings(sc: Scenario, seed: int = 0, node: str = "n1") -> list[Finding]:
    detector = Detector()
    return [detector.classify(w) for w in windows_of(sc, seed, 10.0, node)]


def run(fs: list[Finding], fc: Forecaster | None = None) -> list[Alert]:
    fc = fc or Forecaster()
    out: list[Alert] = []
    for f in fs:
        alerts, problem = fc.observe(f)
        assert problem is None
        out += alerts
    return out


def test_a_slow_drift_is_forecast_before_it_crosses_then_crosses() -> None:
    fs = findings(_BY_NAME["drift 10%/h"])
    alerts = run(fs)
    raised = [a for a in alerts if a.state == "raised" and a.scope == "stream"]
    assert raised, "a 10%/h drift raised no alert"
    first = raised[0]
    baseline = float(fs[-1].evidence["baseline_us"])
    assert first.threshold == pytest.approx(baseline * 1.2)
    assert first.lead_s is not None and first.lead_s > 10 * 60
    assert first.predicted_at == pytest.approx(first.at + first.lead_s)
    assert first.confidence >= 0.99
    # The true mean reaches the threshold at 1 h + (1.2 b / 100 - 1) / 0.1 h.
    true_crossing = fs[0].window_start + 3600 * (1 + (1.2 * baseline / 100.0 - 1) / 0.1)
    assert first.at < true_crossing
    assert any(a.state == "crossed" and a.id == first.id for a in alerts)


def test_noise_alone_raises_nothing_over_a_day() -> None:
    assert run(findings(_BY_NAME["noise only 8% + outliers"], seed=3)) == []


def test_a_seasonal_swing_below_the_threshold_raises_nothing() -> None:
    assert run(findings(_BY_NAME["seasonal 8%, 1 h period"], seed=1)) == []


def test_a_step_gives_no_alert_before_it() -> None:
    fs = findings(_BY_NAME["step +40% (no warning possible)"])
    step_t = fs[0].window_start + 3600
    assert [a for a in run(fs) if a.state == "raised" and a.at < step_t] == []


def test_an_alert_is_withdrawn_when_the_trend_reverses() -> None:
    alerts = run(findings(_BY_NAME["rise 10%/h then reverse"]))
    states = [a.state for a in alerts]
    assert states[:2] == ["raised", "withdrawn"]
    assert "the trend" in alerts[1].summary
    assert alerts[1].id == alerts[0].id and alerts[1].lead_s is None


def test_a_fleet_group_alert_needs_two_devices() -> None:
    drift = _BY_NAME["drift 10%/h"]
    one = run(findings(drift, seed=0, node="n1"))
    assert {a.scope for a in one} == {"stream"}
    a, b = findings(drift, seed=0, node="n1"), findings(drift, seed=1, node="n2")
    both = sorted(a + b, key=lambda f: (f.window_end, f.id))
    group = [x for x in run(both) if x.scope == "fleet_group" and x.state == "raised"]
    assert group and group[0].node is None and group[0].key == "A100-SXM4-80GB/saxpy/1048576"


def test_same_findings_same_alerts() -> None:
    fs = findings(_BY_NAME["drift 4%/h"], seed=2)
    assert [encode(a) for a in run(fs)] == [encode(a) for a in run(fs)]


def test_alert_round_trips_through_its_schema() -> None:
    alert = next(a for a in run(findings(_BY_NAME["drift 40%/h"])) if a.state == "raised")
    assert decode(encode(alert), Alert) == alert


# -- input the forecast cannot use ------------------------------------------------------


def _flat(n: int = 200) -> list[Finding]:
    return findings(_BY_NAME["noise only 3%"])[:n]


def test_a_window_without_a_successful_launch_is_refused() -> None:
    fs = _flat(5)
    empty = fs[4].model_copy(update={"count": 3, "failures": 3, "duration_mean_us": 0.0})
    fc = Forecaster()
    for f in fs[:4]:
        fc.observe(f)
    alerts, problem = fc.observe(empty)
    assert alerts == [] and problem is not None and problem.code == "series_gap"
    assert "no successful launch" in problem.reason


def test_a_repeated_or_earlier_window_is_skipped_not_dead_lettered() -> None:
    """A worker restarted from its checkpoint publishes windows again: expected, not bad."""
    fs = _flat(10)
    fc = Forecaster()
    for f in fs:
        fc.observe(f)
    alerts, problem = fc.observe(fs[3])
    assert alerts == [] and problem is None and fc.repeated == 1
    group = fc._series[f"fleet_group|A100-SXM4-80GB/saxpy/1048576|{fs[0].config_id}"]
    assert sum(n for _, n in group.bins.values()) == len(fs)  # not counted there either


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    f = _flat(1)[0]
    bad = f.model_copy(update={"window_end": f.window_start - 1})
    _, problem = Forecaster().observe(bad)
    assert problem is not None and problem.code == "out_of_range"


def test_a_gap_restarts_the_history_and_withdraws_the_alert() -> None:
    fs = findings(_BY_NAME["drift 10%/h"])
    fc = Forecaster()
    alerts: list[Alert] = []
    i = 0
    while not any(a.state == "raised" for a in alerts):
        alerts += fc.observe(fs[i])[0]
        i += 1
    later = fs[i].model_copy(
        update={"window_start": fs[i].window_start + 3600, "window_end": fs[i].window_end + 3600}
    )
    out, problem = fc.observe(later)
    assert problem is not None and problem.code == "series_gap"
    assert [a.state for a in out if a.scope == "stream"] == ["withdrawn"]
    assert fc.active_alerts() == []
    # The next window after the gap starts a new history: no forecast from one point.
    nxt = later.model_copy(
        update={"window_start": later.window_end, "window_end": later.window_end + 10}
    )
    assert fc.observe(nxt) == ([], None)


def test_a_series_that_stops_has_its_alert_withdrawn() -> None:
    drift = findings(_BY_NAME["drift 10%/h"])
    fc = Forecaster()
    alerts: list[Alert] = []
    i = 0
    while not any(a.state == "raised" for a in alerts):
        alerts += fc.observe(drift[i])[0]
        i += 1
    # Another kernel goes on; the drifting one (e.g. replaced by a new config) falls silent.
    other = findings(_BY_NAME["noise only 3%"], node="n9")
    t_stop = drift[i - 1].window_end
    later = [f for f in other if f.window_end > t_stop + 700][:5]
    out = [a for f in later for a in fc.observe(f)[0]]
    assert [a.state for a in out] == ["withdrawn"] and "stopped" in out[0].summary


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold_factor": 1.0},
        {"raise_confidence": 0.4},
        {"min_points": 2},
        {"horizon_s": 0.0},
        {"history_s": math.nan},
    ],
)
def test_settings_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(LogicSettingsError):
        ForecastSettings(**bad)  # type: ignore[arg-type]


def test_a_series_holds_at_most_an_hour_of_bins_whatever_the_window_length() -> None:
    # One-second windows (the worker's default): 7,200 windows in two hours, binned.
    detector, fc = Detector(), Forecaster()
    drift = _BY_NAME["drift 40%/h"]
    raised = [
        a
        for w in windows_of(drift, 0, 1.0)
        for a in fc.observe(detector.classify(w))[0]
        if a.state == "raised"
    ]
    assert raised, "the drift was not forecast from one-second windows"
    assert all(a.points <= fc.settings.history_s / fc.settings.bin_s + 1 for a in raised)
