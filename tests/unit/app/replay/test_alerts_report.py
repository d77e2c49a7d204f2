"""The report's predictive-alert section: one row per alert, from raising to its end."""

from __future__ import annotations

from collections import Counter

from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.forecast import Forecaster
from kernelstream.app.replay.alerts_report import alerts_section, alerts_summary
from kernelstream.bench.alerts import SCENARIOS, windows_of
from kernelstream.schemas import Alert


def _alerts(name: str, node: str) -> list[Alert]:
    sc = next(s for s in SCENARIOS if s.name == name)
    detector, fc = Detector(), Forecaster()
    out: list[Alert] = []
    for w in windows_of(sc, 0, 10.0, node):
        out += fc.observe(detector.classify(w))[0]
    return out


def test_each_alert_is_one_row_with_how_it_ended() -> None:
    alerts = _alerts("rise 10%/h then reverse", "n1") + _alerts("drift 10%/h", "n2")
    data = alerts_summary(alerts, Counter({"series_gap": 2}))
    ended = [r["ended"] for r in data["timeline"]]
    assert ended == ["withdrawn", "crossed"]
    first = data["timeline"][0]
    assert first["raised_at"].endswith("Z") and first["lead_s"] > 0
    assert data["counts"] == {"crossed": 1, "raised": 2, "withdrawn": 1}
    html = "\n".join(alerts_section({"alerts": data}))
    assert "<h2>Predictive alerts</h2>" in html
    assert html.count("<tr>") == 3  # header and two alerts
    assert "series_gap" in html


def test_a_range_without_alerts_says_so() -> None:
    html = "\n".join(alerts_section({"alerts": alerts_summary([], Counter())}))
    assert "No alert was raised in this range." in html


def test_a_device_alert_is_shown_in_its_own_unit() -> None:
    alert = Alert(
        id="device|n1:0|sm_clock_mean_mhz|100.000",
        state="raised",
        scope="device",
        key="n1:0",
        metric="sm_clock_mean_mhz",
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        baseline=1400.0,
        threshold=1128.0,
        level=1250.0,
        slope_per_h=-60.0,
        lead_s=7200.0,
        confidence=0.995,
        points=40,
        at=100.0,
        summary="device n1:0 SM clock falling",
    )
    data = alerts_summary([alert], Counter())
    assert data["timeline"][0]["metric"] == "sm_clock_mean_mhz"
    html = "\n".join(alerts_section({"alerts": data}))
    assert "1250 / 1128 MHz" in html and "<code>sm_clock_mean_mhz</code>" in html
