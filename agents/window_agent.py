"""Window agent: ks.launches -> ks.windows (+ ks.late, ks.deadletter).

Launch telemetry is the one high-rate stream, so it does not go through Faust's
per-message stream machinery (measured in bench/pipeline.py: its fetcher thread,
per-event futures and acks cost several times the decoding itself). The window
agent is a service inside the Faust worker that consumes ``ks.launches`` with a
plain aiokafka group consumer, a whole fetch at a time, and does per-batch work
only: decode the columnar batch with orjson straight into NumPy arrays
(:func:`schemas.columnar.decode_launch_columns`), hand the arrays to the
:class:`~agents.logic.windowing.Windower`, publish the windows that batch's
watermark closed through the Faust producer. A Faust timer flushes idle keys.

Partition handover. A stream key lives in one partition, so one worker owns
its windows. When a partition is revoked (rebalance or clean shutdown), the
owner writes the windowing state of that partition's keys together with the next
offset to process to the ``<launches>.window-state`` topic (same partition
number) and commits exactly that offset. The next owner reads the partition's
latest state record whose offset equals the committed offset (reading up to a
marker it writes itself, because end offsets cannot be trusted on every broker)
and continues as if nothing happened: no window is lost or emitted twice. State
records carry the offset, so a later exactly-once scheme (per-producer sequence
numbers) can build on them. A crash without handover loses the open windows of
its partitions; making that safe is the reliability issue's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any

import orjson
from aiokafka.abc import ConsumerRebalanceListener
from mode import Service

from agents.context import WorkerContext
from agents.logic.windowing import Windower, WindowSpec
from schemas import WindowAggregate, encode

__all__ = ["WindowAgentStats", "WindowIngest", "register", "state_topic", "window_spec"]

log = logging.getLogger("kernelstream.window")

_COMMIT_EVERY_S = 1.0


def window_spec(settings: Any) -> WindowSpec:
    return WindowSpec(
        size_s=settings.window_s,
        out_of_orderness_s=settings.out_of_orderness_s,
        allowed_lateness_s=settings.allowed_lateness_s,
        idle_timeout_s=settings.idle_timeout_s,
    )


def state_topic(settings: Any) -> str:
    """The handover topic of the launches topic's windowing state (co-partitioned)."""
    return f"{settings.topic_launches}.window-state"


