"""Wires the worker's agents into a Faust app (called by the app factory)."""

from __future__ import annotations

from typing import Any

from agents import detector_agent, tuner_agent, window_agent
from agents.context import WorkerContext

__all__ = ["register_agents"]


def register_agents(app: Any, settings: Any, topics: dict[str, Any]) -> WorkerContext:
    """Register the window, detector and tuner agents on ``app``; return their context."""
    ctx = WorkerContext(settings=settings, topics=topics)
    window_agent.register(app, ctx)
    detector_agent.register(app, ctx)
    tuner_agent.register(app, ctx)
    return ctx
