"""Offline analysis of recorded topics: the workers' own window, detector and tuner code.

:class:`OfflineAnalysis` is fed the recorded messages of one replay range, partition
by partition in offset order, and does what the worker did with them:

* launch batches pass the same edge checks (:func:`schemas.columnar.decode_launch_columns_many`
  and :func:`agents.context.launch_batch_problem`), with the record's Kafka timestamp
  standing in for the worker's clock (the live worker used its clock at processing
  time, seconds later; replaying a week-old range against today's clock would refuse
  everything as too old);
* accepted batches go to a :class:`~agents.logic.windowing.Windower` as the window
  agent sends them: those that continue their streams exactly a run at a time
  (:class:`~agents.logic.windowing.InOrderRun`), every other one through the sequence
  rules, ``add_columns`` and ``poll_key``; every open window is flushed at the end of
  the range (``flush_all``);
* every closed window is classified by a :class:`~agents.logic.detection.Detector`
  in the order the window stream carries it (per stream key, which is all the
  detector's state depends on);
* the findings, in (window end, id) order, feed a
  :class:`~agents.logic.forecast.Forecaster` as the alert agent does, giving the
  predictive alerts of the range (and the findings it refused, by reason);
* the host side of version 2 batches (copies, host gaps, waits) is summarized per
  window by :class:`~agents.logic.transfers.TransferWindows` and classified when the
  window closes, as the worker's inline detector does (``host_windows`` keeps the
  summaries for the report's timeline);
* the findings, with the recorded reconfiguration outcomes interleaved by time, drive
  a :class:`~agents.logic.tuning.Tuner` whose clock is the finding's window end, so
  its recommendations are a deterministic function of the input.

Idle flushes. The live worker also closes the windows of a key that received nothing
for ``idle_timeout_s`` of *processing* time. Replay has no such clock and closes them
at the end of the range instead. The two agree whenever no launch of an idle-flushed
window arrives after the flush, i.e. unless a node resent old launches after a pause
longer than the idle timeout (an outage backlog); then the live worker sent those
launches to the late topic and replay windows them. Such a difference shows up in
the parity test's comparison, not silently.

Everything here is plain Python over records: no Kafka, no Faust.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kernelstream.agents.context import ConfigCheck, LaunchLimits, launch_batch_problem
from kernelstream.agents.logic.detection import Detector, finding_id
from kernelstream.agents.logic.forecast import Forecaster
from kernelstream.agents.logic.ingest import Counted, Refused, window_partition
from kernelstream.agents.logic.sequencing import SeqLimits
from kernelstream.agents.logic.transfers import (
    TransferSummary,
    TransferWindows,
    finding_records,
    transfer_findings,
)
from kernelstream.agents.logic.tuning import Tuner
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.kernels.devices import device_spec_for_name
from kernelstream.kernels.transfers import host_declared
from kernelstream.schemas import (
    Alert,
    Finding,
    Recommendation,
    ReconfigOutcome,
    SchemaError,
    WindowAggregate,
    decode,
)
from kernelstream.schemas.codec import check_key
from kernelstream.schemas.columnar import LaunchColumns, decode_launch_columns_many

log = logging.getLogger(__name__)

__all__ = [
    "AnalysisResult",
    "LaunchFilter",
    "OfflineAnalysis",
    "RecordedMessage",
    "key_matches",
]


class RecordedMessage(NamedTuple):
    """One message as read from a topic (or a recording of it)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@dataclass(frozen=True)
class LaunchFilter:
    """Which series to keep: node id, device (model or ``node:index``), kernel name.

    ``None`` keeps everything. Launch messages are filtered by their key before
    decoding where the key says enough (node and kernel).
    """

    node: str | None = None
    device: str | None = None
    kernel: str | None = None

    def keeps(self, node: str, device_index: int, device_model: str, kernel: str) -> bool:
        if self.node is not None and node != self.node:
            return False
        if self.kernel is not None and kernel != self.kernel:
            return False
        return self.device is None or self.device in (device_model, f"{node}:{device_index}")

    def keeps_record(self, rec: Any) -> bool:
        return self.keeps(rec.node, rec.device_index, rec.device_model, rec.kernel)


