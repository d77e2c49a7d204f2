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
import hashlib
import logging
import time
import typing
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kernelstream.agents.latency import WINDOW_BUCKETS_S, LatencyHistogram
from kernelstream.agents.logic.sequencing import SeqLimits
from kernelstream.agents.publish import BatchPublisher
from kernelstream.kernels.transfers import host_declared
from kernelstream.schemas import DeadLetter, LaunchBatch, Record, SchemaError, decode, encode
from kernelstream.schemas.codec import check_key
from kernelstream.schemas.keys import remember

if TYPE_CHECKING:
    from kernelstream.schemas.columnar import LaunchColumns

__all__ = [
    "DEAD_LETTER_INLINE_BYTES",
    "LaunchLimits",
    "RecordEvent",
    "WorkerContext",
    "dead_letter_key",
    "dead_letter_record",
    "launch_batch_problem",
    "partition_lag",
]

log = logging.getLogger("kernelstream.deadletter")

R = TypeVar("R", bound=Record)


#: Originals up to this size travel whole in a dead letter (base64, 4/3 of it), which
#: keeps every dead letter below the producer's default ``max_request_size`` (1,000,000
#: bytes) and Kafka's default ``message.max.bytes`` (1 MiB). A larger original is kept
#: by reference: its first ``DEAD_LETTER_HEAD_BYTES``, size and SHA-256, and where it is.
DEAD_LETTER_INLINE_BYTES = 512 * 1024
DEAD_LETTER_HEAD_BYTES = 4096
#: Keys longer than this are cut to it in the dead letter and in its Kafka key.
DEAD_LETTER_KEY_BYTES = 1024


def dead_letter_key(key: bytes | None) -> bytes | None:
    """The Kafka key a dead letter of a message keyed ``key`` is published under."""
    return None if key is None else key[:DEAD_LETTER_KEY_BYTES]


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
    """The dead letter for input ``stage`` could not accept: original bytes and the reason.

    Its encoding is bounded (about 700 kB at most) whatever the size of the original,
    so publishing it cannot fail for size: an original over
    :data:`DEAD_LETTER_INLINE_BYTES` is stored by reference (its head, size, SHA-256,
    topic, partition and offset), a key over :data:`DEAD_LETTER_KEY_BYTES` is cut.

    >>> dl = dead_letter_record("s", "t", b"x" * 600_000, "too big", offset=7)
    >>> dl.value_truncated, dl.value_bytes, len(dl.value_b64)
    (True, 600000, 5464)
    """
    value = value or b""
    whole = len(value) <= DEAD_LETTER_INLINE_BYTES
    kept = value if whole else value[:DEAD_LETTER_HEAD_BYTES]
    short_key = dead_letter_key(key)
    return DeadLetter(
        stage=stage,
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(short_key).decode() if short_key is not None else None,
        value_b64=base64.b64encode(kept).decode(),
        reason=reason[:2000],
        reason_code=reason_code,
        at=time.time(),
        value_truncated=not whole,
        key_truncated=key is not None and len(key) > DEAD_LETTER_KEY_BYTES,
        value_bytes=len(value),
        value_sha256=hashlib.sha256(value).hexdigest(),
    )


@dataclass(frozen=True)
class LaunchLimits:
    """Bounds on a launch batch's event times, relative to the worker's clock."""

    max_future_s: float = 300.0
    max_age_s: float = 7 * 24 * 3600.0
    # One device's launches complete in order but for the few ms by which two CUDA
    # streams may finish out of order; a batch going back further is not a device's.
    max_disorder_s: float = 1.0


