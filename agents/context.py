"""What the worker's agents share: settings, topics, counters, the edge decoder.

Every record a worker consumes passes :meth:`WorkerContext.decode`: the key must
be UTF-8 text, the value a valid record of the topic's type (size limit, JSON,
schema and version, fields, types, finite numbers, ranges, column lengths), and a
launch batch must also be keyed by its own stream, name a workload the worker
knows and carry event times within bounds of the worker's clock. Anything else
goes to the dead-letter topic with its original bytes, a reason and a reason code,
and is counted in ``counters`` under ``deadletter.<stage>`` and
``deadletter.<stage>.<code>``; the agent carries on with the next record.
"""

from __future__ import annotations

import base64
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kernelstream.agents.latency import WINDOW_BUCKETS_S, LatencyHistogram
from kernelstream.schemas import DeadLetter, LaunchBatch, Record, SchemaError, decode, encode
from kernelstream.schemas.codec import check_key

if TYPE_CHECKING:
    from kernelstream.schemas.columnar import LaunchColumns

__all__ = ["LaunchLimits", "WorkerContext", "dead_letter_record", "launch_batch_problem"]

R = TypeVar("R", bound=Record)


def dead_letter_record(
    stage: str,
    topic: str,
    value: bytes | None,
    reason: str,
    *,
    key: bytes | None = None,
    partition: int | None = None,
    offset: int | None = None,
    reason_code: str | None = None,
) -> DeadLetter:
    """The dead letter for input ``stage`` could not accept: original bytes and the reason."""
    return DeadLetter(
        stage=stage,
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(value or b"").decode(),
        reason=reason[:2000],
        reason_code=reason_code,
        at=time.time(),
    )


@dataclass(frozen=True)
class LaunchLimits:
    """Bounds on a launch batch's event times, relative to the worker's clock."""

    max_future_s: float = 300.0
    max_age_s: float = 7 * 24 * 3600.0


def launch_batch_problem(
    batch: LaunchBatch,
    key: str | None,
    now: float,
    limits: LaunchLimits,
    known_workload: Any = None,
    t_range: tuple[float, float] | None = None,
) -> SchemaError | None:
    """Why a well-formed launch batch must still be refused, or None.

    ``known_workload(workload, problem_size) -> bool``, when given, says whether
    the worker knows the workload (a node running a kernel no worker can place in
    a search space is misconfigured, not a source of windows to tune).
    ``t_range`` is the batch's (earliest, latest) event time when the caller has
    the columns elsewhere (columnar decoding), else taken from ``batch.t_end``.
    """
    if key != batch.stream_key:
        return SchemaError(
            f"key {key!r} is not the batch's stream key {batch.stream_key!r}: its launches "
            "would be windowed on the wrong partition",
            "bad_key",
        )
    lo, hi = t_range if t_range is not None else (min(batch.t_end), max(batch.t_end))
    if hi > now + limits.max_future_s:
        return SchemaError(
            f"event time {hi:.3f} is {hi - now:.0f} s ahead of the worker's clock "
            f"(limit {limits.max_future_s:.0f} s): check the node's clock",
            "bad_timestamp",
        )
    if lo < now - limits.max_age_s:
        return SchemaError(
            f"event time {lo:.3f} is {now - lo:.0f} s in the past "
            f"(limit {limits.max_age_s:.0f} s): check the node's clock",
            "bad_timestamp",
        )
    if known_workload is not None and not known_workload(batch.workload, batch.problem_size):
        return SchemaError(
            f"unknown kernel: workload {batch.workload!r} with problem size "
            f"{batch.problem_size} is not built in (or refuses that size) and has no "
            "tuning-space file on this worker",
            "unknown_kernel",
        )
    return None


