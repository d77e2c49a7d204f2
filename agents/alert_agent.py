"""Alert stage: ks.findings (through :mod:`agents.findings_agent`) -> ks.alerts
(predictive alerts from window history).

Findings are keyed by fleet group, so one worker sees every window of a group, in
the order its window agents published them: the per-device (stream) series and the
fleet group's series are both complete on it. Each finding goes to the pure
:class:`agents.logic.forecast.Forecaster`; the alerts it raises, withdraws or closes
are published keyed by the series key. A finding the forecast cannot use (no
successful launch in its window, out of order, after a gap in the series) is
dead-lettered with the reason; the agent carries on.
"""

from __future__ import annotations

from typing import Any

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.forecast import Forecaster, ForecastSettings
from kernelstream.schemas import Alert, Finding, encode

__all__ = ["STAGE", "AlertStage", "forecaster_from_settings", "publish"]

STAGE = "alerts"


def forecaster_from_settings(settings: Any) -> Forecaster:
    """The forecaster as the worker runs it; replay (``app/replay/``) builds the same."""
    return Forecaster(
        ForecastSettings(
            threshold_factor=settings.alert_threshold_factor,
            horizon_s=settings.alert_horizon_s,
            history_s=settings.alert_history_s,
        )
    )


async def publish(ctx: WorkerContext, alerts: list[Alert]) -> None:
    """Send alerts to ``ks.alerts`` and count them by state."""
    for alert in alerts:
        ctx.counters[f"alerts.{alert.state}"] += 1
        await ctx.send("alerts", alert.key.encode(), encode(alert))


class AlertStage:
    """The forecaster's share of each burst of findings (:mod:`agents.findings_agent`)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.forecaster = forecaster_from_settings(ctx.settings)
        ctx.probes["alerts.active"] = self.forecaster.active_alerts

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        for event, finding in burst:
            alerts, problem = self.forecaster.observe(finding)
            if alerts:
                await publish(self.ctx, alerts)
            if problem is not None:
                await self.ctx.dead_letter(STAGE, event, problem.reason, problem.code)