class ConfigCheck:
    """Why a batch's configuration is not in its workload's declared space, or None.

    ``space_for(workload, problem_size, config)`` gives the space (the one whose
    parameters the config names, where a kernel has several); a workload it does not know
    is left to the ``unknown_kernel`` check. Verdicts are cached per configuration.
    """

    def __init__(self, space_for: Callable[[str, tuple[int, ...], Any], Any]) -> None:
        self._space_for = space_for
        self._verdicts: dict[tuple[Any, ...], str | None] = {}
        # Verdicts by the identity of the batch's config object: decoded batches of an
        # unchanged stream share it (the decoders keep each stream's validated per-batch
        # fields), so the sorted key below is built once per stream and config, not once
        # per batch (~2 us). An entry holds the objects it was judged on, so their ids
        # cannot be reused by others while it exists.
        self._by_id: dict[int, tuple[Any, Any, str, str | None]] = {}

    def __call__(self, batch: LaunchBatch) -> str | None:
        hit = self._by_id.get(id(batch.config))
        if (
            hit is not None
            and hit[0] is batch.config
            and hit[1] is batch.problem_size
            and hit[2] == batch.workload
        ):
            return hit[3]
        items = tuple(sorted((k, type(v).__name__, v) for k, v in batch.config.items()))
        key = (batch.workload, tuple(batch.problem_size), items)
        if key not in self._verdicts:
            try:
                space = self._space_for(batch.workload, tuple(batch.problem_size), batch.config)
            except Exception:  # unknown workload or size: the unknown_kernel check says so
                return None  # not remembered: a user kernel's space may arrive later
            if len(self._verdicts) >= 65536:
                self._verdicts.clear()
            self._verdicts[key] = self._judge(batch, space)
        verdict = self._verdicts[key]
        # Bounded: batches carrying device samples are decoded anew, a new object each.
        entry = (batch.config, batch.problem_size, batch.workload, verdict)
        remember(self._by_id, id(batch.config), entry)
        return verdict

    @staticmethod
    def _judge(batch: LaunchBatch, space: Any) -> str | None:
        # A kernel run under a host pattern declares its host knobs in its configuration.
        problems = host_declared(space, batch.config).violations(batch.config)
        if not problems:
            return None
        return (
            f"configuration {batch.config_id!r} is not in the declared space of workload "
            f"{batch.workload!r}: {'; '.join(problems)[:500]}"
        )


def launch_batch_problem(
    batch: LaunchBatch,
    key: str | None,
    now: float,
    limits: LaunchLimits,
    known_workload: Any = None,
    t_range: tuple[float, float] | None = None,
    *,
    config_problem: Callable[[LaunchBatch], str | None] | None = None,
    backstep_s: float = 0.0,
    batch_key: str | None = None,
) -> SchemaError | None:
    """Why a well-formed launch batch must still be refused, or None.

    ``known_workload(workload, problem_size) -> bool``, when given, says whether
    the worker knows the workload (a node running a kernel no worker can place in
    a search space is misconfigured, not a source of windows to tune).
    ``t_range`` is the batch's (earliest, latest) event time when the caller has
    the columns elsewhere (columnar decoding), else taken from ``batch.t_end``.
    ``config_problem`` (a :class:`ConfigCheck`) refuses a configuration outside the
    workload's space; ``backstep_s`` is how far the batch's end times go back
    (:meth:`LaunchColumns.max_backstep`); ``batch_key`` is ``batch.stream_key`` when the
    caller has it.
    """
    if key != (batch_key or batch.stream_key):
        return SchemaError(
            f"key {key!r} is not the batch's stream key {batch.stream_key!r}: its launches "
            "would be windowed on the wrong partition",
            "bad_key",
        )
    lo, hi = t_range if t_range is not None else (min(batch.t_end), max(batch.t_end))
    problem = event_time_problem(lo, hi, now, limits, backstep_s)
    if problem is not None:
        return problem
    if known_workload is not None and not known_workload(batch.workload, batch.problem_size):
        return SchemaError(
            f"unknown kernel: workload {batch.workload!r} with problem size "
            f"{batch.problem_size} is not built in (or refuses that size) and has no "
            "tuning-space file on this worker",
            "unknown_kernel",
        )
    if config_problem is not None:
        why = config_problem(batch)
        if why:
            return SchemaError(why, "bad_config")
    return None


