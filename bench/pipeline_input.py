"""Benchmark input: a synthetic fleet's launch telemetry, batched the way nodes batch it.

Each node is a ``sim`` device (A100 and H100 alternating) running the four built-in
workloads at a fixed launch rate per kernel. Durations come from the sim model;
completion times are spread evenly over each 50 ms tick (event time). The real
:class:`kernels.runner.LaunchBatcher` turns the launches into batches by size and
by time, exactly as ``kernelstream node`` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kernels.backends.sim import SimDevice
from kernels.runner import LaunchBatcher, LaunchChunk
from schemas import LaunchBatch, encode

__all__ = ["FleetSpec", "fleet_batches", "per_record_messages", "produce_messages"]

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


def fleet_batches(spec: FleetSpec) -> Iterator[LaunchBatch]:
    """Launch batches in the order the fleet would publish them (tick by tick)."""
    fleet = []
    for i in range(spec.nodes):
        dev = SimDevice(_MODELS[i % 2], seed=i)
        batcher = LaunchBatcher(
            dev,
            f"{spec.node_prefix}-{i}",
            max_launches=spec.max_launches,
            max_delay_s=spec.max_delay_s,
        )
        fleet.append(
            (dev, batcher, dev.workloads(), dict.fromkeys(w.name for w in dev.workloads()), {})
        )
    per_tick = max(1, round(spec.launches_per_s_per_kernel * _TICK_S))
    ticks = max(1, round(spec.seconds / _TICK_S))
    for k in range(ticks):
        start = spec.t0 + k * _TICK_S
        now = start + _TICK_S
        t_end = start + (np.arange(per_tick) + 1.0) * (_TICK_S / per_tick)
        for dev, batcher, workloads, _, seqs in fleet:
            for w in workloads:
                cfg = w.space.start_config()
                res = dev.launch(w, cfg, per_tick)
                seq = seqs.get(w.name, 0)
                seqs[w.name] = seq + per_tick
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
                yield from batcher.add(chunk, now)
            yield from batcher.due(now)
    for _, batcher, *_ in fleet:
        yield from batcher.flush()


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
        **client_kwargs,  # type: ignore[arg-type]
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