def key_matches(key: bytes | None, flt: LaunchFilter) -> bool:
    """Whether a launch key ``node:device/kernel`` can belong to a kept series.

    A malformed key is kept: the edge check then refuses the message with its reason.
    """
    if flt.node is None and flt.kernel is None:
        return True
    try:
        text = (key or b"").decode()
        device_key, kernel = text.split("/", 1)
        node = device_key.rsplit(":", 1)[0]
    except (UnicodeDecodeError, ValueError):
        return True
    return (flt.node is None or node == flt.node) and (flt.kernel is None or kernel == flt.kernel)


@dataclass
class AnalysisResult:
    """What one replay range yielded; every list in a deterministic order."""

    windows: list[WindowAggregate] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)  # offline tuner's
    alerts: list[Alert] = field(default_factory=list)  # the forecaster's, in order
    alert_refusals: Counter[str] = field(default_factory=Counter)  # reason code -> findings
    recorded_recommendations: list[Recommendation] = field(default_factory=list)
    recorded_outcomes: list[ReconfigOutcome] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)  # reason code -> messages
    late_launches: int = 0
    duplicate_launches: int = 0  # resent copies, counted once (as the worker does)
    launches: int = 0
    launch_messages: int = 0
    skipped_messages: int = 0  # filtered out
    # (window, host-side summary) of every window whose batches carried host telemetry
    host_windows: list[tuple[WindowAggregate, TransferSummary]] = field(default_factory=list)


