"""Detector agent: ks.windows -> ks.findings.

Classifies every window aggregate against the device's roofline
(:class:`agents.logic.detection.Detector`) and publishes the finding keyed by
the fleet group, so the tuner that owns the group sees it.
"""

from __future__ import annotations

from typing import Any

from agents.context import WorkerContext
from agents.logic.detection import Detector
from schemas import WindowAggregate, encode
from schemas.keys import group_key

__all__ = ["register"]


def register(app: Any, ctx: WorkerContext) -> Detector:
    detector = Detector()
    windows, findings = ctx.topics["windows"], ctx.topics["findings"]

    @app.agent(windows, name="detector")
    async def detector_agent(stream: Any) -> None:
        async for event in stream.events():
            agg = await ctx.decode("detector", event, WindowAggregate)
            if agg is None:
                continue
            finding = detector.classify(agg)
            ctx.counters[f"findings.{finding.classification}"] += 1
            key = group_key(agg.device_model, agg.workload, agg.problem_size)
            await findings.send(key=key.encode(), value=encode(finding))

    return detector
