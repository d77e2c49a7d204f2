"""Benchmark input: a synthetic fleet's launch telemetry, batched the way nodes batch it.

Each node is a ``sim`` device (A100 and H100 alternating) running the four built-in
workloads at a fixed launch rate per kernel. Durations come from the sim model;
completion times are spread evenly over each 50 ms tick (event time). The real
:class:`kernels.runner.LaunchBatcher` turns the launches into batches by size and
by time, exactly as ``kernelstream node`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelstream.app.kafka.partitioner import CachedKeyPartitioner
from kernelstream.kernels.backends.sim import SimDevice
from kernelstream.kernels.runner import LaunchBatcher, LaunchChunk, NodeBatch
from kernelstream.schemas import LaunchBatch, encode

__all__ = [
    "FleetSpec",
    "LiveFleet",
    "fleet_batches",
    "fleet_events",
    "fleet_node_batches",
    "node_cost",
    "per_record_messages",
    "produce_messages",
    "recent_t0",
]

_MODELS = ("A100-SXM4-80GB", "H100-SXM5-80GB")
_TICK_S = 0.05


@dataclass(frozen=True)
class FleetSpec:
    """How much telemetry, from how many nodes, batched how."""

    nodes: int = 16
    launches_per_s_per_kernel: float = 20_000.0
    seconds: float = 6.0
    max_launches: int = 2000
    max_delay_s: float = 0.1
    t0: float = 1.79e9
    node_prefix: str = "bench"
    # Seconds of event time between a kernel's moves to another configuration of its
    # space (a tuning fleet's: each move starts a new series, a stream and
    # configuration); None: every kernel keeps its start configuration.
    config_every_s: float | None = None


def recent_t0(seconds: float) -> float:
    """An input start time the worker accepts: event times a little in the past.

    Workers refuse event times far from their own clock (dead letter
    ``bad_timestamp``), so pre-produced input must be recent, not a fixed date.
    """
    import time

    return float(int(time.time() - seconds - 30.0))


def fleet_batches(spec: FleetSpec) -> Iterator[LaunchBatch]:
    """Launch batches in the order the fleet would publish them (tick by tick)."""
    return (b.record() for b in fleet_node_batches(spec))


def fleet_node_batches(spec: FleetSpec) -> Iterator[NodeBatch]:
    """:func:`fleet_batches` as the nodes hold them before publishing."""
    devices = _devices(spec)
    yield from _batched(fleet_events(spec, devices), _batchers(spec, devices))


def _batched(
    events: Iterable[tuple[int, float, LaunchChunk | None]], batchers: list[LaunchBatcher]
) -> Iterator[NodeBatch]:
    """The batches each node's batcher closes over ``events`` (:func:`fleet_events`), then
    its open ones."""
    for i, now, chunk in events:
        yield from batchers[i].add(chunk, now) if chunk is not None else batchers[i].due(now)
    for batcher in batchers:
        yield from batcher.flush()


def _devices(spec: FleetSpec) -> list[SimDevice]:
    return [SimDevice(_MODELS[i % 2], seed=i) for i in range(spec.nodes)]


def _batchers(spec: FleetSpec, devices: list[SimDevice]) -> list[LaunchBatcher]:
    return [
        LaunchBatcher(
            dev,
            f"{spec.node_prefix}-{i}",
            max_launches=spec.max_launches,
            max_delay_s=spec.max_delay_s,
        )
        for i, dev in enumerate(devices)
    ]


def fleet_events(
    spec: FleetSpec, devices: list[SimDevice]
) -> Iterator[tuple[int, float, LaunchChunk | None]]:
    """What each node's batcher is handed, in order: ``(node, now, chunk)``, and after a
    node's tick ``(node, now, None)``, its check for batches due."""
    workloads = [dev.workloads() for dev in devices]
    seqs: list[dict[str, int]] = [{} for _ in devices]
    per_tick = max(1, round(spec.launches_per_s_per_kernel * _TICK_S))
    ticks = max(1, round(spec.seconds / _TICK_S))
    moves = _config_moves(spec, workloads)
    for k in range(ticks):
        start = spec.t0 + k * _TICK_S
        now = start + _TICK_S
        t_end = start + (np.arange(per_tick) + 1.0) * (_TICK_S / per_tick)
        for i, dev in enumerate(devices):
            for w in workloads[i]:
                cfg = moves(i, w, k)
                res = dev.launch(w, cfg, per_tick)
                seq = seqs[i].get(w.name, 0)
                seqs[i][w.name] = seq + per_tick
                chunk = LaunchChunk(
                    w.name,
                    w,
                    dict(cfg),
                    w.space.config_id(cfg),
                    seq,
                    t_end.copy(),
                    res.duration_us,
                    res.ok,
                )
                yield i, now, chunk
            yield i, now, None