class OfflineAnalysis:
    """The worker's window -> detector -> tuner path over recorded messages.

    Args:
        spec: the windowing the live workers used (``agents.window_agent.window_spec``).
        known_workload: ``(workload, problem_size) -> bool``, as the worker's edge check.
        space_for: ``(workload, problem_size, config) -> SearchSpace`` for the tuner; a
            ``LookupError``/``ValueError`` skips tuning that finding (the tuner agent
            dead-letters it).
        limits: event-time bounds, relative to each record's timestamp.
        tuner: the tuner to run, e.g. the worker's (``agents.tuner_agent.tuner_from_settings``);
            a default ``Tuner()`` when None.
        forecaster: the alert forecaster, e.g. the worker's
            (``agents.alert_agent.forecaster_from_settings``); a default one when None.
        flt: which series to keep.
        seq_limits: the sequence-number plausibility bounds the workers used.
    """

    def __init__(
        self,
        spec: WindowSpec,
        *,
        known_workload: Any = None,
        space_for: Any = None,
        limits: LaunchLimits | None = None,
        flt: LaunchFilter | None = None,
        tuner: Tuner | None = None,
        seq_limits: SeqLimits | None = None,
        forecaster: Forecaster | None = None,
    ) -> None:
        self.windower = Windower(spec)
        self.detector = Detector()
        self.transfers = TransferWindows(spec.size_s)
        self.tuner = tuner if tuner is not None else Tuner()
        self.forecaster = forecaster if forecaster is not None else Forecaster()
        self.known_workload = known_workload
        self.space_for = space_for
        self.limits = limits or LaunchLimits()
        self.seq_limits = seq_limits or SeqLimits()
        self.config_problem = ConfigCheck(space_for) if space_for is not None else None
        self.flt = flt or LaunchFilter()
        self.result = AnalysisResult()
        self._findings_by_key: dict[str, list[Finding]] = defaultdict(list)

    # -- launches ---------------------------------------------------------------

    def add_launch_message(self, msg: RecordedMessage) -> None:
        """One recorded ``ks.launches`` message, in its partition's offset order."""
        self.add_launch_messages([msg])

    def add_launch_messages(self, msgs: Sequence[RecordedMessage]) -> None:
        """Recorded ``ks.launches`` messages of one partition, in offset order (a chunk as
        read), on the window agent's path (:meth:`agents.window_agent.WindowIngest.ingest`):
        decoded and checked at the edge a chunk at a time
        (:func:`schemas.columnar.decode_launch_columns_many`), then windowed in order by
        the agent's own control flow (:func:`agents.logic.ingest.window_partition`): the
        batches that continue their streams exactly a run at a time, each other batch
        alone after the sequence rules.
        """
        res = self.result
        kept: list[tuple[RecordedMessage, str | None]] = []
        for msg in msgs:
            if not key_matches(msg.key, self.flt):
                res.skipped_messages += 1
                continue
            try:
                if msg.value is None:
                    raise SchemaError("the message has no value (a tombstone)", "invalid_json")
                kept.append((msg, check_key(msg.key)))
            except SchemaError as exc:
                res.rejected[exc.code or "invalid"] += 1
        decoded = _decode_many([m.value or b"" for m, _ in kept])
        checked: list[tuple[RecordedMessage, LaunchColumns]] = []
        for (msg, key), cols in zip(kept, decoded, strict=True):
            if isinstance(cols, SchemaError):
                res.rejected[cols.code or "invalid"] += 1
                continue
            try:
                problem = launch_batch_problem(
                    cols.meta,
                    key,
                    _timestamp(msg),
                    self.limits,
                    self.known_workload,
                    cols.t_range(),
                    config_problem=self.config_problem,
                    backstep_s=cols.max_backstep(),
                    batch_key=cols.key,
                )
            except Exception as ex:
                log.exception("checking a launch batch of %s failed", key)
                problem = SchemaError(f"the edge check failed: {ex!r}", "internal_error")
            if problem is not None:
                res.rejected[problem.code or "invalid"] += 1
                continue
            meta = cols.meta
            if not self.flt.keeps(meta.node, meta.device_index, meta.device_model, meta.kernel):
                res.skipped_messages += 1
                continue
            checked.append((msg, cols))
        # ``now`` (a message's timestamp) drives the sequence rules' clock; idle flushes,
        # which it would drive live, replay leaves to the end of the range.
        steps = window_partition(
            self.windower, checked, self.seq_limits, now=_timestamp, on_batch=self.transfers.add
        )
        for step in steps:
            if isinstance(step, Counted):
                res.launch_messages += len(step.batches)
                res.launches += step.launches
                res.duplicate_launches += step.duplicates
                res.late_launches += sum(len(x.t_end) for x in step.late)
                self._take_windows(step.closed)
            elif isinstance(step, Refused):
                res.rejected[step.code] += 1
                if step.code == "duplicate":
                    res.duplicate_launches += len(step.verdict.cols)
            else:
                log.error("a launch batch failed: %r", step.error, exc_info=step.error)
                res.rejected["internal_error"] += 1

    def _take_windows(self, aggs: Iterable[WindowAggregate]) -> None:
        """Keep closed windows and their findings. A window the detector fails on keeps
        no finding and counts ``detector.internal_error`` (the worker's inline detector
        dead-letters it, stage ``detector``)."""
        for agg in aggs:
            self.result.windows.append(agg)
            try:
                finding = self.detector.classify(agg)
            except Exception:
                log.exception("classifying window %s failed", finding_id(agg))
                self.result.rejected["detector.internal_error"] += 1
                self.transfers.close(agg)
                continue
            self._findings_by_key[agg.stream_key].append(finding)
            host = self.transfers.close(agg)
            if host is not None:
                self.result.host_windows.append((agg, host))
                found = transfer_findings(host, device_spec_for_name(agg.device_model), agg.config)
                self._findings_by_key[agg.stream_key] += finding_records(
                    agg, found, finding_id(agg)
                )

    # -- other topics -------------------------------------------------------------

    def add_recorded(self, msg: RecordedMessage, kind: str) -> None:
        """A recorded recommendation (``kind`` "recommendation") or outcome ("outcome")."""
        cls: type[Recommendation] | type[ReconfigOutcome] = (
            Recommendation if kind == "recommendation" else ReconfigOutcome
        )
        try:
            rec = decode(msg.value or b"", cls)
        except SchemaError as exc:
            self.result.rejected[f"{kind}.{exc.code or 'invalid'}"] += 1
            return
        if not self.flt.keeps_record(rec):
            return
        if isinstance(rec, Recommendation):
            self.result.recorded_recommendations.append(rec)
        else:
            self.result.recorded_outcomes.append(rec)

    # -- end of range -----------------------------------------------------------------

    def finish(self) -> AnalysisResult:
        """Flush every open window, classify it, forecast, run the tuner; return the result."""
        self._take_windows(self.windower.flush_all())
        res = self.result
        res.windows.sort(key=_window_order)
        res.host_windows.sort(key=lambda wh: _window_order(wh[0]))
        findings = [f for fs in self._findings_by_key.values() for f in fs]
        res.findings = sorted(findings, key=lambda f: (f.window_end, f.id))
        res.recorded_recommendations.sort(key=lambda r: (r.issued_at, r.id))
        res.recorded_outcomes.sort(key=lambda o: (o.at, o.id))
        for finding in res.findings:
            alerts, problem = self.forecaster.observe(finding)
            res.alerts += alerts
            if problem is not None:
                res.alert_refusals[problem.code] += 1
        res.recommendations = self._tune(res.findings, res.recorded_outcomes)
        return res

    def _tune(
        self, findings: list[Finding], outcomes: list[ReconfigOutcome]
    ) -> list[Recommendation]:
        """The tuner over the findings and recorded outcomes, in time order."""
        if self.space_for is None:
            return []
        events: list[tuple[float, int, Any]] = [(f.window_end, 0, f) for f in findings]
        events += [(o.at, 1, o) for o in outcomes]
        events.sort(key=lambda e: (e[0], e[1], e[2].id))
        out: list[Recommendation] = []
        for when, _, rec in events:
            if isinstance(rec, ReconfigOutcome):
                self.tuner.observe_outcome(rec)
                continue
            try:
                space = host_declared(
                    self.space_for(rec.workload, tuple(rec.problem_size), rec.config), rec.config
                )
            except (LookupError, ValueError):
                continue
            self.tuner.observe_finding(rec)
            proposed = self.tuner.recommend_for(rec, space, when)
            if proposed is not None:
                out.append(proposed)
        return out


def _timestamp(msg: RecordedMessage) -> float:
    """A recorded message's processing time: when the broker took it."""
    return msg.timestamp_ms / 1000.0


def _decode_many(values: list[bytes]) -> list[LaunchColumns | SchemaError]:
    """:func:`decode_launch_columns_many`; should it fail in a way nothing foresaw, each
    message alone, the one it fails on refused ``internal_error`` (as the window agent)."""
    try:
        return decode_launch_columns_many(values)
    except Exception:
        log.exception("decoding %d launch messages failed; one by one", len(values))
    out: list[LaunchColumns | SchemaError] = []
    for value in values:
        try:
            out += decode_launch_columns_many([value])
        except Exception as ex:
            out.append(SchemaError(f"the decoder failed on this message: {ex!r}", "internal_error"))
    return out


def _window_order(a: WindowAggregate) -> tuple[str, float, str]:
    return (a.stream_key, a.window_start, a.config_id)


def weighted_mean(pairs: Iterable[tuple[float, int]]) -> float:
    """Count-weighted mean of ``(mean, count)`` pairs (nan when no count)."""
    total = n = 0.0
    for mean, count in pairs:
        total += mean * count
        n += count
    return total / n if n else math.nan