def event_time_problem(
    lo: float, hi: float, now: float, limits: LaunchLimits, backstep_s: float = 0.0
) -> SchemaError | None:
    """Why a batch's event times (earliest ``lo``, latest ``hi``, going back by
    ``backstep_s`` within the batch) must be refused at ``now``, or None: the checks of
    :func:`launch_batch_problem` that change from batch to batch of a stream."""
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
    if backstep_s > limits.max_disorder_s:
        return SchemaError(
            f"end times go back by {backstep_s:.3f} s within the batch (limit "
            f"{limits.max_disorder_s:.3f} s): one device's launches complete in order",
            "unordered",
        )
    return None


def partition_lag(consumer: Any, next_offsets: dict[Any, int]) -> dict[tuple[str, int], int]:
    """Records not yet processed per partition of a plain consumer: the high watermark of
    its last fetch minus the next offset to process (partitions not fetched yet left out;
    no ListOffsets request, which the embedded broker answers wrongly)."""
    out: dict[tuple[str, int], int] = {}
    if consumer is None:
        return out
    for tp, nxt in list(next_offsets.items()):
        high = consumer.highwater(tp)
        if high is not None:
            out[(tp.topic, tp.partition)] = max(0, high - nxt)
    return out


class RecordEvent:
    """A plain consumer's record in the shape of a Faust event, as :meth:`WorkerContext.decode`
    and :meth:`WorkerContext.dead_letter` take it (``message``, ``key``, ``value``)."""

    __slots__ = ("key", "message", "value")

    def __init__(self, msg: Any) -> None:
        self.message, self.key, self.value = msg, msg.key, msg.value


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
    _config_check: ConfigCheck | None = field(default=None, repr=False)
    # (id of a decoded header's configuration, message key) -> that configuration, for
    # headers whose key, workload and configuration checks passed with that key: see
    # decode_launches_many. Bounded.
    _header_passed: dict[tuple[int, str | None], Any] = field(default_factory=dict, repr=False)
    _resolver: Any = field(default=None, repr=False)
    _producer_ready: bool = field(default=False, repr=False)
    _publisher: BatchPublisher | None = field(default=None, repr=False)
    _limits_of: tuple[Any, LaunchLimits, SeqLimits] | None = field(default=None, repr=False)

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

    async def send_many(self, role: str, items: Sequence[tuple[bytes, bytes]]) -> None:
        """Publish ``items`` ((key, value) pairs, in order) to the topic of ``role``: the
        records :meth:`send` would publish one by one, in the same partitions (the
        producer's partitioner's choice for each key) and the same order, in record
        batches (:class:`agents.publish.BatchPublisher`). :meth:`flush` waits for them.
        Where the app's producer offers no batches (no app: the topic objects send), or
        its partitioner is not known here, record by record.
        """
        if self.app is not None and not self._producer_ready:
            await self.app.maybe_start_producer()
            self._producer_ready = True
        publisher, choose = self._batcher()
        if publisher is None or choose is None:
            for key, value in items:
                await self.send(role, key, value)
            return
        topic = self.topics[role].get_topic_name()
        # The set aiokafka's own send hands the partitioner, as a list (the same order).
        partitions = list(await publisher.producer.partitions_for(topic))
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in items:
            by_partition.setdefault(choose(key, partitions, partitions), []).append((key, value))
        for partition, records in by_partition.items():
            await publisher.add(topic, partition, records)

    @property
    def publish_error(self) -> Exception | None:
        """Why a record batch of :meth:`send_many` was lost, if one was."""
        return None if self._publisher is None else self._publisher.error

    async def flush(self) -> None:
        """Wait until everything published so far is on the broker."""
        if self._publisher is not None:
            await self._publisher.flush()
        if self.app is not None:
            await self.app.producer.flush()

    def _batcher(self) -> tuple[BatchPublisher | None, Callable[[Any, Any, Any], int] | None]:
        """The batches of the app producer's Kafka client (started), and its partitioner."""
        if self.app is None:
            return None, None
        client = getattr(self.app.producer, "_producer", None)  # the aiokafka producer
        if client is None or not hasattr(client, "send_batch"):
            return None, None
        if self._publisher is None or self._publisher.producer is not client:
            self._publisher = BatchPublisher(client, self.counters)
        return self._publisher, getattr(self.app.conf, "producer_partitioner", None)

    @property
    def launch_limits(self) -> LaunchLimits:
        return self._limits()[0]

    @property
    def seq_limits(self) -> SeqLimits:
        return self._limits()[1]

    def _limits(self) -> tuple[LaunchLimits, SeqLimits]:
        # Read on every launch batch: built once per settings object (they are frozen),
        # not twice per batch (about 2% of the window agent's time on small batches).
        s = self.settings
        if self._limits_of is None or self._limits_of[0] is not s:
            launch = LaunchLimits(
                max_future_s=s.max_event_future_s,
                max_age_s=s.max_event_age_s,
                max_disorder_s=s.max_event_disorder_s,
            )
            self._limits_of = (
                s,
                launch,
                SeqLimits(s.max_stream_launches_per_s, s.seq_slack_launches),
            )
        return self._limits_of[1], self._limits_of[2]

    def _space_for(self, workload: str, problem_size: tuple[int, ...], config: Any = None) -> Any:
        if self._resolver is None:
            from kernelstream.kernels.resolve import SpaceResolver

            self._resolver = SpaceResolver(self.settings.tuning_spaces_dir)
        return self._resolver.space_for(workload, problem_size, config)

    def config_problem(self, batch: LaunchBatch) -> str | None:
        """Why the batch's configuration is outside its workload's space, or None."""
        if self._config_check is None:
            self._config_check = ConfigCheck(self._space_for)
        return self._config_check(batch)

    def known_workload(self, workload: str, problem_size: Any) -> bool:
        """Whether this worker can place ``workload`` in a search space (cached)."""
        key = (workload, tuple(problem_size))
        if key not in self._known:
            try:
                self._space_for(workload, key[1])
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
        """Publish the event's original bytes with the reason to the dead-letter topic.

        Never raises: the record is bounded in size (:func:`dead_letter_record`), and
        should publishing still fail (the broker refuses it, the producer is closing)
        the failure is logged and counted as ``deadletter.<stage>.unpublished``; the
        caller goes on and the input's offset is committed like any other's, so one
        message can never stop a stream.
        """
        self.counters[f"deadletter.{stage}"] += 1
        self.counters[f"deadletter.{stage}.{code or 'invalid'}"] += 1
        msg = event.message
        try:
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
            await self.send("deadletter", dead_letter_key(event.key), encode(record))
        except Exception as ex:  # never let a dead letter take the stage down
            self.counters[f"deadletter.{stage}.unpublished"] += 1
            log.error(
                "dead letter of %s[%s]@%s (%s: %s) could not be published: %r; skipped",
                getattr(msg, "topic", "?"),
                getattr(msg, "partition", "?"),
                getattr(msg, "offset", "?"),
                code,
                reason[:200],
                ex,
            )

    async def decode_launches(self, stage: str, event: Any) -> LaunchColumns | None:
        """:meth:`decode` for launch batches, straight to columns (the worker's hot path)."""
        from kernelstream.schemas.columnar import decode_launch_columns

        max_bytes = self.settings.max_message_bytes
        try:
            value = _value(event, max_bytes)
            key = check_key(event.key)
            cols = decode_launch_columns(value)
            problem = launch_batch_problem(
                cols.meta,
                key,
                time.time(),
                self.launch_limits,
                self.known_workload,
                cols.t_range(),
                config_problem=self.config_problem,
                backstep_s=cols.max_backstep(),
            )
            if problem is not None:
                raise problem
        except SchemaError as exc:
            await self.dead_letter(stage, event, str(exc), exc.code)
            return None
        return cols

    async def decode_launches_many(
        self, stage: str, events: list[Any]
    ) -> list[LaunchColumns | None]:
        """:meth:`decode_launches` of each message of a consumer poll, in order.

        The same verdicts and dead letters as message by message; the binary batches'
        value checks run once over the poll
        (:func:`schemas.columnar.decode_launch_columns_many`).
        """
        verdicts = self.launch_verdicts(events)
        out: list[LaunchColumns | None] = []
        for event, verdict in zip(events, verdicts, strict=True):
            if isinstance(verdict, SchemaError):
                await self.dead_letter(stage, event, str(verdict), verdict.code)
                out.append(None)
            else:
                out.append(verdict)
        return out

    def launch_verdicts(self, events: list[Any]) -> list[LaunchColumns | SchemaError]:
        """:meth:`decode_launches_many`'s verdicts, nothing dead-lettered: each message's
        columns, or why it is refused (the caller dead-letters it when its turn comes)."""
        from kernelstream.schemas.columnar import decode_launch_columns_many

        max_bytes = self.settings.max_message_bytes
        limits, now = self.launch_limits, time.time()  # one poll, one reading of each
        passed = self._header_passed
        out: list[LaunchColumns | SchemaError | None] = [None] * len(events)
        framed: list[tuple[int, bytes, str | None]] = []
        for i, event in enumerate(events):
            try:
                value = _value(event, max_bytes)
                framed.append((i, value, check_key(event.key)))
            except SchemaError as exc:
                out[i] = exc
        decoded = decode_launch_columns_many([value for _, value, _ in framed])
        # event_time_problem's bounds, the same expressions: a batch in completion order
        # with its ends within them has nothing for it to say
        newest, oldest = now + limits.max_future_s, now - limits.max_age_s
        for (i, _, key), cols in zip(framed, decoded, strict=True):
            if isinstance(cols, SchemaError):
                out[i] = cols
                continue
            # A binary batch whose header bytes were decoded before shares that header's
            # validated configuration object: when its key, workload and configuration
            # checks passed under this message key, only the event times are left.
            config = cols.meta.config
            if cols.key is not None and passed.get((id(config), key)) is config:
                lo, hi = cols.t_range()
                if cols.known_in_order and oldest <= lo and hi <= newest:
                    out[i] = cols
                    continue
                problem = event_time_problem(lo, hi, now, limits, cols.max_backstep())
            else:
                problem = launch_batch_problem(
                    cols.meta,
                    key,
                    now,
                    limits,
                    self.known_workload,
                    cols.t_range(),
                    config_problem=self.config_problem,
                    backstep_s=cols.max_backstep(),
                    batch_key=cols.key,
                )
                if problem is None and cols.key is not None:
                    remember(passed, (id(config), key), config)  # holds it: its id stays its own
            out[i] = cols if problem is None else problem
        return typing.cast("list[LaunchColumns | SchemaError]", out)  # each one set

    async def decode(self, stage: str, event: Any, cls: type[R]) -> R | None:
        """Validate an event at the edge; dead-letter it and return None when invalid."""
        max_bytes = self.settings.max_message_bytes
        try:
            value = _value(event, max_bytes)
            key = check_key(event.key)
            record = decode(value, cls, max_bytes=max_bytes)
            if isinstance(record, LaunchBatch):
                from kernelstream.schemas.columnar import LaunchColumns

                problem = launch_batch_problem(
                    record,
                    key,
                    time.time(),
                    self.launch_limits,
                    self.known_workload,
                    config_problem=self.config_problem,
                    backstep_s=LaunchColumns.from_batch(record).max_backstep(),
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
    return value if type(value) is bytes else bytes(value)
