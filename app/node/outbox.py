"""The node's durable state: an outbox for the broker, sequence numbers, replay memory.

One rocksdict (RocksDB) database per node holds

- the **outbox**: every message the node publishes (launch batches, outcomes, dead
  letters) is appended here first, by the launch loop, without touching the
  network. A separate task (:class:`OutboxSender`) sends it to Kafka and deletes
  it only once the broker acknowledged it. A broker outage or a node restart
  therefore loses nothing that reached the outbox, and the launch loop never
  waits for the broker;
- the **sequence numbers** of each launch stream (``node:device/kernel``), so a
  restarted node continues where it stopped and never reuses a sequence number;
- the **recommendation ids seen** by the reconfiguration agent, so a replayed
  recommendation is refused even after a restart.

Writes go through RocksDB's write-ahead log (one write batch per launch-loop
tick): they survive a crash or ``kill -9`` of the node process. They are not
fsynced, so an operating-system crash may lose the last moments.

**When the outbox is full** (``outbox_max_bytes`` or ``outbox_max_records``), the
*oldest launch batch* is dropped to make room. Why oldest: the launch loop must
never block, and for a tuner the newest telemetry is worth the most, while the
oldest is already stale by the time the broker is back. Control-plane messages
(outcomes, dead letters) are never dropped for telemetry. Every drop is counted
(``dropped_batches``, ``dropped_launches``) and reported, once the broker is back,
as one dead letter (stage ``node.outbox``) naming the streams and sequence ranges
lost, so the gap is visible downstream and never silent.

**Order and duplicates**: messages of one stream (topic and key) are sent one at
a time, in order; a message that failed is retried before any later message of
its stream, so each partition sees a stream's messages in sequence order. A send
whose acknowledgement was lost is sent again: the broker may then hold a message
twice (same bytes, same sequence numbers), and consumers deduplicate by
``(node, device, kernel, seq)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import errors as aiokafka_errors

from kernelstream.agents.retry_log import RetryLog, advice
from kernelstream.app.errors import ConfigError

__all__ = [
    "DurableSeenIds",
    "NodeStore",
    "Outbox",
    "OutboxEntry",
    "OutboxSender",
    "OutboxStats",
]

log = logging.getLogger("kernelstream.outbox")

_OUT = b"o/"  # outbox entries: o/<position, 8 bytes big-endian>
_SEQ = b"s/"  # next launch sequence number: s/<stream key>
_SEEN = b"r/"  # recommendation ids seen: r/<id> -> {"exp": expires_at, "off": offset}
_META = b"m/"  # counters and the pending drop report
_NO_KEY = 0xFFFFFFFF
_HEADER = struct.Struct(">BHIQI")  # flags, topic len, key len, seq_start, count
_DROPPABLE = 1
_MAX_OFFSETS_PER_ID = 100


@dataclass(frozen=True)
class OutboxEntry:
    """One message waiting for the broker (its bytes stay in the store)."""

    pos: int
    topic: str
    key: bytes | None
    size: int
    droppable: bool
    seq_start: int = 0
    count: int = 0

    @property
    def stream(self) -> tuple[str, bytes | None]:
        return (self.topic, self.key)


@dataclass
class OutboxStats:
    """Counters of the outbox; ``pending``/``pending_bytes`` are the current backlog."""

    appended: int = 0
    sent: int = 0
    send_failures: int = 0
    dropped_batches: int = 0
    dropped_launches: int = 0
    dropped_bytes: int = 0
    pending: int = 0
    pending_bytes: int = 0
    max_pending: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _pos_key(pos: int) -> bytes:
    return _OUT + pos.to_bytes(8, "big")


def _pack(entry: OutboxEntry, value: bytes) -> bytes:
    topic = entry.topic.encode()
    key = entry.key or b""
    head = _HEADER.pack(
        _DROPPABLE if entry.droppable else 0,
        len(topic),
        _NO_KEY if entry.key is None else len(key),
        entry.seq_start,
        entry.count,
    )
    return head + topic + key + value


def _unpack(pos: int, raw: bytes) -> tuple[OutboxEntry, bytes]:
    flags, tlen, klen, seq_start, count = _HEADER.unpack_from(raw)
    at = _HEADER.size
    topic = raw[at : at + tlen].decode()
    at += tlen
    key: bytes | None = None
    if klen != _NO_KEY:
        key = raw[at : at + klen]
        at += klen
    value = raw[at:]
    entry = OutboxEntry(
        pos, topic, key, len(value), bool(flags & _DROPPABLE), seq_start=seq_start, count=count
    )
    return entry, value


class NodeStore:
    """The node's RocksDB database. RocksDB locks the directory: one process per node id."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        try:
            self._db = Rdict(str(self.path), opts)
        except Exception as exc:  # rocksdict raises plain Exception, e.g. for a held lock
            raise ConfigError(
                f"cannot open the node's state in {self.path}: {exc}. Is another node with "
                "the same id running? Each node needs its own --node-id (or "
                "KERNELSTREAM_NODE_STATE_DIR)."
            ) from exc
        self._wopts = WriteOptions()  # WAL on, no fsync: survives a process crash

    # -- raw access (used by Outbox) ---------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        value = self._db.get(key)
        return None if value is None else bytes(value)

    def write(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes] = ()) -> None:
        """Apply puts and deletes atomically."""
        from rocksdict import WriteBatch

        wb = WriteBatch(raw_mode=True)
        for k, v in puts:
            wb.put(k, v)
        for k in deletes:
            wb.delete(k)
        self._db.write(wb, self._wopts)

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self._db.iter()
        it.seek(prefix)
        while it.valid():
            k = bytes(it.key())
            if not k.startswith(prefix):
                break
            yield k, bytes(it.value())
            it.next()

    # -- launch sequence numbers -------------------------------------------------
    def next_seqs(self) -> dict[str, int]:
        """The next sequence number of every launch stream this node ever published."""
        return {k[len(_SEQ) :].decode(): int(v) for k, v in self.scan(_SEQ)}

    @staticmethod
    def seq_puts(seqs: dict[str, int]) -> list[tuple[bytes, bytes]]:
        return [(_SEQ + k.encode(), str(v).encode()) for k, v in seqs.items()]

    def close(self) -> None:
        self._db.close()


