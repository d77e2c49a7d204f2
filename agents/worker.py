"""Wires the worker's agents into a Faust app (called by the app factory)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kernelstream.agents import (
    alert_agent,
    detector_agent,
    findings_agent,
    tuner_agent,
    window_agent,
)
from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.windowing import Windower

__all__ = ["WorkerAgents", "register_agents"]


@dataclass
class WorkerAgents:
    """What the app factory gets back: the shared context and the window agent's state."""

    ctx: WorkerContext
    windower: Windower
    window_stats: window_agent.WindowAgentStats


def register_agents(
    app: Any,
    settings: Any,
    topics: dict[str, Any],
    window_consumer: Any = None,
    make_consumer: Callable[[], Any] | None = None,
    state_partitions: Callable[[int], Awaitable[None]] | None = None,
    make_findings_consumer: Callable[[], Any] | None = None,
) -> WorkerAgents:
    """Register the window agent (with the detector inline), the findings reader (the tuner
    and alert stages) and the outcomes agent.

    ``window_consumer`` is the window agent's consumer already joining its group, or
    None; ``make_consumer`` builds one when the app starts (the app layer knows the
    settings and the client options, the agents do not import it).
    ``state_partitions(n)`` makes sure the window-state topic has at least ``n``
    partitions (the window agent calls it when partitions are assigned).
    ``make_findings_consumer`` builds the findings reader's consumer when the app starts.
    """
    ctx = WorkerContext(settings=settings, topics=topics, app=app)
    windower, stats = window_agent.register(
        app,
        ctx,
        detector_agent.InlineDetector(ctx),
        window_consumer,
        make_consumer,
        state_partitions,
    )
    # One reader takes the findings for both stages that learn from them.
    stages: list[findings_agent.FindingStage] = [
        tuner_agent.register(app, ctx),
        alert_agent.AlertStage(ctx),
    ]
    findings_agent.register(app, ctx, stages, make_findings_consumer)
    return WorkerAgents(ctx, windower, stats)
