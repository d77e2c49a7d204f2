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

The host side of each window (copies, host gaps and waits of ``ks.launch_batch/2``
batches, fed by :meth:`InlineDetector.on_batch`) is classified when the window closes
(:mod:`agents.logic.transfers`) and published as further findings of that window.
These summaries are not part of the window agent's checkpoint: a stream that moves to
another worker loses the host-side findings of its open windows, never its launches.
"""

from __future__ import annotations

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.detection import Detector, finding_id
from kernelstream.agents.logic.transfers import TransferWindows, finding_records, transfer_findings
from kernelstream.kernels.devices import device_spec_for_name
from kernelstream.schemas import WindowAggregate, encode
from kernelstream.schemas.columnar import LaunchColumns
from kernelstream.schemas.keys import group_key

__all__ = ["InlineDetector"]


class InlineDetector:
    """Classifies each window the window agent closes and publishes the finding."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.detector = Detector()
        self.transfers = TransferWindows(ctx.settings.window_s)

    def on_batch(self, cols: LaunchColumns) -> None:
        """Take the host side of a batch the window agent accepted."""
        self.transfers.add(cols)

    async def on_window(self, agg: WindowAggregate) -> None:
        finding = self.detector.classify(agg)
        self.ctx.counters[f"findings.{finding.classification}"] += 1
        key = group_key(agg.device_model, agg.workload, agg.problem_size).encode()
        await self.ctx.send("findings", key, encode(finding))
        host = self.transfers.close(agg)
        if host is None:
            return
        found = transfer_findings(host, device_spec_for_name(agg.device_model), agg.config)
        for record in finding_records(agg, found, finding_id(agg)):
            self.ctx.counters[f"findings.{record.classification}"] += 1
            await self.ctx.send("findings", key, encode(record))
