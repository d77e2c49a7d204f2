"""HTTP endpoints of workers and nodes: ``/metrics``, ``/healthz`` (liveness), ``/readyz``.

A worker serves them on its Faust web server (``web_port``); a node runs a small
aiohttp server of its own on ``node_metrics_port``. ``/healthz`` answers 200 while
the process's event loop runs and nothing has crashed; ``/readyz`` answers 200 only
once the process does its job: a worker has joined both consumer groups (its window
consumer and Faust's) and is not rebalancing; a node has its producer connected and
its recommendation partition assigned. Otherwise 503 with the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kernelstream.app.observability.metrics import (
    CONTENT_TYPE,
    NodeMetrics,
    render,
    worker_registry,
)

__all__ = ["add_worker_endpoints", "serve_node_endpoints", "worker_readiness"]


def worker_readiness(app: Any, agents: Any) -> tuple[bool, str]:
    """Whether a worker is ready, and why not."""
    window = agents.ctx.probes.get("window.ready")
    if window is None or not window():
        return False, "the window agent has not joined its consumer group"
    if app.rebalancing_count == 0:
        return False, "the agents' consumer group has not been joined yet"
    if app.rebalancing:
        return False, "rebalancing"
    return True, "ready"


def add_worker_endpoints(app: Any, agents: Any) -> None:
    """Register ``/metrics``, ``/healthz`` and ``/readyz`` on the worker's Faust app."""
    registry = worker_registry(agents, app, lambda: worker_readiness(app, agents)[0])

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        return web.bytes(render(registry), headers={"Content-Type": CONTENT_TYPE})

    @app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        if getattr(app, "crashed", False):
            return web.json({"status": "crashed", "reason": repr(app.crash_reason)}, status=500)
        return web.json({"status": "ok"})

    @app.page("/readyz")
    async def readyz(web: Any, request: Any) -> Any:
        ready, why = worker_readiness(app, agents)
        return web.json({"ready": ready, "reason": why}, status=200 if ready else 503)


@contextlib.asynccontextmanager
async def serve_node_endpoints(
    metrics: NodeMetrics, host: str, port: int
) -> AsyncIterator[int | None]:
    """Serve a node's endpoints for the duration of the block; yields the bound port.

    ``port`` 0 serves nothing (yields None).
    """
    if not port:
        yield None
        return
    from aiohttp import web

    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=render(metrics.registry), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        ready = metrics.ready()
        reason = "ready" if ready else "not connected to the broker yet"
        return web.json_response({"ready": ready, "reason": reason}, status=200 if ready else 503)

    server = web.Application()
    server.router.add_get("/metrics", get_metrics)
    server.router.add_get("/healthz", healthz)
    server.router.add_get("/readyz", readyz)
    runner = web.AppRunner(server, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield port
    finally:
        await runner.cleanup()
