"""Detector stage: each closed window -> ks.findings, run where the window closes.

Classifies every window aggregate against the device's roofline
(:class:`agents.logic.detection.Detector`) and publishes the finding keyed by
the fleet group, so the tuner that owns the group sees it.

The window agent calls :meth:`InlineDetector.on_windows` with the windows it
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

import logging
from collections.abc import Sequence
from types import SimpleNamespace
from typing import get_args

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.detection import Detector, finding_id
from kernelstream.agents.logic.transfers import TransferWindows, finding_records, transfer_findings
from kernelstream.agents.logic.written import Written
from kernelstream.kernels.devices import device_spec_for_name
from kernelstream.schemas import WindowAggregate, encode
from kernelstream.schemas.columnar import LaunchColumns
from kernelstream.schemas.keys import group_key
from kernelstream.schemas.records import Classification

__all__ = ["InlineDetector"]

log = logging.getLogger(__name__)

# Each classification's counter (not formatted per finding).
_COUNTED = {c: f"findings.{c}" for c in get_args(Classification)}


class InlineDetector:
    """Classifies each window the window agent closes and publishes the finding."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.detector = Detector()
        self.transfers = TransferWindows(ctx.settings.window_s)
        self._group_keys: dict[tuple[str, str, tuple[int, ...]], bytes] = {}

    def on_batch(self, cols: LaunchColumns) -> None:
        """Take the host side of a batch the window agent accepted."""
        self.transfers.add(cols)

    async def on_windows(self, aggs: Sequence[WindowAggregate | Written]) -> None:
        """Publish the findings of windows the window agent published, in their order;
        a window the compiled engine wrote (:class:`Written`) comes with its finding, and
        with its series' regression baseline where it fed it (the detector takes it, to
        judge from there any window of the series the engine leaves to it).

        Classifying is pure: should it fail on a window in a way nothing foresaw, the
        window is dead-lettered (``internal_error``, stage ``detector``) and the
        stream goes on; raised, the failure would stop the window agent, whose restart
        closes the same window again. A failure to publish raises, as the window
        agent's own publishing does (the broker: restart from the checkpoint).
        """
        items: list[tuple[bytes, bytes]] = []
        counters = self.ctx.counters
        for agg in aggs:
            if isinstance(agg, Written):
                counters[_COUNTED[agg.classification]] += 1
                items.append((agg.group, agg.finding))
                if agg.baseline is not None:  # the window fed its series' baseline
                    series, windows, launches, sum_us = agg.baseline
                    self.detector.take_baseline(series, (windows, launches, sum_us))
                continue
            try:
                found = self._findings_wire(agg)
            except Exception as ex:
                log.exception("classifying window %s failed", finding_id(agg))
                await self.ctx.dead_letter(
                    "detector",
                    _ClosedWindow(self.ctx.settings.topic_windows, agg),
                    f"the detector failed on this window: {ex!r}",
                    "internal_error",
                )
                continue
            key = self.group_key(agg)
            for classification, value in found:
                counters[_COUNTED[classification]] += 1
                items.append((key, value))
        if items:
            await self.ctx.send_many("findings", items)

    def _findings_wire(self, agg: WindowAggregate) -> list[tuple[str, bytes]]:
        """The window's roofline finding, then those of its host side (if it has one),
        as (classification, record bytes); the roofline finding's bytes are written
        without its record (:meth:`Detector.classify_wire`)."""
        out: list[tuple[str, bytes]] = [self.detector.classify_wire(agg)]
        host = self.transfers.close(agg)
        if host is not None:
            found = transfer_findings(host, device_spec_for_name(agg.device_model), agg.config)
            out += [
                (r.classification, encode(r))
                for r in finding_records(agg, found, self.detector.finding_id(agg))
            ]
        return out

    def writable(self, agg: WindowAggregate) -> bool:
        """Whether the compiled engine may write the findings of ``agg``'s series from
        now on: not while a host-side summary of its stream is open (the engine's writer
        knows only the roofline finding)."""
        return not self.transfers.holds(agg.stream_key)

    def group_key(self, agg: WindowAggregate) -> bytes:
        """The findings' message key of ``agg``'s fleet group (cached: a worker sees a few)."""
        at = (agg.device_model, agg.workload, tuple(agg.problem_size))
        key = self._group_keys.get(at)
        if key is None:
            if len(self._group_keys) >= 4096:
                self._group_keys.clear()
            key = self._group_keys[at] = group_key(*at).encode()
        return key


class _ClosedWindow:
    """A window the window agent published, as the event a dead letter describes."""

    def __init__(self, topic: str, agg: WindowAggregate) -> None:
        self.key = agg.stream_key.encode()
        self.value = encode(agg)
        self.message = SimpleNamespace(topic=topic, partition=None, offset=None)
