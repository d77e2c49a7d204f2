"""Detector stage: each closed window -> ks.findings, run where the window closes.

Classifies every window aggregate against the device's roofline
(:class:`agents.logic.detection.Detector`) and publishes the finding keyed by
the fleet group, so the tuner that owns the group sees it.

The window agent calls :meth:`InlineDetector.on_window` for each window it
publishes, in the same process, instead of a Faust agent consuming
``ks.windows`` again: that hop (a producer linger, a fetch wait on the broker,
Faust's per-event dispatch) was a quarter of the pipeline's latency after a
window's end and did nothing the in-process call does not (bench/pipeline.py
(d), per-hop breakdown). The state moves with it unchanged: the detector keeps
per-(stream, config) baselines only, windows and launches are keyed alike by
stream, and the window agent owns a stream's launches partition, so one
detector sees every window of a stream in order, as before. ``ks.windows``
is still published for every other consumer (replay, watch, dashboards).
"""

from __future__ import annotations

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.detection import Detector
from kernelstream.schemas import WindowAggregate, encode
from kernelstream.schemas.keys import group_key

__all__ = ["InlineDetector"]


class InlineDetector:
    """Classifies each window the window agent closes and publishes the finding."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.detector = Detector()

    async def on_window(self, agg: WindowAggregate) -> None:
        finding = self.detector.classify(agg)
        self.ctx.counters[f"findings.{finding.classification}"] += 1
        key = group_key(agg.device_model, agg.workload, agg.problem_size)
        await self.ctx.send("findings", key.encode(), encode(finding))
