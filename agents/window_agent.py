"""Window agent: ks.launches -> ks.windows and ks.findings (+ ks.late, ks.deadletter).

Launch telemetry is the one high-rate stream, so it does not go through Faust's
per-message stream machinery (measured in bench/pipeline.py: its fetcher thread,
per-event futures and acks cost several times the decoding itself). The window
agent is a service inside the Faust worker that consumes ``ks.launches`` with a
plain aiokafka group consumer, a whole fetch at a time, and does per-batch work
only: decode the columnar batch with orjson straight into NumPy arrays
(:func:`schemas.columnar.decode_launch_columns`), hand the arrays to the
:class:`~agents.logic.windowing.Windower` (the batches that continue their streams
exactly, nearly all of them, a run at a time: :class:`~agents.logic.windowing.InOrderRun`),
publish the windows their watermarks closed through the Faust producer, each followed
by its finding (the detector runs inline: :mod:`agents.detector_agent`). A Faust timer
flushes idle keys.

Exactly-once window results without broker transactions (the embedded broker
has neither idempotent producers nor transactions):

* **Duplicates change nothing.** Nodes number each stream's launches without gaps
  or reuse and send a stream's batches in order, so the windower keeps, per stream,
  the highest sequence number it ingested (:meth:`Windower.seen_through`). A batch at
  or below it (a node's resent copy, a replay after a crash, a group offset reset)
  is not counted again: it goes to the dead-letter topic with reason code
  ``duplicate``. A batch that only overlaps is counted from its first new launch.
  Sequence numbers are trusted only within bounds (:mod:`agents.logic.sequencing`):
  an implausible jump is dead-lettered (``implausible_seq``) without moving the mark,
  and a batch newer than everything counted is never taken for a copy.
* **State and position move together.** Every ``checkpoint_interval_s`` the agent
  snapshots the windowing state of each partition's keys together with the
  partition's next offset, flushes the producer (every window, late slice and dead
  letter of the batches so far is acknowledged), writes each partition's snapshot
  as one atomically replaced file (:mod:`agents.window_checkpoints`; on a thread,
  while consuming goes on), and only then commits those offsets. After a
  ``kill -9`` the restarted worker restores the checkpoint and consumes from the
  committed offset (at or before the checkpoint): anything between the two is
  recognised as a duplicate, anything after it is new. No end offsets or
  time lookups are involved (the embedded broker's ListOffsets cannot be trusted).
* **Partition handover.** When a partition is revoked (rebalance, or a clean
  shutdown, done on Faust's ``on_before_shutdown`` while its producer still runs),
  its state record goes to the ``<launches>.window-state`` topic (same partition)
  before its offset is committed, split into messages of at most
  ``window_state_chunk_bytes`` (a busy partition's state outgrows a Kafka message;
  its reader reassembles the newest complete record, :class:`StateReassembler`). A new
  owner takes the newest state it can see, handed over on the topic or checkpointed
  locally, whose offset is at or after the committed offset. With neither (another
  worker crashed before any handover) the open windows of that partition are lost:
  counted as ``window.state_lost``.
* **Emission is at least once, identical copies.** Windows published after the last
  checkpoint and before a crash are published again after recovery, with the same
  content (the windower is deterministic given the same batches in the same
  order), under the same key. A consumer deduplicates by the window's identity
  ``(stream_key, window_start, config_id)`` (the detector's finding id is derived
  from it). Only an idle flush depends on processing time; a window flushed for
  idleness before a crash may be completed instead after recovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import ConsumerStoppedError, IllegalStateError
from mode import Service

from kernelstream.agents.context import RecordEvent, WorkerContext, partition_lag
from kernelstream.agents.detector_agent import InlineDetector
from kernelstream.agents.first_offset import seek_to_first
from kernelstream.agents.logic.compiled_windows import TAKE_OVER, CompiledWindows, Taken
from kernelstream.agents.logic.errors import SnapshotError
from kernelstream.agents.logic.ingest import (
    MAX_POLL_RECORDS,
    Counted,
    Refused,
    poll_records,
    window_partition,
)
from kernelstream.agents.logic.snapshot_codec import pack_parts, unpack
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.agents.logic.written import Written
from kernelstream.agents.window_checkpoints import CheckpointStore
from kernelstream.agents.window_consumer import EarlyConsumer
from kernelstream.schemas import LaunchBatch, SchemaError, WindowAggregate, encode, native
from kernelstream.schemas.binary import MAGIC as BINARY_MAGIC
from kernelstream.schemas.columnar import LaunchColumns

__all__ = ["WindowAgentStats", "WindowIngest", "register", "state_topic", "window_spec"]

log = logging.getLogger("kernelstream.window")

# How often the agent looks for offsets its consumer skipped (:meth:`WindowIngest._follow_skipped`).
_SKIP_CHECK_S = 0.5


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


def state_messages(record: bytes, chunk_bytes: int) -> list[tuple[bytes, bytes]]:
    """(key, value) messages carrying one partition's state record on the handover topic.

    A record that fits goes whole under key ``state``. A larger one (open windows hold
    16 bytes per launch, so a busy partition's state is megabytes, while the producer
    refuses messages over ``max_request_size`` and Kafka over ``message.max.bytes``,
    both about 1 MB by default) goes as consecutive chunks keyed
    ``chunk:<handover id>:<index>:<count>``.
    """
    if len(record) <= chunk_bytes:
        return [(b"state", record)]
    ident = uuid.uuid4().hex
    n = -(-len(record) // chunk_bytes)
    return [
        (f"chunk:{ident}:{i}:{n}".encode(), record[i * chunk_bytes : (i + 1) * chunk_bytes])
        for i in range(n)
    ]


# Launches per message on the late topic: a launch takes about 25 bytes of JSON, so a
# message stays near 500 kB, below the producer's default max_request_size (1,000,000).
_LATE_PART_LAUNCHES = 20_000


def late_parts(batch: LaunchBatch) -> list[LaunchBatch]:
    """``batch`` cut into messages small enough to publish (consecutive seq ranges)."""
    n = len(batch.t_end)
    if n <= _LATE_PART_LAUNCHES:
        return [batch]
    return [
        batch.model_copy(
            update={
                "seq_start": batch.seq_start + i,
                "t_end": batch.t_end[i : i + _LATE_PART_LAUNCHES],
                "duration_us": batch.duration_us[i : i + _LATE_PART_LAUNCHES],
                "ok": batch.ok[i : i + _LATE_PART_LAUNCHES],
            }
        )
        for i in range(0, n, _LATE_PART_LAUNCHES)
    ]


class StateReassembler:
    """The newest complete state record per partition, from the handover topic in order.

    A handover that stopped part way (its worker died) leaves chunks that are never
    completed: they are skipped, and the partition's offset was not committed for
    them, so an older record or a local checkpoint still covers it.
    """

    def __init__(self) -> None:
        self.latest: dict[int, bytes] = {}
        self._partial: dict[int, tuple[bytes, int, list[bytes]]] = {}

    def add(self, partition: int, key: bytes | None, value: bytes) -> None:
        if key == b"state":
            self.latest[partition] = value
            self._partial.pop(partition, None)
            return
        if key is None or not key.startswith(b"chunk:"):
            return  # markers, and anything this version does not know
        try:
            _, ident, index, count = key.split(b":")
            i, n = int(index), int(count)
        except ValueError:
            log.warning("ignoring a malformed window-state chunk key %r", key)
            return
        if i == 0:
            self._partial[partition] = (ident, n, [value])
        else:
            part = self._partial.get(partition)
            if part is None or part[0] != ident or len(part[2]) != i:
                self._partial.pop(partition, None)  # an interrupted handover
                return
            part[2].append(value)
        ident, n, chunks = self._partial[partition]
        if len(chunks) == n:
            self.latest[partition] = b"".join(chunks)
            del self._partial[partition]


@dataclass
class WindowAgentStats:
    """Progress of the window agent, for the worker's stats page and the benchmark."""

    batches: int = 0
    launches: int = 0
    launches_in_windows: int = 0
    windows: int = 0
    first_batch_at: float | None = None
    last_batch_at: float | None = None
    # The process's CPU time (all its threads, user + system) at those two moments: a
    # rate per core for the benchmark, whatever threads the process runs.
    cpu_at_first_batch: float | None = None
    cpu_at_last_batch: float | None = None
    # When the consumer poll that returned the first messages began, and the CPU time
    # then: that poll decompressed them, so a benchmark counts a system's work from
    # there (its peers and its ceiling are stamped the same way).
    first_poll_at: float | None = None
    cpu_at_first_poll: float | None = None
    assigned_at: float | None = None
    assigned_partitions: int = 0
    handovers_out: int = 0
    handover_messages_out: int = 0
    handovers_in: int = 0
    duplicates: int = 0
    checkpoints: int = 0
    restored_partitions: int = 0
    # Consumer polls that returned messages, and the messages they returned.
    polls: int = 0
    polled_messages: int = 0
    # Batches the compiled engine windowed (agents.logic.compiled_windows), of ``batches``,
    # and why it handed the others to the Python path, by reason.
    compiled_batches: int = 0
    compiled_stops: dict[str, int] = field(default_factory=dict)
    # Windows the compiled engine wrote with their findings (agents.logic.written), of
    # ``windows``.
    written_windows: int = 0
    # Where the agent's loop spends its time, seconds by stage, from the first batch on
    # (perf_counter twice per stage per batch: ~0.1 ns per launch). fetch = aiokafka
    # getmany with data (decompression included); decode = orjson + validation into
    # arrays; window = Windower.add_columns; close = the aggregate maths of the windows
    # a batch completed; emit = publishing them with their findings; checkpoint =
    # the state snapshot (the producer's flush and the file write run in the
    # background). Awaiting stages (fetch, emit) include what other tasks of the worker
    # ran meanwhile, that background work among them.
    stage_s: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("fetch", "decode", "window", "close", "emit", "checkpoint"), 0.0
        )
    )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class WindowIngest(Service):
    """Consumes launch batches a fetch at a time and feeds the windower."""

    def __init__(
        self,
        app: Any,
        ctx: WorkerContext,
        windower: Windower,
        detector: InlineDetector | None = None,
        early: EarlyConsumer | None = None,
        make_consumer: Callable[[], Any] | None = None,
        state_partitions: Callable[[int], Awaitable[None]] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.app, self.ctx, self.windower = app, ctx, windower
        # The steady streams' state in compiled code, where the install has it.
        self.compiled = CompiledWindows.of(windower)
        self.detector = detector
        if self.compiled is not None and detector is not None:
            # the engine writes the windows of the series the detector judges
            d = detector
            self.compiled.learn_from(d.detector, d.group_key, d.writable)
        self._early = early
        self._make_consumer = make_consumer
        self._state_partitions = state_partitions
        self.settings = ctx.settings
        self.stats = WindowAgentStats()
        # Set once the first assignment's state is restored: the first poll waits for it,
        # so that it, and the clock the benchmark starts there, begin with the data's work.
        self._taken_over = asyncio.Event()
        self._consumer: Any = None
        self._store: CheckpointStore | None = None
        self._lock = asyncio.Lock()
        self._next: dict[Any, int] = {}  # tp -> next offset to process
        self._keys_of: dict[Any, set[str]] = {}  # tp -> stream keys seen in it
        self._dirty: set[Any] = set()  # tps whose state changed since their checkpoint
        self._checkpointed_at = 0.0
        self._writing: asyncio.Future[None] | None = None  # a checkpoint being written
        # closed by this poll, not yet published
        self._held: list[WindowAggregate | Written] = []
        # Idleness (:meth:`tick`): per partition, the last two fetch-response stamps
        # seen (ms) and the time up to which it was read whole.
        self._stamps: dict[Any, tuple[int | None, int | None]] = {}
        self._read_through: dict[Any, float] = {}
        self._left = False
        self._skips_checked_at = 0.0
        self._uncommitted: set[Any] = set()  # tps the group had no committed offset for
        self._poll_records = MAX_POLL_RECORDS  # messages per poll (poll_records)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{u.host}:{u.port}" for u in self.app.conf.broker)

    @property
    def topic(self) -> str:
        return str(self.settings.topic_launches)

    async def on_start(self) -> None:
        s = self.settings
        log.info(
            "window agent: %s; steady streams windowed %s",
            native.describe(),
            "by the compiled engine" if self.compiled is not None else "in Python",
        )
        self._store = CheckpointStore(Path(s.data_dir) / "window-state")
        await self.ctx.topics["window_state"].maybe_declare()
        if self._early is not None:
            # Joined (or joining) since the process started (app/worker/start.py):
            # assignments received so far waited for this.
            self._consumer = self._early.consumer
            self._early.listener.attach(_Listener(self))
        else:
            if self._make_consumer is None:
                raise RuntimeError("the window agent needs a consumer or a way to make one")
            self._consumer = self._make_consumer()
            await self._consumer.start()  # then subscribe: the join runs in the background
            self._consumer.subscribe([s.topic_launches], listener=_Listener(self))
        # Faust stops its producer before its children: hand over while it still runs.
        self.app.on_before_shutdown.connect(self._on_app_shutdown)
        self.add_future(self._run())

    async def _on_app_shutdown(self, app: Any, **kwargs: Any) -> None:
        await self.leave()

    async def leave(self) -> None:
        """Hand every partition over and leave the group (a clean shutdown)."""
        if self._consumer is None or self._left:
            return
        self._left = True
        try:
            await self._settle()
            await self._hand_over(set(self._consumer.assignment()))
        except Exception:
            log.exception("window state handover at shutdown failed")
        await self._consumer.stop()

    def ready(self) -> bool:
        """Joined the group (an assignment, maybe empty, was received) and consuming."""
        return self._consumer is not None and not self._left and self.stats.assigned_at is not None

    def lag(self) -> dict[tuple[str, int], int]:
        """Messages not yet processed per owned partition (the last fetch's high watermark)."""
        return partition_lag(self._consumer, self._next)

    async def on_stop(self) -> None:
        await self.leave()
        if self._store is not None:
            self._store.close()
            self._store = None

    async def _run(self) -> None:
        consumer = self._consumer
        interval = self.settings.checkpoint_interval_s
        stats = self.stats
        stage = stats.stage_s
        while not (self.should_stop or self._left):
            if self.ctx.publish_error is not None:
                # windows or findings lost on their way to the broker: stop before a
                # checkpoint says they were published (the restart publishes them again)
                raise self.ctx.publish_error
            try:
                t0 = time.perf_counter()
                polled = None
                if stats.first_poll_at is None:
                    if not self._taken_over.is_set():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._taken_over.wait(), 0.2)
                        continue
                    polled = time.time(), time.process_time()
                fetched = await consumer.getmany(timeout_ms=200, max_records=self._poll_records)
                if fetched:
                    if polled is not None:
                        stats.first_poll_at, stats.cpu_at_first_poll = polled
                    stats.polls += 1
                    stats.polled_messages += sum(map(len, fetched.values()))
                    if stats.first_batch_at is not None:
                        # Not an empty poll or the wait for the first data: those are idle.
                        stage["fetch"] += time.perf_counter() - t0
            except ConsumerStoppedError:
                break
            launches_before = stats.launches
            async with self._lock:
                if self._left:
                    break
                for tp, msgs in fetched.items():
                    nxt = self._next.get(tp)
                    if nxt is None:
                        continue  # revoked while this fetch was in flight
                    keys = self._keys_of[tp]
                    if msgs[0].offset > nxt:  # deleted before they were read (retention)
                        self._skipped(tp, nxt, msgs[0].offset)
                    self._uncommitted.discard(tp)
                    # below nxt: a fetch from before a re-assignment
                    events = [RecordEvent(msg) for msg in msgs if msg.offset >= nxt]
                    await self.ingest(events, keys, publish=False)
                    self._next[tp] = max(nxt, msgs[-1].offset + 1)
                    self._dirty.add(tp)
                await self.publish_held()
                if time.monotonic() - self._skips_checked_at >= _SKIP_CHECK_S:
                    self._skips_checked_at = time.monotonic()
                    await self._follow_skipped(fetched)
                if fetched and stats.first_batch_at is not None:
                    stats.cpu_at_last_batch = time.process_time()
                if time.monotonic() - self._checkpointed_at >= interval:
                    t0 = time.perf_counter()
                    await self._checkpoint()
                    if stats.first_batch_at is not None:
                        stage["checkpoint"] += time.perf_counter() - t0
            if fetched:
                self._poll_records = poll_records(
                    stats.launches - launches_before, sum(map(len, fetched.values()))
                )
                # A turn of the event loop for the worker's other tasks after every poll:
                # aiokafka's getmany returns buffered records without suspending, so under
                # load the agent would otherwise run poll after poll while the findings it
                # published wait to be fetched and handed to the tuner.
                await asyncio.sleep(0)

    async def _follow_skipped(self, fetched: dict[Any, list[Any]]) -> None:
        """Move past offsets the consumer went past without returning their records.

        Records deleted before this worker read them (retention, or
        ``kafka-delete-records``, while it was down or behind) make the consumer reset
        to the log's start, which is after the next offset the agent expects. Where
        records follow, the next poll returns them and the agent sees the gap
        (:meth:`_skipped`); where none do, nothing below the consumer's position will
        ever be returned, so the agent's position follows the consumer's: else the
        partition would count as behind forever, its lag would never fall to zero, and
        its streams would never be idle, holding their open windows (those restored
        from a checkpoint included) open for good. Called after a poll's records were
        processed, so every record the consumer returned is below ``_next``: only a
        skip makes its position greater. Partitions the poll returned records of have
        just moved.
        """
        consumer = self._consumer
        for tp, nxt in list(self._next.items()):
            if tp in fetched:
                continue
            try:
                high = consumer.highwater(tp)
                if high is None or nxt >= high:
                    continue
                # Immediate unless the consumer is resetting its position; it then waits
                # for the reset (one ListOffsets round trip), bounded here.
                pos = await asyncio.wait_for(consumer.position(tp), 0.25)
            except (AssertionError, KeyError, IllegalStateError, TimeoutError):
                continue  # no longer assigned, or still resetting: the next poll
            if pos > nxt:
                self._skipped(tp, nxt, pos)
                self._next[tp] = pos
                self._dirty.add(tp)

    def _skipped(self, tp: Any, nxt: int, to: int) -> None:
        """Offsets ``nxt`` to ``to - 1`` of ``tp`` will never be read here: counted
        (``window.messages_skipped``, their launches are lost) and logged. Not for a
        partition the group had no committed offset for: it starts wherever its log
        starts, and what retention deleted before was never this group's to read."""
        if tp in self._uncommitted:
            self._uncommitted.discard(tp)
            return
        self.ctx.counters["window.messages_skipped"] += to - nxt
        log.warning(
            "%s[%d]: offsets %d to %d were never returned to this worker (deleted by "
            "retention before it read them, or a transaction's markers); going on from "
            "offset %d",
            tp.topic,
            tp.partition,
            nxt,
            to - 1,
            to,
        )

    async def _decode(self, events: list[Any]) -> list[LaunchColumns | None]:
        """The poll's batches decoded and checked at the edge (None: dead-lettered).

        Should the poll's decoding fail in a way nothing foresaw, each message is
        decoded again alone, so that only the one it fails on is dead-lettered
        (``internal_error``).
        """
        t0 = time.perf_counter()
        try:
            out = await self.ctx.decode_launches_many("window", events)
        except Exception:
            log.exception("decoding a poll of %d launch messages failed; one by one", len(events))
            out = [await self._decode_one(event) for event in events]
        self.stats.stage_s["decode"] += time.perf_counter() - t0
        return out

    async def _decode_one(self, event: Any) -> LaunchColumns | None:
        try:
            return await self.ctx.decode_launches("window", event)
        except Exception as ex:
            await self._internal_error(event, ex)
            return None

    async def _internal_error(self, event: Any, ex: Exception) -> None:
        msg = event.message
        log.error(  # the exception given (this may run outside its except block)
            "launch message %s[%d]@%d failed",
            msg.topic,
            msg.partition,
            msg.offset,
            exc_info=ex,
        )
        await self.ctx.dead_letter(
            "window", event, f"the worker failed on this message: {ex!r}", "internal_error"
        )

    async def ingest(self, events: list[Any], keys: set[str], *, publish: bool = True) -> None:
        """One partition's messages of a poll, in order. ``keys``: the partition's stream
        keys, to which those of the batches counted are added. The windows they close are
        published at the end (:meth:`publish_held`), or, with ``publish=False``, held
        for the caller to publish: the worker publishes a poll's windows of every
        partition together, one record batch per partition of the windows and findings
        topics (a findings partition takes the findings of many launches partitions).
        """
        await self._ingest(events, keys)
        if publish:
            await self.publish_held()

    async def publish_held(self) -> None:
        """Publish the windows closed since the last call (then their findings); then,
        every window published, the compiled engine takes writers for the series
        registered meanwhile (:meth:`CompiledWindows.write_registered`) and forgets the
        series nothing uses any more (:meth:`CompiledWindows.forget_unused`)."""
        if self._held:
            held, self._held = self._held, []
            t0 = time.perf_counter()
            await self.publish(held)
            self.stats.stage_s["emit"] += time.perf_counter() - t0
            self.stats.last_batch_at = time.time()
        compiled = self.compiled
        if compiled is None:
            return
        try:
            if compiled.registered:
                t0 = time.perf_counter()
                compiled.write_registered()
                # counted with publishing, as learn()'s writers are
                self.stats.stage_s["emit"] += time.perf_counter() - t0
            forgotten = compiled.forget_unused()
        except BaseException as ex:  # a Rust panic is a BaseException
            if not _engine_error(ex):
                raise
            self._engine_failed(ex)
            return
        if forgotten:
            self.ctx.counters["window.series_forgotten"] += forgotten

    async def _ingest(self, events: list[Any], keys: set[str]) -> None:
        """:meth:`ingest` but for publishing what it closed.

        Where the install has the compiled engine (:mod:`agents.logic.compiled_windows`),
        it windows the steady messages (the next binary batch of a stream it holds) and
        aggregates the windows they close, a run of them at a time; a message it does
        not take goes the Python way (:meth:`_ingest_general`), its stream given back to
        the Windower first, or, where the decoder passes a plain binary batch of a stream
        it does not hold yet, is taken over with its stream and tried again.
        """
        compiled = self.compiled
        if compiled is None:
            await self._ingest_general(events, keys)
            return
        values = [e.value for e in events]
        mkeys = [e.key for e in events]
        limits, max_bytes = self.ctx.launch_limits, self.settings.max_message_bytes
        stage = self.stats.stage_s
        i, n = 0, len(events)
        # the messages whose streams the engine was given, as decoded, by index
        given: dict[int, LaunchColumns] = {}
        # verdicts of the messages of streams the engine was not given, decoded at once
        ahead: dict[int, LaunchColumns | SchemaError] = {}
        looked_ahead = False
        while i < n:
            now = time.time()
            try:
                got = compiled.poll(
                    values,
                    mkeys,
                    i,
                    now,
                    now - limits.max_age_s,
                    now + limits.max_future_s,
                    max_bytes,
                    stage,
                )
            except BaseException as ex:  # a Rust panic is a BaseException
                if not _engine_error(ex):
                    raise
                self._engine_failed(ex)
                await self._ingest_general(events[i:], keys)
                return
            if got.taken:
                i += got.taken
                await self._counted_compiled(got, now)
            if got.stop is None:
                break
            stops = self.stats.compiled_stops
            stops[got.stop] = stops.get(got.stop, 0) + 1
            if i in given:
                # taken over, then refused: the Python way, decoded once
                await self._ingest_general([events[i]], keys, [given.pop(i)])
                i += 1
                continue
            if got.stop in TAKE_OVER:
                # a header or a stream the engine was not given: the decoder judges it
                if got.stop == "unregistered" and not looked_ahead:
                    # the first of the poll: the poll's first message of every header and
                    # key the engine was not given, decoded at once and given to it (new
                    # streams come many to a poll)
                    looked_ahead = True
                    failed: BaseException | None
                    try:
                        fresh = compiled.unregistered(values, mkeys, i)
                    except BaseException as ex:  # a Rust panic is a BaseException
                        if not _engine_error(ex):
                            raise
                        fresh, failed = [], ex
                    else:
                        ahead = await self._look_ahead(events, fresh)
                        failed = self._give(ahead, values, mkeys, keys, given, after=i)
                    if failed is not None:
                        self._engine_failed(failed)
                        await self._ingest_general(events[i:], keys)
                        return
                verdict = ahead.pop(i, None)
                if isinstance(verdict, SchemaError):
                    await self.ctx.dead_letter("window", events[i], str(verdict), verdict.code)
                    i += 1
                    continue
                if verdict is None:
                    [cols] = await self._decode([events[i]])
                    if cols is None:  # dead-lettered
                        i += 1
                        continue
                else:
                    cols = verdict
                try:
                    took = compiled.take(cols, values[i], mkeys[i])
                except Exception as ex:
                    self._engine_failed(ex)
                    await self._ingest_general(events[i:], keys)
                    return
                if took:
                    keys.add(cols.stream_key)
                    given[i] = cols
                    continue
                await self._ingest_general([events[i]], keys, [cols])
                i += 1
                continue
            # this message and those after it that are not binary batches: the Python way
            j = i + 1
            while j < n and not _binary(values[j]):
                j += 1
            await self._ingest_general(events[i:j], keys)
            i = j

    async def _look_ahead(
        self, events: list[Any], at: list[int]
    ) -> dict[int, LaunchColumns | SchemaError]:
        """The verdicts of the messages at ``at``, decoded at once; nothing dead-lettered
        (each refused one is when the engine stops at it, in order)."""
        if not at:
            return {}
        t0 = time.perf_counter()
        try:
            verdicts = self.ctx.launch_verdicts([events[j] for j in at])
        except Exception:
            log.exception("decoding %d launch messages ahead failed; one by one", len(at))
            return {}  # each decoded at its turn, where a failure is dead-lettered
        finally:
            self.stats.stage_s["decode"] += time.perf_counter() - t0
        return dict(zip(at, verdicts, strict=True))

    def _give(
        self,
        ahead: dict[int, LaunchColumns | SchemaError],
        values: list[Any],
        mkeys: list[Any],
        keys: set[str],
        given: dict[int, LaunchColumns],
        after: int,
    ) -> BaseException | None:
        """Give the engine the streams of the messages decoded ahead that passed, in
        order (:meth:`CompiledWindows.take`); what it took moves from ``ahead`` to
        ``given``, so that the message it then refuses goes the Python way decoded once.
        The message at ``after`` (the one the engine stopped at) is left to the caller.
        Returns what the engine raised, if it failed."""
        compiled = self.compiled
        assert compiled is not None
        for j, verdict in list(ahead.items()):
            if j == after or isinstance(verdict, SchemaError):
                continue
            try:
                took = compiled.take(verdict, values[j], mkeys[j])
            except Exception as ex:
                return ex
            if took:
                keys.add(verdict.stream_key)
                given[j] = verdict
                del ahead[j]
        return None

    def _engine_failed(self, ex: BaseException) -> None:
        """The compiled engine failed in a way nothing foresaw: logged, every stream it
        holds given back where it can be, and the worker windows in Python from here on
        (the same windows; launches the failed call had counted are recognised as
        duplicates, not counted twice)."""
        log.error("the compiled window engine failed; windowing in Python from now on", exc_info=ex)
        self.ctx.counters["window.engine_failed"] += 1
        compiled, self.compiled = self.compiled, None
        if compiled is None:
            return
        try:
            compiled.release_all()
        except BaseException as again:
            if not _engine_error(again):
                raise
            log.error(
                "the compiled engine's streams could not be given back: their open windows "
                "are lost",
                exc_info=again,
            )
            self.ctx.counters["window.state_lost"] += 1
        self.windower.held_elsewhere = None

    async def _counted_compiled(self, got: Taken, now: float) -> None:
        """:meth:`_counted` of the messages the compiled engine windowed."""
        stats, ctx = self.stats, self.ctx
        stats.batches += got.taken
        stats.compiled_batches += got.taken
        stats.launches += got.launches
        ctx.counters["launches.in"] += got.launches
        if stats.first_batch_at is None:
            stats.first_batch_at = now
            stats.cpu_at_first_batch = time.process_time()
        stats.last_batch_at = now
        self._held += got.closed

    async def _ingest_general(
        self,
        events: list[Any],
        keys: set[str],
        decoded: list[LaunchColumns | None] | None = None,
    ) -> None:
        """Messages the Python way, in order: decoded and checked at the edge (all at
        once, unless ``decoded`` already), their streams given back by the compiled
        engine, then windowed in order (:func:`agents.logic.ingest.window_partition`,
        replay's path too) and what each step closed published before the next is
        windowed.

        Consecutive batches that continue their streams exactly are windowed a run at a
        time, their streams' windows closed after them (``kernelstream bench
        worker-path``: the decode-and-window path 1.2x as fast at 182-launch batches, the
        same at 2,000); any other batch goes the general way, after the sequence rules.
        """
        if decoded is None:
            decoded = await self._decode(events)
        if self.compiled is not None:
            self.compiled.release({c.stream_key for c in decoded if c is not None})
        steps = window_partition(
            self.windower,
            [(e, c) for e, c in zip(events, decoded, strict=True) if c is not None],
            self.ctx.seq_limits,
            now=_clock,
            on_batch=self.detector.on_batch if self.detector is not None else None,
            stage_s=self.stats.stage_s,
        )
        for step in steps:
            if isinstance(step, Counted):
                await self._counted(step, keys)
            elif isinstance(step, Refused):
                await self._refused(step)
            else:
                await self._internal_error(step.item, step.error)

    async def _counted(self, step: Counted, keys: set[str]) -> None:
        """Progress, then the launches that came too late and the windows closed."""
        stats, ctx = self.stats, self.ctx
        now = time.time()
        launches = step.launches
        stats.batches += len(step.batches)
        stats.launches += launches
        ctx.counters["launches.in"] += launches
        if stats.first_batch_at is None:
            stats.first_batch_at = now
            stats.cpu_at_first_batch = time.process_time()
        if step.duplicates:
            ctx.counters["launches.duplicate"] += step.duplicates
        keys.update(c.stream_key for c in step.batches)
        stats.last_batch_at = now
        if not (step.late or step.closed):
            return
        t0 = time.perf_counter()
        for too_late in step.late:
            ctx.counters["launches.late"] += len(too_late.t_end)
            for part in late_parts(too_late):
                await ctx.send("late", too_late.stream_key.encode(), encode(part))
        self._held += step.closed
        stats.stage_s["emit"] += time.perf_counter() - t0
        stats.last_batch_at = time.time()

    async def _refused(self, step: Refused) -> None:
        """A batch the sequence rules refused, dead-lettered. The edge checks (size, JSON,
        schema, key, event-time bounds, workload, space) were made on the whole poll
        (:meth:`_decode`); this is the stream's sequence numbers
        (:mod:`agents.logic.sequencing`)."""
        if step.code == "duplicate":
            self.stats.duplicates += 1
            self.ctx.counters["launches.duplicate"] += len(step.verdict.cols)
        await self.ctx.dead_letter("window", step.item, step.verdict.reason, step.code)

    async def publish(self, aggs: Sequence[WindowAggregate | Written]) -> None:
        """The windows (one record each, keyed by stream), then their findings; those the
        compiled engine wrote (:class:`~agents.logic.written.Written`) as it wrote them.
        Then the engine learns the series of the windows it left to Python
        (:meth:`CompiledWindows.learn`)."""
        stats, ctx = self.stats, self.ctx
        records, launches = [], 0
        for agg in aggs:
            if isinstance(agg, Written):
                records.append((agg.key, agg.window))
                launches += agg.launches
                stats.written_windows += 1
            else:
                records.append((agg.stream_key.encode(), encode(agg)))
                launches += agg.count + agg.failures
        stats.windows += len(aggs)
        stats.launches_in_windows += launches
        ctx.counters["windows.out"] += len(aggs)
        await ctx.send_many("windows", records)
        now = time.time()
        for agg in aggs:
            ctx.window_latency.observe(now - agg.window_end)
        if self.detector is not None:
            await self.detector.on_windows(aggs)
            if self.compiled is not None:
                d = self.detector
                try:
                    unwritten = self.compiled.learn(d.detector, d.group_key, d.writable)
                    if unwritten:
                        ctx.counters["window.unwritten_series"] += unwritten
                except BaseException as ex:  # a Rust panic is a BaseException
                    if not _engine_error(ex):
                        raise
                    self._engine_failed(ex)

    async def tick(self) -> None:
        """Idle flushes (a timer): they change the state, so the next checkpoint has them.

        A stream is idle only for the time in which its partition was read up to date
        (:meth:`_note_read_through`): a worker catching up on a backlog, or one that was
        paused (a throttled container, a long pause of the process), has not yet read
        what the stream's node sent meanwhile, and must not close its windows short.
        """
        async with self._lock:
            read_through = self._note_read_through()
            now = time.time()
            if self.compiled is not None:
                self.compiled.release_idle(now, read_through)
            closed = self.windower.flush_idle(now, read_through)
            if closed:
                await self.publish(closed)
                self._dirty.update(self._next)

    def _note_read_through(self) -> Callable[[str], float] | None:
        """Per stream key, the processing time up to which its partition was read whole.

        aiokafka stamps each fetch response of a partition with the time it was handled
        (``last_poll_timestamp``) and keeps its high watermark. Once the agent has
        processed everything below that watermark, everything sent before the request
        for that response was read, and that request went out after the previous
        response was handled: so the partition was read whole up to the previous
        stamp this method saw (a later one, unseen, would only make it later). None
        when there is no consumer to ask (the stream's idleness is then plain
        processing time).
        """
        consumer = self._consumer
        if consumer is None:
            return None
        for tp, nxt in self._next.items():
            try:
                stamp, high = consumer.last_poll_timestamp(tp), consumer.highwater(tp)
            except (AssertionError, KeyError, IllegalStateError):  # no longer assigned
                continue
            if stamp is None or high is None:
                continue
            before, latest = self._stamps.get(tp, (None, None))
            if stamp != latest:
                before, latest = latest, stamp
                self._stamps[tp] = (before, latest)
            if before is not None and nxt >= high:
                self._read_through[tp] = before / 1000.0
        through = {
            key: self._read_through.get(tp, -math.inf)
            for tp, keys in self._keys_of.items()
            for key in keys
        }
        return lambda key: through.get(key, -math.inf)

    # -- checkpoints and handover ---------------------------------------------------

    def _state_record(self, tp: Any) -> bytes:
        return b"".join(self._state_parts(tp))

    def _state_parts(self, tp: Any) -> list[bytes | memoryview]:
        """The state record of ``tp`` (its streams' windowing state and the next offset),
        as :func:`agents.logic.snapshot_codec.pack_parts` gives it."""
        keys = self._keys_of.get(tp, ())
        return pack_parts(
            {
                "partition": tp.partition,
                "offset": self._next[tp],
                "keys": (
                    self.windower.export_keys(keys, arrays=True)
                    if self.compiled is None
                    else self.compiled.export_keys(keys)
                ),
                "at": time.time(),
            }
        )

    async def _checkpoint(self) -> None:
        """Snapshot state + offsets; flush the producer, write, then commit, meanwhile.

        The snapshot and the offsets are taken together here, so what is written
        describes exactly the batches processed so far. The rest runs while the agent
        goes on consuming (:meth:`_write`): the producer's flush (what these batches
        published must be on the broker before a checkpoint says they were processed:
        after a crash nothing before the checkpoint is redone), the file writes on a
        thread (:mod:`agents.window_checkpoints`), and the offset commit once their
        records are written. One write at a time: while one is still in flight the next
        checkpoint waits for a later batch.

        The snapshot's columns are written from their own buffers: the engine's export
        is a copy of its own, and the Windower's arrays are never changed in place.
        """
        if self._writing is not None and not self._writing.done():
            return
        self._checkpointed_at = time.monotonic()
        dirty = [tp for tp in self._dirty if tp in self._next]
        if not dirty or self._store is None:
            return
        records = {tp.partition: self._state_parts(tp) for tp in dirty}
        offsets = {tp: self._next[tp] for tp in dirty}
        self._dirty.clear()
        self._writing = asyncio.ensure_future(self._write(self._store, records, offsets))

    async def _write(
        self,
        store: CheckpointStore,
        records: dict[int, list[bytes | memoryview]],
        offsets: dict[Any, int],
    ) -> None:
        try:
            # Waits for the producer's open batches (up to its linger, then the broker's
            # acknowledgement): off the agent's path, which went on windowing meanwhile.
            await self.ctx.flush()
            await asyncio.to_thread(store.save, self.topic, records)
        except Exception:
            log.exception("window checkpoint write failed; the next checkpoint retries")
            self._dirty.update(tp for tp in offsets if tp in self._next)
            return
        self.stats.checkpoints += 1
        try:
            await self._consumer.commit(offsets)
        except Exception as ex:  # a rebalance in progress: the checkpoint covers it
            log.info("offset commit after checkpoint failed (%r); replays are deduplicated", ex)

    async def _settle(self) -> None:
        """Wait for a checkpoint being written (before the store or the assignment changes)."""
        if self._writing is not None:
            await self._writing
            self._writing = None

    async def _hand_over(self, revoked: set[Any]) -> None:
        """Publish the state of ``revoked`` partitions, commit their offsets, forget them."""
        async with self._lock:
            await self._settle()
            owned = [tp for tp in revoked if tp in self._next]
            if not owned:
                return
            if self.compiled is not None:
                self.compiled.release(k for tp in owned for k in self._keys_of.get(tp, ()))
            records = {tp: self._state_record(tp) for tp in owned}
            await self.ctx.flush()
            chunk = self.settings.window_state_chunk_bytes
            for tp in owned:
                futs = [
                    await self.ctx.send("window_state", key, value, tp.partition)
                    for key, value in state_messages(records[tp], chunk)
                ]
                await asyncio.gather(*futs)
                self.stats.handovers_out += 1
                self.stats.handover_messages_out += len(futs)
            if self._store is not None:  # no longer ours: a later owner's state supersedes
                self._store.delete(self.topic, [tp.partition for tp in owned])
            try:
                await self._consumer.commit({tp: self._next[tp] for tp in owned})
            except Exception as ex:  # the handed-over state is at or after what is committed
                log.warning("offset commit at handover failed (%r); replays are deduplicated", ex)
            for tp in owned:
                self.windower.drop_keys(self._keys_of.pop(tp, set()))
                self._next.pop(tp, None)
                self._uncommitted.discard(tp)
                self._dirty.discard(tp)
                self._stamps.pop(tp, None)
                self._read_through.pop(tp, None)

    async def _take_over(self, assigned: set[Any]) -> None:
        """Adopt the newest state of newly assigned partitions that covers their offsets."""
        async with self._lock:
            await self._settle()
            self.stats.assigned_at = time.time()
            self.stats.assigned_partitions = len(assigned)
            if not assigned:
                return
            if self._state_partitions is not None:
                # The handover topic may have fewer partitions than the launches topic
                # (it got the broker's count, or partitions were added): it grows first.
                await self._state_partitions(max(tp.partition for tp in assigned) + 1)
            handed = await _read_states(self, {tp.partition for tp in assigned})
            now = time.time()
            for tp in assigned:
                committed = await self._consumer.committed(tp)
                self._next[tp] = committed or 0
                if committed is None:
                    self._uncommitted.add(tp)
                    seek_to_first(self._consumer, [tp])  # not the broker's "beginning"
                self._keys_of[tp] = set()
                self._dirty.add(tp)
                try:
                    state = self._choose_state(tp, committed, handed.get(tp.partition))
                    if state is None:
                        continue
                    if self.compiled is not None:  # the state read supersedes its own
                        self.compiled.release(state["keys"])
                    self.windower.import_keys(state["keys"], now)
                except SnapshotError as ex:
                    # A state record whose windows do not restore (another version's, a
                    # foreign writer's; Windower.restore says which): what a lost state
                    # is, and a restart would read the same; the partition goes on from
                    # its committed offset.
                    self.ctx.counters["window.state_unreadable"] += 1
                    log.warning(
                        "window state of %s is unreadable (%r): its open windows are lost; "
                        "continuing from offset %s",
                        tp,
                        ex,
                        committed,
                    )
                    continue
                self._keys_of[tp] = set(state["keys"])
                self.stats.handovers_in += 1
                self.stats.restored_partitions += 1
            for key in {k for tp in assigned for k in self._keys_of[tp]}:
                closed = self.windower.poll_key(key)
                if closed:
                    await self.publish(closed)

    def _choose_state(
        self, tp: Any, committed: int | None, handed: bytes | None
    ) -> dict[str, Any] | None:
        local = self._store.load(self.topic, tp.partition) if self._store else None
        if committed is None:
            # No committed offset: a new group, or the embedded broker restarted and lost
            # every topic and offset. A local checkpoint describes records that are gone.
            if local is not None and self._store is not None:
                log.warning("discarding the local window state of %s: no committed offset", tp)
                self._store.delete(self.topic, [tp.partition])
            return None
        candidates = []
        for raw in (handed, local):
            if raw is None:
                continue
            try:
                state = unpack(raw)
            except SnapshotError as ex:
                log.warning("ignoring unreadable window state of %s: %s", tp, ex)
                continue
            if not (
                isinstance(state, dict)
                and type(state.get("offset")) is int
                and isinstance(state.get("keys"), dict)
            ):
                log.warning("ignoring window state of %s: not a window state record", tp)
                continue
            candidates.append(state)
        usable = [c for c in candidates if int(c["offset"]) >= committed]
        if usable:
            return max(usable, key=lambda c: int(c["offset"]))
        if committed > 0:
            # Its last owner crashed before handing it over and left no checkpoint here.
            self.ctx.counters["window.state_lost"] += 1
            log.warning(
                "no window state of %s at or after committed offset %d: open windows of its "
                "keys were lost (their last owner crashed); continuing from the offset",
                tp,
                committed,
            )
        return None


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
        except Exception as ex:
            # The state or the committed offsets could not be read (the broker): the
            # partitions are not set up, and consuming them as they are would skip
            # their messages. The worker stops, to restart and join again, as when
            # publishing fails (nothing is lost: offsets are committed after the work).
            log.exception("window state takeover failed for %s", sorted(map(str, assigned)))
            self.ingest._taken_over.set()
            await self.ingest.crash(ex)
            return
        self.ingest._taken_over.set()