def _config_moves(
    spec: FleetSpec, workloads: list[list[Any]]
) -> Callable[[int, Any, int], dict[str, Any]]:
    """The configuration node ``i``'s kernel ``w`` runs at tick ``k``: its space's start
    configuration, or, with ``spec.config_every_s``, the next of its space's
    configurations (in the space's order, from the start one, round and round) every
    that many seconds. Each node starts at its own place, so a fleet's kernels do not move
    in step through the same configurations."""
    if spec.config_every_s is None:
        return lambda i, w, k: w.space.start_config()
    every = max(1, round(spec.config_every_s / _TICK_S))
    spaces: dict[str, list[dict[str, Any]]] = {}
    for ws in workloads:
        for w in ws:
            if w.name not in spaces:
                start = w.space.start_config()
                rest = [c for c in w.space if c != start]
                spaces[w.name] = [start, *rest]

    def moves(i: int, w: Any, k: int) -> dict[str, Any]:
        configs = spaces[w.name]
        step = k // every
        return configs[(i + step) % len(configs)] if step else configs[0]

    return moves


def node_cost(spec: FleetSpec, *, rounds: int = 3) -> dict[str, Any]:
    """A node's CPU per launch to batch its launches and to encode the messages in each
    wire format (best of ``rounds``). The device's work (here the sim model) is done
    beforehand: the times are the node's telemetry path alone, :class:`LaunchBatcher` and
    :meth:`NodeBatch.wire`. Also the message bytes per launch, raw and zstd-compressed,
    and, side by side, the binary message encoded from the validated record
    (:meth:`NodeBatch.record`, then :func:`schemas.binary.encode_launch_batch`): what a
    node that builds the record of every batch pays on top of batching."""
    import time

    from aiokafka import codec

    from kernelstream.schemas.binary import encode_launch_batch

    devices = _devices(spec)
    events = list(fleet_events(spec, devices))
    batch_s = record_s = float("inf")
    encode_s = {"json": float("inf"), "binary": float("inf")}
    out: list[NodeBatch] = []
    for _ in range(rounds):
        batchers = _batchers(spec, devices)
        t0 = time.perf_counter()
        out = list(_batched(events, batchers))
        batch_s = min(batch_s, time.perf_counter() - t0)
        for wire in encode_s:
            t0 = time.perf_counter()
            for b in out:
                b.wire(wire == "binary")
            encode_s[wire] = min(encode_s[wire], time.perf_counter() - t0)
        t0 = time.perf_counter()
        for b in out:
            encode_launch_batch(b.record())
        record_s = min(record_s, time.perf_counter() - t0)
    n = sum(map(len, out))
    formats = {}
    for wire, seconds in encode_s.items():
        values = [b.wire(wire == "binary") for b in out]
        formats[wire] = {
            "ns_per_launch": seconds / n * 1e9,
            "bytes_per_launch": sum(map(len, values)) / n,
            "zstd_bytes_per_launch": sum(len(codec.zstd_encode(v)) for v in values) / n,
        }
    return {
        "launches": n,
        "batches": len(out),
        "batch_ns_per_launch": batch_s / n * 1e9,
        "encode": formats,
        "binary_through_record_ns_per_launch": record_s / n * 1e9,
    }


def per_record_messages(batch: LaunchBatch) -> Iterator[bytes]:
    """The same launches one record per message, as a per-record producer would send them."""
    import orjson

    meta = batch.to_wire()
    for key in ("t_end", "duration_us", "ok", "samples"):
        meta.pop(key, None)
    meta["schema"] = "ks.launch/1"
    for i, (t, d, o) in enumerate(zip(batch.t_end, batch.duration_us, batch.ok, strict=True)):
        yield orjson.dumps(
            meta | {"seq": batch.seq_start + i, "t_end": t, "duration_us": d, "ok": o}
        )