class DurableSeenIds:
    """Recommendation ids seen, in the node's store: replay protection across restarts.

    Implements :class:`agents.logic.reconfiguration.SeenIds`. Each id keeps the
    offsets it was read and decided at, so a node re-reading its partition after
    a restart can tell its own re-read (same id, an offset already decided: skip
    quietly) from a new replay (same id at a new offset: reject in public).
    """

    def __init__(self, store: NodeStore) -> None:
        self.store = store

    def __contains__(self, rec_id: object) -> bool:
        return isinstance(rec_id, str) and self.store.get(_SEEN + rec_id.encode()) is not None

    def add(self, rec_id: str, expires_at: float, offset: int | None) -> None:
        """Remember ``rec_id`` and every offset it was read at (a replay is decided too)."""
        k = _SEEN + rec_id.encode()
        raw = self.store.get(k)
        offsets: list[int] = orjson.loads(raw)["offs"] if raw else []
        if offset is not None and offset not in offsets:
            offsets = [*offsets, offset][-_MAX_OFFSETS_PER_ID:]
        self.store.write([(k, orjson.dumps({"exp": expires_at, "offs": offsets}))])

    def handled(self, rec_id: str, offset: int) -> bool:
        """True if this id was already decided at this very offset (before a restart)."""
        raw = self.store.get(_SEEN + rec_id.encode())
        return raw is not None and offset in orjson.loads(raw)["offs"]

    def forget_expired(self, before: float) -> int:
        """Drop ids that expired before ``before``: an expired replay is refused as expired."""
        old = [k for k, v in self.store.scan(_SEEN) if orjson.loads(v)["exp"] < before]
        if old:
            self.store.write([], old)
        return len(old)