@dataclass
class WorkerContext:
    """Built once per worker process by :func:`agents.worker.register_agents`."""

    settings: Any  # app.settings.Settings (not imported: agents must not depend on app)
    topics: dict[str, Any]  # role -> faust topic
    counters: Counter[str] = field(default_factory=Counter)
    # Live readings agents offer the metrics and health endpoints (``window.lag``,
    # ``window.ready``), called at scrape time.
    probes: dict[str, Callable[[], Any]] = field(default_factory=dict)
    # Event time of each emitted window's end to its emission (worker clock).
    window_latency: LatencyHistogram = field(
        default_factory=lambda: LatencyHistogram(WINDOW_BUCKETS_S)
    )
    # The Faust app whose producer :meth:`send` uses; None (unit tests) sends through
    # the topic objects themselves.
    app: Any = None
    _known: dict[tuple[str, tuple[int, ...]], bool] = field(default_factory=dict, repr=False)
    _resolver: Any = field(default=None, repr=False)
    _producer_ready: bool = field(default=False, repr=False)

    async def send(
        self, role: str, key: bytes | None, value: bytes, partition: int | None = None
    ) -> Any:
        """Publish ``value`` to the topic of ``role``; returns the delivery future.

        Straight through the app's producer, not ``Topic.send``: Faust reaches the
        producer through ``App.maybe_start_producer``, which mode's stampede guard
        wraps in three ``asyncio.sleep(0)`` per message, each a full turn of the
        event loop (every other ready task runs). A window agent publishing a window
        and its finding paid about 0.4 ms of other tasks' work per message that way,
        16% of its loop at full speed (cProfile of the publish step in a
        ``bench pipeline`` (c) run, 2026-11-22). Nothing else differs: same producer,
        same partitioner, same delivery future.
        """
        topic = self.topics[role]
        if self.app is None:
            return await topic.send(key=key, value=value, partition=partition)
        if not self._producer_ready:
            await self.app.maybe_start_producer()
            self._producer_ready = True
        return await self.app.producer.send(
            topic.get_topic_name(), key, value, partition, None, None
        )

    @property
    def launch_limits(self) -> LaunchLimits:
        s = self.settings
        return LaunchLimits(
            max_future_s=s.max_event_future_s,
            max_age_s=s.max_event_age_s,
        )

    def known_workload(self, workload: str, problem_size: Any) -> bool:
        """Whether this worker can place ``workload`` in a search space (cached)."""
        key = (workload, tuple(problem_size))
        if key not in self._known:
            if self._resolver is None:
                from kernelstream.kernels.resolve import SpaceResolver

                self._resolver = SpaceResolver(self.settings.tuning_spaces_dir)
            try:
                self._resolver.space_for(workload, key[1])
            except Exception:  # LookupError, or ValueError for a size the workload refuses
                # Not remembered: a user kernel's declared space may arrive later.
                return False
            self._known[key] = True
        return self._known[key]

    def dead_letter_counts(self) -> dict[str, int]:
        """Dead letters so far by ``<stage>.<reason code>`` (for metrics endpoints)."""
        prefix = "deadletter."
        return {
            k[len(prefix) :]: v
            for k, v in self.counters.items()
            if k.startswith(prefix) and k.count(".") >= 2
        }

    async def dead_letter(
        self, stage: str, event: Any, reason: str, code: str | None = None
    ) -> None:
        """Publish the event's original bytes with the reason to the dead-letter topic."""
        self.counters[f"deadletter.{stage}"] += 1
        self.counters[f"deadletter.{stage}.{code or 'invalid'}"] += 1
        msg = event.message
        record = dead_letter_record(
            stage,
            msg.topic,
            event.value,
            reason,
            key=event.key,
            partition=msg.partition,
            offset=msg.offset,
            reason_code=code,
        )
        await self.send("deadletter", event.key, encode(record))

    async def decode_launches(self, stage: str, event: Any) -> LaunchColumns | None:
        """:meth:`decode` for launch batches, straight to columns (the worker's hot path)."""
        from kernelstream.schemas.columnar import decode_launch_columns

        max_bytes = self.settings.max_message_bytes
        try:
            value = _value(event, max_bytes)
            key = check_key(event.key)
            cols = decode_launch_columns(value)
            problem = launch_batch_problem(
                cols.meta, key, time.time(), self.launch_limits, self.known_workload, cols.t_range()
            )
            if problem is not None:
                raise problem
        except SchemaError as exc:
            await self.dead_letter(stage, event, str(exc), exc.code)
            return None
        return cols

    async def decode(self, stage: str, event: Any, cls: type[R]) -> R | None:
        """Validate an event at the edge; dead-letter it and return None when invalid."""
        max_bytes = self.settings.max_message_bytes
        try:
            value = _value(event, max_bytes)
            key = check_key(event.key)
            record = decode(value, cls, max_bytes=max_bytes)
            if isinstance(record, LaunchBatch):
                problem = launch_batch_problem(
                    record, key, time.time(), self.launch_limits, self.known_workload
                )
                if problem is not None:
                    raise problem
        except SchemaError as exc:
            await self.dead_letter(stage, event, str(exc), exc.code)
            return None
        return record


def _value(event: Any, max_bytes: int) -> bytes:
    value = event.value
    if value is None:
        raise SchemaError("the message has no value (a tombstone)", "invalid_json")
    if len(value) > max_bytes:
        raise SchemaError(
            f"message of {len(value)} bytes exceeds the {max_bytes}-byte limit", "oversized"
        )
    return bytes(value)