async def produce_messages(
    bootstrap: str, topic: str, items: list[tuple[bytes, bytes]], **client_kwargs: object
) -> None:
    """Produce ``(key, value)`` pairs as fast as the broker takes them, then flush."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=8 * 1024 * 1024,
        **client_kwargs,
    )
    await producer.start()
    try:
        pending = []
        for key, value in items:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 2000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


def encoded(batches: list[LaunchBatch]) -> list[tuple[bytes, bytes]]:
    return [(b.stream_key.encode(), encode(b)) for b in batches]


# -- live input at a held rate --------------------------------------------------------

_SENTINEL_SEC = 1111111111  # ten digits, like every event time until 2286
_SENTINEL_SEQ = 987654321012


class LiveFleet:
    """A real-time fleet whose messages are encoded once and re-sent with new times.

    Encoding launch batches (pydantic + orjson) costs more than the worker spends
    on them, so a generator that encodes as it goes cannot feed the worker at a
    high rate on the same small machine. Here every stream key gets ``per_s``
    batches that together cover one second of event time (launches evenly spaced,
    batch ``j`` covering ``[j/per_s, (j+1)/per_s)`` of the second), encoded once
    with a sentinel integer second and a sentinel ``seq_start``. Sending second
    ``S`` is two ``bytes.replace`` calls per message: the event times become
    ``S + fraction`` and sequence numbers keep counting per stream, so the worker
    sees a continuous, in-order, never-repeated stream.

    ``close_at_s``, when given, is where in each second a worker window closes
    (out-of-orderness + allowed lateness past a window end, 1 s windows): as
    ``kernelstream node`` does (:class:`app.node.WindowClosePoints`), the batch
    open at that point is sent there, split in two, so each second has one more,
    smaller batch. Launch times are the same either way.

    Args:
        rate: launches per second, all streams together.
        nodes: simulated nodes (4 workloads each, A100/H100 alternating).
        max_launches: the nodes' batch size limit.
        max_delay_s: the nodes' batch time limit (a batch is sent when it closes).
        node_prefix: node names are ``<prefix>-<i>``.
        close_at_s: fraction of each second where the nodes send their open batches.
    """

    def __init__(
        self,
        rate: float,
        *,
        nodes: int = 16,
        max_launches: int = 2000,
        max_delay_s: float = 0.1,
        node_prefix: str = "bench",
        close_at_s: float | None = None,
    ) -> None:
        import math

        metas: dict[str, LaunchBatch] = {}
        spec = FleetSpec(nodes=nodes, seconds=0.05, max_delay_s=0.05, node_prefix=node_prefix)
        for batch in fleet_batches(spec):
            metas.setdefault(batch.stream_key, batch)
        self.streams = sorted(metas)
        per_key = rate / len(self.streams)
        self.per_s = max(math.ceil(1.0 / max_delay_s), math.ceil(per_key / max_launches))
        self.launches_per_message = max(1, round(per_key / self.per_s))
        self.rate = self.launches_per_message * self.per_s * len(self.streams)
        n = self.launches_per_message
        # The launches of one second: batch j's are at (j + (i + 0.5) / n) / per_s,
        # to the microsecond as nodes send them (kernels.runner's wire precision).
        self._times = np.round(
            (np.repeat(np.arange(self.per_s), n) + np.tile((np.arange(n) + 0.5) / n, self.per_s))
            / self.per_s,
            6,
        )
        # Slices of that array sent as one message each: (first, end, send fraction).
        self.slices: list[tuple[int, int, float]] = [
            (j * n, (j + 1) * n, (j + 1) / self.per_s) for j in range(self.per_s)
        ]
        if close_at_s is not None and 0.0 <= close_at_s < 1.0:
            # The batch is sent with the first launch that reaches the close point.
            cut = int(np.searchsorted(self._times, close_at_s, side="left")) + 1
            for i, (a, b, end) in enumerate(self.slices):
                if a < cut < b:
                    self.slices[i : i + 1] = [(a, cut, float(self._times[cut - 1])), (cut, b, end)]
                    break
        # [j] -> per stream: key, bytes before seq_start, the rest split at the second
        self.templates: list[list[tuple[bytes, bytes, list[bytes]]]] = []
        for a, b, _ in self.slices:
            m = b - a
            row = []
            for key in self.streams:
                meta = metas[key]
                dur = np.resize(np.asarray(meta.duration_us), m)
                batch = meta.model_copy(
                    update={
                        "t_end": (_SENTINEL_SEC + self._times[a:b]).tolist(),
                        "duration_us": dur.tolist(),
                        "ok": [1] * m,
                        "seq_start": _SENTINEL_SEQ,
                        "samples": [],
                    }
                )
                value = encode(batch)
                if value.count(b"%d." % _SENTINEL_SEC) != m:
                    raise RuntimeError("an event time of a template left its second")
                # Split once at the sentinels: sending is then a join (one copy, no search).
                head, tail = value.split(b'"seq_start":%d' % _SENTINEL_SEQ)
                row.append((key.encode(), head, tail.split(b"%d." % _SENTINEL_SEC)))
            self.templates.append(row)
        self._seq = dict.fromkeys(self.streams, 0)
        # (second, j) -> when batch j of that second was handed to the producer
        self.sent_at: dict[tuple[int, int], float] = {}

    def window_times(self, second: int) -> np.ndarray:
        """Event times of one stream's launches in ``[second, second + 1)``."""
        return second + self._times

    def messages(self, second: int, j: int) -> list[tuple[bytes, bytes]]:
        """Batch ``j`` of ``second`` for every stream, ready to send."""
        sec = b"%d." % second
        a, b, _ = self.slices[j]
        out = []
        for key, (k, head, parts) in zip(self.streams, self.templates[j], strict=True):
            seq = self._seq[key]
            self._seq[key] = seq + (b - a)
            out.append((k, b"".join((head, b'"seq_start":%d' % seq, sec.join(parts)))))
        return out

    def closing_batch(self, second: int, window_s: float, slack_s: float) -> tuple[int, int]:
        """The first batch ``(second, j)`` whose newest launch reaches ``second + window_s +
        slack_s`` (slack: out-of-orderness + allowed lateness): the batch that closes the
        window ``[second, second + window_s)`` of every stream."""
        need = second + window_s + slack_s
        s = second
        while True:
            for j, (_, b, _) in enumerate(self.slices):
                if s + self._times[b - 1] >= need:
                    return s, j
            s += 1

    def send_time(self, second: int, j: int) -> float:
        """When a node sends batch ``j`` of ``second``: as its last launch completes."""
        return second + self.slices[j][2]

    async def prebuild(
        self, producer: Any, topic: str, start_second: int, seconds: int
    ) -> list[tuple[tuple[int, int], list[tuple[int, Any]], int]]:
        """``seconds`` seconds of input from ``start_second``, compressed into Kafka record
        batches now, for :meth:`replay` to send on schedule.

        A generator that compresses as it sends (zstd over ~125 MB/s of JSON at 90% of a
        worker's capacity here) takes a third of a core on the machine whose cores the
        broker and the worker share; the nodes it stands for compress on their own
        machines. Built ahead, each batch is what the nodes' producer would have sent (the
        same messages, keys, partitions, compression and record timestamps), and sending
        it costs a produce request. Returns ``((second, j), [(partition, batch)],
        launches)`` in send order; the stream sequence numbers advance as if sent.
        """
        partitions = sorted(await producer.partitions_for(topic))
        where = CachedKeyPartitioner()
        plan = []
        for i in range(seconds):
            second = start_second + i
            for j, (a, b, _) in enumerate(self.slices):
                stamp = int(self.send_time(second, j) * 1000)
                open_: dict[int, Any] = {}
                built: list[tuple[int, Any]] = []
                for k, v in self.messages(second, j):
                    p = where(k, partitions, partitions)
                    batch = open_.get(p)
                    if batch is None or batch.append(timestamp=stamp, key=k, value=v) is None:
                        if batch is not None:
                            built.append((p, batch))
                        batch = open_[p] = producer.create_batch()
                        if batch.append(timestamp=stamp, key=k, value=v) is None:
                            raise RuntimeError("a launch message exceeds the producer's batch size")
                built += open_.items()
                for _, batch in built:
                    batch._build()  # compress now (aiokafka keeps the built buffer)
                plan.append(((second, j), built, (b - a) * len(self.streams)))
            await asyncio.sleep(0)
        return plan

    async def build_time(self, producer: Any, topic: str) -> float:
        """Seconds :meth:`prebuild` takes per second of input, measured on a throwaway
        second (the sequence numbers are left as they were)."""
        import time

        seqs = dict(self._seq)
        t0 = time.perf_counter()
        await self.prebuild(producer, topic, int(time.time()), 1)
        self._seq = seqs
        return time.perf_counter() - t0

    async def replay(
        self, producer: Any, topic: str, plan: list[tuple[tuple[int, int], list[Any], int]]
    ) -> int:
        """Send :meth:`prebuild`'s batches in real time, each when its node would send it;
        return launches sent. Each second's deliveries are gathered before the next."""
        import time

        sent = 0
        pending: list[Any] = []
        last = len(self.slices) - 1
        for (second, j), batches, n in plan:
            wait = self.send_time(second, j) - time.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self.sent_at[(second, j)] = time.time()
            for p, batch in batches:
                pending.append(await producer.send_batch(batch, topic, partition=p))
            sent += n
            if j == last:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        return sent

    async def run(
        self,
        producer: Any,
        topic: str,
        start_second: int,
        seconds: int,
        on_second: Callable[[int], Awaitable[None]] | None = None,
    ) -> int:
        """Send ``seconds`` seconds of input in real time; return launches sent.

        ``on_second(second_index)`` (an async callable), when given, runs once per
        second of input (sampling). Sends are not awaited one by one: the producer
        batches them, and each second's futures are gathered before the next.
        """
        import time

        sent = 0
        pending: list[Any] = []
        for i in range(seconds):
            second = start_second + i
            for j, (a, b, _) in enumerate(self.slices):
                wait = self.send_time(second, j) - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.sent_at[(second, j)] = time.time()
                for k, v in self.messages(second, j):
                    pending.append(await producer.send(topic, v, key=k))
                sent += (b - a) * len(self.streams)
            await asyncio.gather(*pending)
            pending.clear()
            if on_second is not None:
                await on_second(i)
        return sent