@dataclass
class _DropReport:
    batches: int = 0
    launches: int = 0
    bytes: int = 0
    ranges: dict[str, list[list[int]]] = field(default_factory=dict)


class Outbox:
    """A bounded, durable FIFO of messages, grouped into per-stream queues.

    ``append`` is synchronous and never touches the network: the launch loop calls
    it. :class:`OutboxSender` takes entries out in order and acknowledges them.
    """

    def __init__(
        self,
        store: NodeStore,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_records: int = 100_000,
        drop_topic: str | None = None,
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self.max_records = max_records
        self.drop_topic = drop_topic
        self.stats = OutboxStats()
        self._order: dict[int, OutboxEntry] = {}  # insertion order = position order
        self._streams: dict[tuple[str, bytes | None], deque[OutboxEntry]] = {}
        self._changed = asyncio.Event()
        self.in_flight: set[int] = set()  # positions the sender is sending: never dropped
        self._drops = _DropReport()
        self._next_pos = 0
        self._recover()

    def _recover(self) -> None:
        for k, raw in self.store.scan(_OUT):
            entry, _ = _unpack(int.from_bytes(k[len(_OUT) :], "big"), raw)
            self._index(entry)
            self._next_pos = entry.pos + 1
        saved = self.store.get(_META + b"drops")
        if saved:
            d = orjson.loads(saved)
            self._drops = _DropReport(d["batches"], d["launches"], d["bytes"], d["ranges"])
        if self._order:
            log.info("outbox: %d messages from before the restart to send", len(self._order))

    def _index(self, entry: OutboxEntry) -> None:
        self._order[entry.pos] = entry
        self._streams.setdefault(entry.stream, deque()).append(entry)
        self.stats.pending += 1
        self.stats.pending_bytes += entry.size
        self.stats.max_pending = max(self.stats.max_pending, self.stats.pending)

    def _unindex(self, entry: OutboxEntry) -> None:
        del self._order[entry.pos]
        q = self._streams[entry.stream]
        q.remove(entry)  # the head, except when a drop takes an older entry: O(1) then too
        if not q:
            del self._streams[entry.stream]
        self.stats.pending -= 1
        self.stats.pending_bytes -= entry.size

    # -- the launch loop's side --------------------------------------------------
    def append(
        self,
        messages: Iterable[tuple[str, bytes | None, bytes, bool, int, int]],
        extra_puts: Iterable[tuple[bytes, bytes]] = (),
    ) -> None:
        """Append ``(topic, key, value, droppable, seq_start, count)`` messages durably.

        ``extra_puts`` (e.g. the streams' next sequence numbers) are written in the
        same atomic write, so the store never holds one without the other.
        """
        puts = list(extra_puts)
        added: list[OutboxEntry] = []
        for topic, key, value, droppable, seq_start, count in messages:
            entry = OutboxEntry(self._next_pos, topic, key, len(value), droppable, seq_start, count)
            self._next_pos += 1
            puts.append((_pos_key(entry.pos), _pack(entry, value)))
            added.append(entry)
        if not puts:
            return
        self.store.write(puts)
        for entry in added:
            self._index(entry)
        self.stats.appended += len(added)
        self._evict()
        self._changed.set()

    def _evict(self) -> None:
        over = self.stats.pending_bytes > self.max_bytes or self.stats.pending > self.max_records
        if not over:
            return
        victims: list[OutboxEntry] = []
        nbytes, n = self.stats.pending_bytes, self.stats.pending
        for entry in self._order.values():  # oldest first
            if nbytes <= self.max_bytes and n <= self.max_records:
                break
            if entry.droppable and entry.pos not in self.in_flight:
                victims.append(entry)
                nbytes -= entry.size
                n -= 1
        if not victims:
            return
        d = self._drops
        for e in victims:
            self._unindex(e)
            d.batches += 1
            d.launches += e.count
            d.bytes += e.size
            stream = (e.key or b"").decode(errors="replace")
            ranges = d.ranges.setdefault(stream, [])
            if ranges and ranges[-1][1] == e.seq_start:
                ranges[-1][1] = e.seq_start + e.count
            else:
                ranges.append([e.seq_start, e.seq_start + e.count])
        self.stats.dropped_batches += len(victims)
        self.stats.dropped_launches += sum(e.count for e in victims)
        self.stats.dropped_bytes += sum(e.size for e in victims)
        drops = orjson.dumps(d.__dict__)
        self.store.write([(_META + b"drops", drops)], [_pos_key(e.pos) for e in victims])
        log.warning(
            "outbox full (%d messages, %d bytes): dropped the %d oldest launch batches",
            self.stats.pending,
            self.stats.pending_bytes,
            len(victims),
        )

    # -- the sender's side -------------------------------------------------------
    def heads(self, busy: set[tuple[str, bytes | None]]) -> list[OutboxEntry]:
        """The oldest entry of every stream not in ``busy``, oldest first."""
        heads = [q[0] for s, q in self._streams.items() if s not in busy]
        return sorted(heads, key=lambda e: e.pos)

    def value(self, entry: OutboxEntry) -> bytes | None:
        """The message bytes, or None if the entry was dropped meanwhile."""
        raw = self.store.get(_pos_key(entry.pos))
        return None if raw is None else _unpack(entry.pos, raw)[1]

    def ack(self, entry: OutboxEntry) -> None:
        """The broker has the message: forget it."""
        if entry.pos in self._order:
            self._unindex(entry)
            self.store.write([], [_pos_key(entry.pos)])
            self.stats.sent += 1
        self._changed.set()

    def take_drop_report(self) -> bytes | None:
        """The pending drop report as JSON (cleared), or None when nothing was dropped."""
        d = self._drops
        if not d.batches:
            return None
        report = orjson.dumps(d.__dict__)
        self._drops = _DropReport()
        self.store.write([], [_META + b"drops"])
        return report

    async def changed(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        self._changed.clear()

    def entries(self) -> list[OutboxEntry]:
        """Every entry waiting for the broker, oldest first."""
        return list(self._order.values())

    def __len__(self) -> int:
        return self.stats.pending


_PRODUCER_STATE_ERRORS: tuple[type[BaseException], ...] = (
    aiokafka_errors.OutOfOrderSequenceNumber,
    aiokafka_errors.UnknownProducerId,
    aiokafka_errors.InvalidProducerEpoch,
    aiokafka_errors.ProducerFenced,
)


class OutboxSender:
    """Sends the outbox to Kafka in its own task; the launch loop never awaits it.

    ``make_producer`` builds an (unstarted) aiokafka producer, asking the broker
    what it supports where it must; the sender starts it, retrying while the broker
    is unreachable, so a node may even start
    during an outage. ``on_drops`` turns a drop report into the message to
    publish (a dead letter) once the broker takes messages again.
    """

    def __init__(
        self,
        outbox: Outbox,
        make_producer: Callable[[], Awaitable[Any]],
        *,
        on_drops: Callable[[bytes], tuple[str, bytes | None, bytes]] | None = None,
        retry_backoff_s: float = 0.5,
    ) -> None:
        self.outbox = outbox
        self.make_producer = make_producer
        self.on_drops = on_drops
        self.retry_backoff_s = retry_backoff_s
        self.producer: Any = None
        self.connected = asyncio.Event()
        self._busy: set[tuple[str, bytes | None]] = set()
        self._retry_at: dict[tuple[str, bytes | None], float] = {}
        self._task: asyncio.Task[None] | None = None
        self._retry_log = RetryLog(log, "outbox (launches wait on disk)")
        self._renew = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox-sender")

    async def _start_producer(self) -> None:
        while True:
            producer = None
            try:
                producer = await self.make_producer()
                await producer.start()
                self.producer = producer
                self.connected.set()
                self._retry_log.recovered()
                return
            except BaseException as exc:
                # Also on cancellation (the node stopping while the broker is away): a
                # producer left unstopped warns "Unclosed AIOKafkaProducer" at exit.
                if producer is not None:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                if not isinstance(exc, Exception):
                    raise
                self._retry_log.failed(exc)
                await asyncio.sleep(self.retry_backoff_s)

    async def _run(self) -> None:
        await self._start_producer()
        while True:
            if self._renew:
                await self._renew_producer()
            now = time.monotonic()
            waiting = {s for s, t in self._retry_at.items() if t > now}
            for entry in self.outbox.heads(self._busy | waiting):
                await self._send(entry)
            await self.outbox.changed(self.retry_backoff_s)

    async def _send(self, entry: OutboxEntry) -> None:
        value = self.outbox.value(entry)
        if value is None:  # dropped while waiting
            return
        self._busy.add(entry.stream)
        self.outbox.in_flight.add(entry.pos)
        try:
            fut = await self.producer.send(entry.topic, value, key=entry.key)
        except Exception as exc:  # e.g. no metadata while the broker is down
            self._failed(entry, exc)
            return
        fut.add_done_callback(lambda f: self._done(entry, f))

    def _done(self, entry: OutboxEntry, fut: asyncio.Future[Any]) -> None:
        self.outbox.in_flight.discard(entry.pos)
        exc = None if fut.cancelled() else fut.exception()
        if fut.cancelled() or exc is not None:
            self._failed(entry, exc)
            return
        self._busy.discard(entry.stream)
        self._retry_at.pop(entry.stream, None)
        self.outbox.ack(entry)
        report = self.outbox.take_drop_report() if self.on_drops else None
        if report is not None and self.on_drops is not None:
            topic, key, value = self.on_drops(report)
            self.outbox.append([(topic, key, value, False, 0, 0)])

    async def _renew_producer(self) -> None:
        """Replace a producer whose idempotence state the broker rejected.

        aiokafka's idempotent producer keeps its producer id and sequence numbers
        after a batch expires; after a long outage the broker then answers
        OutOfOrderSequenceNumber to every later batch (measured: a node delivered
        nothing after Apache Kafka came back). A new producer gets a new id; the
        outbox resends in order and the window agent drops any copy by sequence.
        """
        self._renew = False
        old, self.producer = self.producer, None
        self.connected.clear()
        if old is not None:
            with contextlib.suppress(Exception):
                await old.stop()
        log.warning("outbox: producer state rejected by the broker; starting a new producer")
        await self._start_producer()

    def _failed(self, entry: OutboxEntry, exc: BaseException | None) -> None:
        if isinstance(exc, _PRODUCER_STATE_ERRORS):
            self._renew = True
        self.outbox.stats.send_failures += 1
        self.outbox.in_flight.discard(entry.pos)
        self._busy.discard(entry.stream)
        self._retry_at[entry.stream] = time.monotonic() + self.retry_backoff_s
        self.outbox._changed.set()
        if self.outbox.stats.send_failures % 100 == 1:
            hint = advice(exc)  # the broker refused this client: what to fix
            if hint is not None:
                log.warning(
                    "outbox: send to %s failed: %s; will retry in order",
                    entry.topic,
                    hint,
                )
            else:
                log.warning("outbox: send to %s failed (%s); will retry in order", entry.topic, exc)

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the outbox to empty; True if it did."""
        deadline = time.monotonic() + timeout_s
        # Polls: the outbox's change event belongs to the sender loop.
        while len(self.outbox) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        return not len(self.outbox)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.stop()
