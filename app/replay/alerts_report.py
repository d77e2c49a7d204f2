"""The replay report's predictive-alert timeline: what was forecast, when, and how it ended.

Each alert's life (raised, then withdrawn or crossed, or still raised at the end of
the range) becomes one row, in the order alerts were raised, with the times as UTC.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kernelstream.schemas import Alert

__all__ = ["alerts_section", "alerts_summary"]


def _utc(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def alerts_summary(alerts: Sequence[Alert], refusals: Counter[str]) -> dict[str, Any]:
    """JSON-able timeline: one entry per alert id, from its raising to its end."""
    lives: dict[str, dict[str, Any]] = {}
    for a in alerts:
        if a.state == "raised":
            lives[a.id] = {
                "id": a.id,
                "scope": a.scope,
                "series": a.key,
                "metric": a.metric,
                "kernel": a.kernel,
                "config_id": a.config_id,
                "raised_at": _utc(a.at),
                "lead_s": a.lead_s,
                "predicted_at": _utc(a.predicted_at),
                "confidence": a.confidence,
                "baseline_us": a.baseline,
                "threshold_us": a.threshold,
                "level_us": a.level,
                "slope_us_per_h": a.slope_per_h,
                "ended": "still raised",
                "ended_at": None,
                "summary": a.summary,
            }
        elif a.id in lives:
            life = lives[a.id]
            life["ended"], life["ended_at"] = a.state, _utc(a.at)
            life["end_summary"] = a.summary
    states = Counter(a.state for a in alerts)
    return {
        "counts": dict(sorted(states.items())),
        "refused_findings": dict(sorted(refusals.items())),
        "timeline": list(lives.values()),
    }


def _level(r: dict[str, Any]) -> str:
    """Level and threshold in the unit of the alert's metric (older summaries: durations)."""
    level, threshold = r["level_us"], r["threshold_us"]
    metric = r.get("metric")
    if metric == "sm_clock_mean_mhz":
        return f"{level:.0f} / {threshold:.0f} MHz"
    if metric == "mem_used_max_bytes":
        return f"{level / 2**30:.1f} / {threshold / 2**30:.1f} GiB"
    return f"{level:.1f} / {threshold:.1f} us"


def alerts_section(summary: dict[str, Any]) -> list[str]:
    """The HTML section: a table of alerts in the order they were raised."""
    data = summary.get("alerts") or {"timeline": [], "counts": {}, "refused_findings": {}}
    e = html.escape
    rows = "".join(
        "<tr>"
        f"<td>{e(r['raised_at'] or '')}</td><td>{e(r['scope'])}</td><td>{e(r['series'])}"
        f"<br><code>{e(r['config_id'] or r.get('metric') or '')}</code></td>"
        f"<td class='n'>{(r['lead_s'] or 0) / 60:.0f} min</td>"
        f"<td>{e(r['predicted_at'] or '-')}</td><td class='n'>{r['confidence']:.3f}</td>"
        f"<td class='n'>{_level(r)}</td>"
        f"<td>{e(r['ended'])}{' at ' + e(r['ended_at']) if r['ended_at'] else ''}</td>"
        "</tr>"
        for r in data["timeline"]
    )
    table = (
        "<table><tr><th>raised (UTC)</th><th>scope</th><th>series / config</th><th>lead</th>"
        "<th>forecast crossing</th><th>confidence</th><th>level / threshold</th>"
        f"<th>ended</th></tr>{rows}</table>"
        if rows
        else "<p>No alert was raised in this range.</p>"
    )
    refused = data["refused_findings"]
    return [
        "<h2>Predictive alerts</h2>",
        "<p class='muted'>Trends of each kernel's mean duration per window, forecast to reach "
        "its regression threshold (the same forecaster as the workers' alert agent; "
        f"alerts by state: {e(str(data['counts']) or '{}')}"
        + (f"; findings the forecast refused: {e(str(refused))}" if refused else "")
        + ").</p>",
        table,
    ]
