"""Findings agent: ks.findings -> the tuner stage and the alert stage, each finding read once.

Findings are keyed by fleet group, so one worker owns a group's whole history, and both
stages that learn from findings (the tuner, :mod:`agents.tuner_agent`, and the predictive
alerts, :mod:`agents.alert_agent`) want every finding of the groups it owns, in order.
One Faust agent takes them in bursts, checks and decodes each once at the edge, and hands
the burst to each stage in turn: the tuner first (a node waits for its recommendation),
then the alerts. Two agents on the topic had each received every finding through Faust's
per-event machinery and each parsed and validated it, which cost the worker about as much
per window of a small stream as closing the window (a profile of ``bench pipeline-peers``
with 182-launch batches).

A finding that does not pass the edge checks is dead-lettered once, stage ``findings``;
what a stage refuses of a valid finding carries that stage's name (``tuner``, ``alerts``).
The counter ``read.findings`` (``kernelstream_worker_findings_read_total``) counts every
finding taken and done with, valid or not: against the findings published it says how far
behind the stages that learn from them are.
"""

from __future__ import annotations

from typing import Any, Protocol

from kernelstream.agents.context import WorkerContext
from kernelstream.schemas import Finding

__all__ = ["STAGE", "FindingStage", "register"]

STAGE = "findings"

# A burst is what has arrived, up to this many, after waiting at most this long for it (an
# idle agent wakes at this interval, which costs next to nothing): every stream's window
# closes at the same event time, so findings come in bursts.
_BATCH = 256
_BATCH_WITHIN_S = 0.01


class FindingStage(Protocol):
    """A stage fed with every decoded finding of the worker's fleet groups, in order."""

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        """Take a burst of (event, finding), in the topic's order per partition."""


def register(app: Any, ctx: WorkerContext, stages: list[FindingStage]) -> None:
    @app.agent(ctx.topics["findings"], name="findings")
    async def findings_agent(stream: Any) -> None:
        async for events in stream.take_events(_BATCH, within=_BATCH_WITHIN_S):
            burst = []
            for event in events:
                finding = await ctx.decode(STAGE, event, Finding)
                if finding is not None:
                    burst.append((event, finding))
            if burst:
                for stage in stages:
                    await stage.on_findings(burst)
            ctx.counters["read.findings"] += len(events)
