"""Window agent: ks.launches -> ks.windows (+ ks.late, ks.deadletter).

A thin adapter over :class:`agents.logic.windowing.Windower`: decode each launch
batch at the edge, hand it to the windower, publish the windows it closes. A
timer polls the windower too, so windows close on watermark and idleness even
when no new batch arrives.
"""

from __future__ import annotations

import time
from typing import Any

from agents.context import WorkerContext
from agents.logic.windowing import Windower, WindowSpec
from schemas import LaunchBatch, encode

__all__ = ["register"]


def window_spec(settings: Any) -> WindowSpec:
    return WindowSpec(
        size_s=settings.window_s,
        out_of_orderness_s=settings.out_of_orderness_s,
        allowed_lateness_s=settings.allowed_lateness_s,
        idle_timeout_s=settings.idle_timeout_s,
    )


def register(app: Any, ctx: WorkerContext) -> Windower:
    windower = Windower(window_spec(ctx.settings))
    launches, windows, late = ctx.topics["launches"], ctx.topics["windows"], ctx.topics["late"]

    async def publish_closed(now: float) -> None:
        for agg in windower.poll(now):
            ctx.counters["windows.out"] += 1
            await windows.send(key=agg.stream_key.encode(), value=encode(agg))

    @app.agent(launches, name="window")
    async def window_agent(stream: Any) -> None:
        async for event in stream.events():
            batch = await ctx.decode("window", event, LaunchBatch)
            if batch is None:
                continue
            now = time.time()
            ctx.counters["launches.in"] += len(batch.t_end)
            for too_late in windower.add_runs(batch, now):
                ctx.counters["launches.late"] += len(too_late.t_end)
                await late.send(key=batch.stream_key.encode(), value=encode(too_late))
            await publish_closed(now)

    @app.timer(0.2, name="window.tick")
    async def window_tick() -> None:
        await publish_closed(time.time())

    return windower
