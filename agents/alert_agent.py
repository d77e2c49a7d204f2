"""Alert agent: ks.findings -> ks.alerts (predictive alerts from window history).

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

__all__ = ["forecaster_from_settings", "publish", "register"]

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


def register(app: Any, ctx: WorkerContext) -> Forecaster:
    forecaster = forecaster_from_settings(ctx.settings)
    ctx.probes["alerts.active"] = forecaster.active_alerts

    @app.agent(ctx.topics["findings"], name="alerts")
    async def alert_agent(stream: Any) -> None:
        async for event in stream.events():
            finding = await ctx.decode(STAGE, event, Finding)
            if finding is None:
                continue
            alerts, problem = forecaster.observe(finding)
            await publish(ctx, alerts)
            if problem is not None:
                await ctx.dead_letter(STAGE, event, problem.reason, problem.code)

    return forecaster