@dataclass
class WindowAgentStats:
    """Progress of the window agent, for the worker's stats page and the benchmark."""

    batches: int = 0
    launches: int = 0
    launches_in_windows: int = 0
    windows: int = 0
    first_batch_at: float | None = None
    last_batch_at: float | None = None
    assigned_at: float | None = None
    assigned_partitions: int = 0
    handovers_out: int = 0
    handovers_in: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WindowIngest(Service):
    """Consumes launch batches a fetch at a time and feeds the windower."""

    def __init__(self, app: Any, ctx: WorkerContext, windower: Windower, **kw: Any) -> None:
        super().__init__(**kw)
        self.app, self.ctx, self.windower = app, ctx, windower
        self.settings = ctx.settings
        self.stats = WindowAgentStats()
        self._consumer: Any = None
        self._lock = asyncio.Lock()
        self._next: dict[Any, int] = {}  # tp -> next offset to process
        self._skip_below: dict[Any, int] = {}
        self._keys_of: dict[Any, set[str]] = {}  # tp -> stream keys seen in it
        self._committed_at = 0.0

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{u.host}:{u.port}" for u in self.app.conf.broker)

    async def on_start(self) -> None:
        from aiokafka import AIOKafkaConsumer

        s = self.settings
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=f"{s.app_id}.window",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(s.session_timeout_s * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
            rebalance_timeout_ms=int(s.session_timeout_s * 1000),
            max_partition_fetch_bytes=4 << 20,
            fetch_max_bytes=16 << 20,
            **s.kafka_client_kwargs(),
        )
        await self.ctx.topics["window_state"].maybe_declare()
        self._consumer.subscribe([s.topic_launches], listener=_Listener(self))
        await self._consumer.start()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        if self._consumer is None:
            return
        with contextlib.suppress(Exception):
            await self._hand_over(set(self._consumer.assignment()))
        await self._consumer.stop()

    async def _run(self) -> None:
        consumer = self._consumer
        while not self.should_stop:
            fetched = await consumer.getmany(timeout_ms=200)
            async with self._lock:
                for tp, msgs in fetched.items():
                    if tp not in self._next:
                        continue  # revoked while this fetch was in flight
                    skip = self._skip_below.get(tp, -1)
                    keys = self._keys_of.setdefault(tp, set())
                    for msg in msgs:
                        if msg.offset >= skip:
                            await self._process(msg, keys)
                    self._next[tp] = msgs[-1].offset + 1
                if time.monotonic() - self._committed_at >= _COMMIT_EVERY_S:
                    await self._commit(self._next)

    async def _process(self, msg: Any, keys: set[str]) -> None:
        stats, ctx = self.stats, self.ctx
        # The edge checks (schema, key, event-time bounds, known workload) dead-letter bad input.
        event = SimpleNamespace(message=msg, key=msg.key, value=msg.value)
        cols = await ctx.decode_launches("window", event)
        if cols is None:
            return
        now = time.time()
        n = len(cols)
        stats.batches += 1
        stats.launches += n
        ctx.counters["launches.in"] += n
        if stats.first_batch_at is None:
            stats.first_batch_at = now
        key = cols.meta.stream_key
        keys.add(key)
        for too_late in self.windower.add_columns(cols, now):
            ctx.counters["launches.late"] += len(too_late.t_end)
            await self.ctx.topics["late"].send(key=key.encode(), value=encode(too_late))
        closed = self.windower.poll_key(key)
        if closed:
            await self.publish(closed)
        stats.last_batch_at = time.time()

    async def publish(self, aggs: list[WindowAggregate]) -> None:
        windows = self.ctx.topics["windows"]
        for agg in aggs:
            self.stats.windows += 1
            self.stats.launches_in_windows += agg.count + agg.failures
            self.ctx.counters["windows.out"] += 1
            await windows.send(key=agg.stream_key.encode(), value=encode(agg))

    async def _commit(self, offsets: dict[Any, int]) -> None:
        self._committed_at = time.monotonic()
        if offsets:
            with contextlib.suppress(Exception):  # a rebalance in progress: next time
                await self._consumer.commit(dict(offsets))

    # -- handover -----------------------------------------------------------------

    async def _hand_over(self, revoked: set[Any]) -> None:
        """Write the state of ``revoked`` partitions' keys, commit their offsets, forget them."""
        async with self._lock:
            owned = [tp for tp in revoked if tp in self._next]
            if not owned:
                return
            for tp in owned:
                keys = self._keys_of.pop(tp, set())
                record = {
                    "partition": tp.partition,
                    "offset": self._next[tp],
                    "keys": self.windower.export_keys(keys),
                    "at": time.time(),
                }
                fut = await self.ctx.topics["window_state"].send(
                    key=b"state", value=orjson.dumps(record), partition=tp.partition
                )
                await fut
                self.windower.drop_keys(keys)
                self.stats.handovers_out += 1
            await self._consumer.commit({tp: self._next[tp] for tp in owned})
            for tp in owned:
                self._next.pop(tp, None)
                self._skip_below.pop(tp, None)

    async def _take_over(self, assigned: set[Any]) -> None:
        """Adopt the handed-over state of newly assigned partitions (when it matches)."""
        async with self._lock:
            self.stats.assigned_at = time.time()
            self.stats.assigned_partitions = len(assigned)
            if not assigned:
                return
            states = await _read_states(self, {tp.partition for tp in assigned})
            now = time.time()
            for tp in assigned:
                committed = await self._consumer.committed(tp)
                self._next[tp] = committed or 0
                self._keys_of[tp] = set()
                state = states.get(tp.partition)
                if state is None or committed is None or state["offset"] != committed:
                    continue  # nothing handed over (first start, or a crash: see module doc)
                self.windower.import_keys(state["keys"], now)
                self._keys_of[tp] = set(state["keys"])
                self._skip_below[tp] = int(state["offset"])
                self.stats.handovers_in += 1
            for key in {k for tp in assigned for k in self._keys_of[tp]}:
                closed = self.windower.poll_key(key)
                if closed:
                    await self.publish(closed)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, ingest: WindowIngest) -> None:
        self.ingest = ingest

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self.ingest._hand_over(set(revoked))
        except Exception:
            log.exception("window state handover failed for %s", sorted(map(str, revoked)))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self.ingest._take_over(set(assigned))
        except Exception:
            log.exception("window state takeover failed for %s", sorted(map(str, assigned)))


async def _read_states(ingest: WindowIngest, partitions: set[int]) -> dict[int, dict[str, Any]]:
    """The latest state record of each partition, read up to a marker written now."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic = state_topic(ingest.settings)
    marker = uuid.uuid4().hex.encode()
    for p in partitions:
        fut = await ingest.ctx.topics["window_state"].send(key=b"marker", value=marker, partition=p)
        await fut
    consumer = AIOKafkaConsumer(
        bootstrap_servers=ingest.bootstrap,
        enable_auto_commit=False,
        **ingest.settings.kafka_client_kwargs(),
    )
    await consumer.start()
    latest: dict[int, dict[str, Any]] = {}
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        pending = set(partitions)
        deadline = time.monotonic() + 30.0
        while pending and time.monotonic() < deadline:
            for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                for m in msgs:
                    if m.key == b"marker":
                        if m.value == marker:
                            pending.discard(tp.partition)
                    elif tp.partition in pending:
                        latest[tp.partition] = orjson.loads(m.value)
        if pending:
            log.warning("window state of partitions %s not read to the end", sorted(pending))
    finally:
        await consumer.stop()
    return latest


def register(app: Any, ctx: WorkerContext) -> tuple[Windower, WindowAgentStats]:
    windower = Windower(window_spec(ctx.settings))
    ingest = WindowIngest(app, ctx, windower)
    # A child of the app, not an ``app.service``: those start only after Faust's own
    # group join, and the two joins (each held by the broker) should overlap.
    app.add_dependency(ingest)

    @app.timer(0.2, name="window.tick")
    async def window_tick() -> None:
        async with ingest._lock:
            await ingest.publish(windower.flush_idle(time.time()))

    return windower, ingest.stats