def _engine_error(ex: BaseException) -> bool:
    """Whether ``ex`` is a failure of the compiled engine's (an exception, or a Rust panic,
    which PyO3 raises as a BaseException), not an interrupt or an exit."""
    return isinstance(ex, Exception) or type(ex).__name__ == "PanicException"


def _binary(value: Any) -> bool:
    """Whether a message value starts as a binary launch batch does."""
    return type(value) is bytes and value[:4] == BINARY_MAGIC


def _clock(_: Any) -> float:
    """The processing time of a batch, live: the clock when it is windowed."""
    return time.time()


async def _read_states(ingest: WindowIngest, partitions: set[int]) -> dict[int, bytes]:
    """The latest state record of each partition, read up to a marker written now."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic = state_topic(ingest.settings)
    marker = uuid.uuid4().hex.encode()
    for p in partitions:
        fut = await ingest.ctx.send("window_state", b"marker", marker, p)
        await fut
    consumer = AIOKafkaConsumer(
        bootstrap_servers=ingest.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **ingest.settings.kafka_client_kwargs(),
    )
    await consumer.start()
    states = StateReassembler()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        seek_to_first(consumer, tps)
        pending = set(partitions)
        deadline = time.monotonic() + 30.0
        while pending and time.monotonic() < deadline:
            for tp, msgs in (await consumer.getmany(timeout_ms=500)).items():
                for m in msgs:
                    if m.key == b"marker":
                        if m.value == marker:
                            pending.discard(tp.partition)
                    elif tp.partition in pending:
                        states.add(tp.partition, m.key, m.value)
        if pending:
            log.warning("window state of partitions %s not read to the end", sorted(pending))
    finally:
        await consumer.stop()
    return states.latest


def register(
    app: Any,
    ctx: WorkerContext,
    detector: InlineDetector | None = None,
    early: EarlyConsumer | None = None,
    make_consumer: Callable[[], Any] | None = None,
    state_partitions: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[Windower, WindowAgentStats]:
    windower = Windower(window_spec(ctx.settings))
    ingest = WindowIngest(app, ctx, windower, detector, early, make_consumer, state_partitions)
    # A child of the app, not an ``app.service``: those start only after Faust's own
    # group join, and the two joins (each held by the broker) should overlap.
    app.add_dependency(ingest)
    ctx.probes.update({"window.ready": ingest.ready, "window.lag": ingest.lag})

    @app.timer(0.2, name="window.tick")
    async def window_tick() -> None:
        await ingest.tick()

    return windower, ingest.stats
