"""The node process (``kernelstream node``): workload runner + reconfiguration agent.

Wires a device backend, the workload runner, the telemetry batcher and the
reconfiguration logic to Kafka: launch batches go to the launches topic keyed by
``node:device/kernel``; recommendations are read from this node's own partition
of the recommendations topic; every outcome (applied, kept, rolled back,
rejected) goes to the reconfig topic keyed by fleet group.

The launch loop never awaits the broker: everything it publishes is appended to
the node's durable outbox (:mod:`app.outbox`) and sent by a task of its own, so
a broker outage neither stalls the kernels nor loses their telemetry, and a
restarted node resends what it had not delivered and continues its sequence
numbers. Recommendations are checked (signature when configured, addressee,
expiry, replay, declared space, step size) and every decision is written to the
node's audit log, ``<node_state_dir>/<node_id>/audit.jsonl``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import orjson
from pydantic import ValidationError

from kernelstream.agents.context import dead_letter_record
from kernelstream.agents.latency import (
    RECOMMENDATION_BUCKETS_S,
    TICK_LAG_WINDOW_S,
    LatencyHistogram,
    RecentMax,
)
from kernelstream.agents.logic.reconfiguration import ReconfigPolicy, Reconfigurator
from kernelstream.agents.reconfig_agent import RecommendationInbox, outcome_record
from kernelstream.app.kafka.capabilities import BrokerCapabilities
from kernelstream.app.kafka.partitioner import CachedKeyPartitioner
from kernelstream.app.node.outbox import DurableSeenIds, NodeStore, Outbox, OutboxSender
from kernelstream.app.settings import Settings, host_pattern_of
from kernelstream.kernels import open_device
from kernelstream.kernels.backends.sim_drift import DeviceDrift
from kernelstream.kernels.runner import LaunchBatcher, NodeBatch, WorkloadRunner
from kernelstream.kernels.workloads.hosted import HostedWorkload
from kernelstream.schemas import DeviceSample, LaunchBatch, Recommendation, ReconfigOutcome, encode
from kernelstream.schemas.codec import schema_error
from kernelstream.schemas.keys import group_key, stream_key
from kernelstream.schemas.records import RejectCode
from kernelstream.schemas.signing import verifier_from_settings

__all__ = ["NodeParts", "NodeReport", "run_node"]

NodeParts = tuple[Any, list[Any], Any]

log = logging.getLogger("kernelstream.node")

_TICK_S = 0.05
_SAMPLE_EVERY_S = 1.0
_PRUNE_SEEN_EVERY_S = 60.0


@dataclass
class NodeReport:
    """What a node did, for its own log and for tests.

    ``max_tick_lag_s`` is the launch loop's worst overrun of its 50 ms tick, by
    its own clock: a loop that waited for the broker would show the outage here.
    ``worst_tick`` says where that tick's time went: ``at`` (wall clock, the tick's
    start), ``launch_s`` (the workload's own step, run in a thread), ``thread_wait_s``
    (from handing that step to a thread to having its result back, beyond the step
    itself: a busy executor or a starved process) and ``rest_s`` (the loop's own work:
    batching, publishing, evaluating).
    """

    node: str
    launches: int = 0
    batches: int = 0
    ticks: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    default_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    final_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_tick_lag_s: float = 0.0
    worst_tick: dict[str, float] = field(default_factory=dict)
    outbox: dict[str, int] = field(default_factory=dict)
    # Launch batches the launch batch schema refused, by reason code (dead-lettered).
    refused: dict[str, int] = field(default_factory=dict)
    first_seq: dict[str, int] = field(default_factory=dict)
    next_seq: dict[str, int] = field(default_factory=dict)


def _open(settings: Settings) -> tuple[Any, list[Any]]:
    device = open_device(
        settings.backend,
        model=settings.device_model,
        device_index=settings.device_index,
        seed=settings.seed,
        trace_file=settings.trace_file,
        problem_scale=settings.problem_scale,
        drift=None if settings.sim_drift is None else DeviceDrift.parse(settings.sim_drift),
    )
    workloads = device.workloads()
    if settings.backend != "trace":
        wanted = set(settings.workloads)
        workloads = [w for w in workloads if w.name in wanted]
    return device, workloads


class _Audit:
    """Append-only JSON lines, one per control-plane decision, flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[bytes] = path.open("ab")

    def write(self, **fields: Any) -> None:
        self._f.write(orjson.dumps(fields) + b"\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class WindowClosePoints:
    """Tells when this node's launches pass the point that closes a worker window.

    A worker closes the window ``[k w, (k+1) w)`` of a stream once the stream's newest
    event time reaches ``(k+1) w + out_of_orderness + allowed_lateness``. The launch
    that gets there sits in an open batch for up to ``batch_max_delay_s`` (0.1 s) on
    the node, and every window of every stream of the node waits for it. So at the tick
    whose launches pass such a point the node sends every open batch at once (one
    extra, smaller batch per stream and window: +10% messages at the defaults) instead
    of when each batch is due; the worker closes the windows up to 0.1 s sooner.
    """

    def __init__(self, window_s: float, out_of_orderness_s: float, allowed_lateness_s: float):
        self.window_s = window_s
        self.slack_s = out_of_orderness_s + allowed_lateness_s
        self._closed: int | None = None

    def passed(self, newest_t: float) -> bool:
        """Whether event time ``newest_t`` passes a close point not passed before."""
        closed = math.floor((newest_t - self.slack_s) / self.window_s)
        before, self._closed = self._closed, max(closed, self._closed or closed)
        return before is not None and closed > before


def _refuse_unverifiable(rec: Recommendation) -> str:
    return (
        "refused: this node has no verifying key, so no recommendation can be trusted "
        "(set KERNELSTREAM_SIGNING_PUBLIC_KEY_FILE; see docs/operate/security.md)"
    )


def _signature_check(settings: Settings) -> Any:
    """The node's signature check: the recommender's key, refuse-all, or (opt-out) none."""
    verifier = verifier_from_settings(settings)
    if verifier is not None:
        return verifier.problem
    if settings.insecure_accept_unsigned:
        log.warning(
            "node %s: KERNELSTREAM_INSECURE_ACCEPT_UNSIGNED is set: recommendations are "
            "applied WITHOUT signature checks; anyone who can write to %s controls this "
            "node's kernel configurations",
            settings.node_id,
            settings.topic_recommendations,
        )
        return None
    log.warning(
        "node %s: no signing public key configured: every recommendation will be refused "
        "(generate keys with `kernelstream keygen`, see docs/operate/security.md)",
        settings.node_id,
    )
    return _refuse_unverifiable


class _Node:
    """The node's parts and the steps of one tick; ``run_node`` drives it."""

    def __init__(
        self,
        settings: Settings,
        bootstrap: str,
        store: NodeStore,
        report: NodeReport | None,
        parts: NodeParts | None = None,
    ) -> None:
        """``parts`` (device, workloads, runner) replaces the device the settings name
        and its workload runner: the library's node runs the user's own kernels."""
        self.s = settings
        if parts is None:
            self.device, workloads = _open(settings)
            host = None if settings.host_pattern is None else host_pattern_of(settings.host_pattern)
            if host is not None:
                # The host knobs join each kernel's declared space, so a host-side
                # finding's change is applied, measured and kept or rolled back.
                workloads = [HostedWorkload(w, host) for w in workloads]
            self.runner: Any = WorkloadRunner(
                self.device,
                workloads,
                max_launches_per_s=settings.max_launches_per_s,
                host_patterns=None if host is None else {w.name: host for w in workloads},
            )
        else:
            self.device, workloads, self.runner = parts
        self.by_kernel = {w.name: w for w in workloads}
        self.batcher = LaunchBatcher(
            self.device,
            settings.node_id,
            max_launches=settings.batch_max_launches,
            max_delay_s=settings.batch_max_delay_s,
        )
        self.close_points = WindowClosePoints(
            settings.window_s, settings.out_of_orderness_s, settings.allowed_lateness_s
        )
        self.store = store
        self.seen = DurableSeenIds(store)
        self.reconf = Reconfigurator(
            settings.node_id,
            settings.device_index,
            {w.name: w.space for w in workloads},
            {k: self.runner.config_of(k) for k in self.by_kernel},
            ReconfigPolicy(
                max_step=settings.max_step,
                min_launches=settings.rollback_min_launches,
                max_age_s=settings.recommendation_max_age_s,
                max_lifetime_s=settings.recommendation_max_lifetime_s,
            ),
            verify=_signature_check(settings),
            seen=self.seen,
        )
        self.report = report or NodeReport(settings.node_id)
        self.report.default_configs = {k: self.runner.config_of(k) for k in self.by_kernel}
        self._resume_sequences()
        self.outbox = Outbox(
            store,
            max_bytes=settings.outbox_max_bytes,
            max_records=settings.outbox_max_records,
        )
        self.sender = OutboxSender(
            self.outbox, lambda: self._producer(bootstrap), on_drops=self._drop_letter
        )
        self._caps: BrokerCapabilities | None = None  # asked of the broker once it answers
        self.inbox = RecommendationInbox(
            settings,
            bootstrap,
            self.publish,
            handled=self.seen.handled,
            fetch_wait=lambda: self._fetch_wait(bootstrap),
        )
        self.audit = _Audit(settings.node_dir() / "audit.jsonl")
        # For the metrics endpoint: issued_at -> applied, and the recent worst tick overrun.
        self.recommendation_latency = LatencyHistogram(RECOMMENDATION_BUCKETS_S)
        self.tick_lag = RecentMax(TICK_LAG_WINDOW_S)
        self.metrics: Any = None  # app.metrics.NodeMetrics when the node is scraped
        self._partitioner = CachedKeyPartitioner()  # kept across producers the sender makes
        self._refusals_said: set[tuple[str, str]] = set()  # (stream, reason) logged once

    async def _capabilities(self, bootstrap: str) -> BrokerCapabilities:
        """What the broker answered (:func:`~kernelstream.app.kafka.capabilities.probe`),
        asked once it answers; a connection error propagates (the caller retries)."""
        from kernelstream.app.kafka.capabilities import probe

        if self._caps is None:
            self._caps = await probe(bootstrap, self.s.kafka_client_kwargs())
        return self._caps

    async def _fetch_wait(self, bootstrap: str) -> int:
        """The recommendation inbox's fetch wait: the settings', else the broker's."""
        if self.s.fetch_max_wait_ms is not None:  # set: no need to ask the broker
            return self.s.fetch_wait()
        return self.s.for_broker(await self._capabilities(bootstrap)).fetch_wait()

    async def _producer(self, bootstrap: str) -> Any:
        """An unstarted producer; idempotent where the broker hands out producer ids.

        On such a broker (Apache Kafka) a batch resent after a lost answer (a leader
        killed mid-request) is written once; where it cannot (the embedded broker),
        the window agent's per-stream sequence numbers drop the copy instead.
        """
        from aiokafka import AIOKafkaProducer

        caps = await self._capabilities(bootstrap)
        return AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=caps.idempotent_producer,
            linger_ms=5,
            max_request_size=8 * 1024 * 1024,
            request_timeout_ms=10_000,
            compression_type=self.s.producer_compression(),
            partitioner=self._partitioner,
            **self.s.kafka_client_kwargs(),
        )

    def _stream(self, kernel: str) -> str:
        return stream_key(self.s.node_id, self.s.device_index, kernel)

    def _resume_sequences(self) -> None:
        """Continue each stream's sequence numbers where the last run of this node stopped."""
        saved = self.store.next_seqs()
        for kernel, state in self.runner.kernels.items():
            state.seq = max(state.seq, saved.get(self._stream(kernel), 0))
            self.report.first_seq[self._stream(kernel)] = state.seq

    def _seq_puts(self) -> list[tuple[bytes, bytes]]:
        seqs = {self._stream(k): st.seq for k, st in self.runner.kernels.items()}
        self.report.next_seq = seqs
        return NodeStore.seq_puts(seqs)

    # -- publishing (never awaits the broker) -----------------------------------
    def publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.outbox.append([(topic, key, value, False, 0, 0)])

    def publish_batches(self, batches: list[NodeBatch]) -> None:
        """Append launch batches together with the streams' next sequence numbers.

        A batch the launch batch schema refuses (a device that reported a negative, NaN or
        hour-long duration) is not telemetry: it goes to the dead-letter topic with the
        schema's reason, said once per stream and reason in the node's log, and the node
        goes on. Its sequence numbers are not reused (the worker sees a gap).
        """
        binary = self.s.launch_wire == "binary"
        items: list[tuple[str, bytes | None, bytes, bool, int, int]] = []
        for b in batches:
            try:
                value = b.wire(binary)
            except ValidationError as exc:
                items.append(self._refused(b, exc))
                continue
            self.report.batches += 1
            self.report.launches += len(b)
            items.append(
                (self.s.topic_launches, b.stream_key.encode(), value, True, b.seq_start, len(b))
            )
        self.outbox.append(items, extra_puts=self._seq_puts())

    def _refused(
        self, b: NodeBatch, exc: ValidationError
    ) -> tuple[str, bytes | None, bytes, bool, int, int]:
        err = schema_error(LaunchBatch, exc)
        refused = self.report.refused
        if (b.stream_key, err.code) not in self._refusals_said:
            self._refusals_said.add((b.stream_key, err.code))
            log.error(
                "node %s: %d launches of %s (%s) refused by the launch batch schema, sent to "
                "the dead-letter topic; later ones of this stream and reason are counted: %s",
                self.s.node_id,
                len(b),
                b.stream_key,
                b.config_id,
                err,
            )
        refused[err.code] = refused.get(err.code, 0) + 1
        dl = dead_letter_record(
            "node.telemetry",
            self.s.topic_launches,
            b.raw_json(),
            f"node {self.s.node_id}: {err}",
            key=b.stream_key.encode(),
            reason_code=err.code,
        )
        return (self.s.topic_deadletter, b.stream_key.encode(), encode(dl), False, 0, 0)

    def publish_outcome(self, outcome: ReconfigOutcome, **audit: Any) -> None:
        self.report.outcomes[outcome.status] = self.report.outcomes.get(outcome.status, 0) + 1
        w = self.by_kernel.get(outcome.kernel)
        size = list(w.problem_size) if w else outcome.problem_size
        key = group_key(outcome.device_model, outcome.workload, size)
        self.publish(self.s.topic_reconfig, key.encode(), encode(outcome))
        self.audit.write(
            at=outcome.at,
            recommendation_id=outcome.recommendation_id,
            kernel=outcome.kernel,
            status=outcome.status,
            reason=outcome.reason,
            before=outcome.before_config_id,
            after=outcome.after_config_id,
            **audit,
        )

    def _drop_letter(self, report: bytes) -> tuple[str, bytes | None, bytes]:
        d = orjson.loads(report)
        dl = dead_letter_record(
            "node.outbox",
            self.s.topic_launches,
            report,
            f"outbox full: node {self.s.node_id} dropped its {d['batches']} oldest launch "
            f"batches ({d['launches']} launches, {d['bytes']} bytes) while the broker was "
            "unreachable; the value lists the sequence ranges lost per stream",
            key=self.s.node_id.encode(),
            reason_code="outbox_full",
        )
        return self.s.topic_deadletter, self.s.node_id.encode(), encode(dl)

    # -- the steps of one tick ----------------------------------------------------
    def consider_recommendations(self, now: float) -> None:
        """Safe point: between ticks no launch of any kernel is in flight."""
        for rec, offset in self.inbox.drain():
            self.consider(rec, offset, now)

    def consider(self, rec: Recommendation, offset: int | None, now: float) -> None:
        """Apply ``rec`` or reject it, publishing the outcome (call at a safe point)."""
        decision = self.reconf.consider(rec, now, offset)
        audit = {"offset": offset, "key_id": rec.key_id, "signed": bool(rec.signature)}
        before = dict(self.reconf.current.get(rec.kernel, {}))
        if decision.action == "reject":
            self._outcome(
                rec, "rejected", decision.reason, before, rec.config, decision.code, **audit
            )
            return
        self.runner.set_config(rec.kernel, self.reconf.apply(rec, now))
        self.recommendation_latency.observe(time.time() - rec.issued_at)
        self._outcome(rec, "applied", "applied at a safe point", before, rec.config, None, **audit)

    def _outcome(
        self,
        rec: Recommendation,
        status: Any,
        reason: str,
        before: dict[str, Any],
        after: dict[str, Any],
        code: RejectCode | None,
        **audit: Any,
    ) -> None:
        outcome = outcome_record(
            rec, status, reason, before, after, self.device, time.time(), reject_code=code
        )
        self.publish_outcome(outcome, **audit)

    def launches(self, chunks: list[Any], now: float) -> None:
        batches: list[NodeBatch] = []
        newest = None
        for chunk in chunks:
            current = self.reconf.current.get(chunk.kernel)
            if current is not None and self._config_id(chunk.kernel, current) == chunk.config_id:
                # Launches of a configuration the kernel has left (made before a switch,
                # drained after it) are telemetry, not evidence about the one in trial.
                # A kernel with host telemetry is measured by its whole step, so a
                # host-side change (pinned buffers, streams, batching) shows its effect.
                step = chunk.step_us if chunk.step_us is not None else chunk.duration_us
                self.reconf.observe(chunk.kernel, step, chunk.ok)
            batches += self.batcher.add(chunk, now)
            if len(chunk.t_end):
                t = float(np.max(chunk.t_end))
                newest = t if newest is None else max(newest, t)
        batches += self.batcher.due(now)
        if newest is not None and self.close_points.passed(newest):
            batches += self.batcher.flush()  # the windows of every stream can close now
        self.publish_batches(batches)
        if self.metrics is not None:
            self.metrics.observe(chunks)

    def _config_id(self, kernel: str, config: dict[str, Any]) -> str:
        return str(self.by_kernel[kernel].space.config_id(config))

    def _failure_reason(self, kernel: str, config: dict[str, Any]) -> str | None:
        """Why ``config`` could not run, where the device knows (a compile error)."""
        ask = getattr(self.device, "failure_reason", None)
        w = self.by_kernel.get(kernel)
        if ask is None or w is None:
            return None
        try:
            return ask(w, config)
        except Exception:  # a config outside the space: nothing more to say
            return None

    def evaluate(self, now: float) -> None:
        for ev in self.reconf.evaluate(now):
            reason = ev.reason
            if ev.status == "rolled_back":
                self.runner.set_config(ev.kernel, ev.before_config)
                why = self._failure_reason(ev.kernel, ev.after_config)
                if why and ev.after_mean_us is None:
                    reason = f"{reason}: {why}"[:2000]  # the compiler's log can be long
            self.publish_outcome(
                outcome_record(
                    ev.recommendation,
                    ev.status,
                    reason,
                    ev.before_config,
                    ev.after_config,
                    self.device,
                    now,
                    before_mean_us=ev.before_mean_us,
                    after_mean_us=ev.after_mean_us,
                    before_count=ev.before_count,
                    after_count=ev.after_count,
                )
            )


async def run_node(
    settings: Settings,
    bootstrap: str,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    report: NodeReport | None = None,
    metrics: Any = None,
    make_node: Callable[[Settings, str, NodeStore, NodeReport | None], _Node] | None = None,
) -> NodeReport:
    """Run until ``duration_s`` passes or ``stop`` is set; flush and close cleanly.

    Pass a ``report`` to watch the node while it runs (it is updated every tick),
    and an :class:`app.metrics.NodeMetrics` to serve its metrics. ``make_node`` builds
    the node's parts (the library's node passes its own, over the user's kernels).

    On the way out the node gives its outbox ``outbox_drain_s`` to empty; what is
    left stays on disk and is sent by the next run of the same node id.
    """
    store = NodeStore(settings.node_dir())
    try:
        node = (make_node or _Node)(settings, bootstrap, store, report)
        if metrics is not None:
            metrics.attach(node)
            node.metrics = metrics
        try:
            await _loop(node, stop or asyncio.Event(), duration_s)
        finally:
            node.audit.close()
            node.device.close()
        return node.report
    finally:
        store.close()


def _timed(step: Callable[[float], Any], now: float) -> tuple[Any, float]:
    """``step(now)`` and the seconds it took (run in a thread: its own time)."""
    t0 = time.perf_counter()
    out = step(now)
    return out, time.perf_counter() - t0


async def _loop(node: _Node, stop: asyncio.Event, duration_s: float | None) -> None:
    report = node.report
    node.sender.start()
    await node.inbox.start()
    deadline = time.monotonic() + duration_s if duration_s else None
    last_sample = last_prune = 0.0
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            tick_start = time.time()
            node.consider_recommendations(tick_start)
            handed = time.perf_counter()
            chunks, launch_s = await asyncio.to_thread(_timed, node.runner.tick, time.time())
            back = time.perf_counter()
            now = time.time()
            node.launches(chunks, now)
            node.evaluate(now)
            if now - last_sample >= _SAMPLE_EVERY_S:
                last_sample = now
                sample = node.device.sample()
                if sample:
                    node.batcher.add_sample(DeviceSample(t=now, **sample))
            if now - last_prune >= _PRUNE_SEEN_EVERY_S:
                last_prune = now
                node.seen.forget_expired(now - 3600.0)  # an hour of margin for skewed clocks
            report.ticks += 1
            elapsed = time.time() - tick_start
            if elapsed - _TICK_S > report.max_tick_lag_s:
                report.max_tick_lag_s = elapsed - _TICK_S
                report.worst_tick = {
                    "at": tick_start,
                    "launch_s": launch_s,
                    "thread_wait_s": back - handed - launch_s,
                    "rest_s": elapsed - (back - handed),
                }
            node.tick_lag.observe(time.monotonic(), elapsed - _TICK_S)
            await asyncio.sleep(max(0.0, _TICK_S - elapsed))
    finally:
        node.publish_batches(node.batcher.flush())
        if not await node.sender.drain(node.s.outbox_drain_s):
            log.warning(
                "node %s: %d messages not yet delivered stay in the outbox for the next run",
                node.s.node_id,
                len(node.outbox),
            )
        await node.inbox.stop()
        await node.sender.stop()
        report.outbox = node.outbox.stats.as_dict()
        report.final_configs = {k: node.runner.config_of(k) for k in node.by_kernel}
