"""A peer: the windowed aggregates written as a Faust user would, NumPy per message.

Run as ``python -m kernelstream.bench.peer_faust`` with the benchmark's settings in the
environment. One agent reads the batched launch messages, turns each message's columns
into NumPy arrays (``orjson`` and ``np.asarray`` for JSON; for kernelstream's binary layout,
the project's own reader, :func:`schemas.binary.read_launch_batch`, whose columns are
``np.frombuffer`` views, and ``orjson`` for the per-batch fields), and keeps, per stream,
the durations of the launches that ran by (config, window); a window closes when the
stream's event time has passed its end plus the allowed lateness (the worker's watermark
rule), or when no message of any stream has come for ``idle_timeout_s`` (the input has
gone quiet). A closed window gives count,
mean and p95 (NumPy's default linear percentile) of its durations. Progress and the closed
windows are served as JSON on ``/ks/stats/`` and ``/ks/windows/``, so the benchmark can
check them against the worker.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import faust
import numpy as np
import orjson

from kernelstream.app.settings import load_settings
from kernelstream.app.worker.faust_app import faust_broker_kwargs, transport
from kernelstream.bench.pipeline_procs import peer_stats
from kernelstream.schemas.binary import is_binary, read_launch_batch

__all__ = ["main"]


def _stamp_first_poll(stats: dict[str, Any]) -> None:
    """Record in ``stats`` when the first consumer poll that returns messages began, and
    the process's CPU time then (``first_poll_at``, ``cpu_at_first_poll``).

    Faust's consumer thread polls aiokafka, which decompresses what a poll returns, and
    buffers it ahead of the agent: by the agent's first message, that poll's work is done.
    The benchmark counts from the poll's start, as it does for the worker.
    """
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    fetch = AIOKafkaConsumerThread._fetch_records

    async def _fetch_records(self: Any, *args: Any, **kwargs: Any) -> Any:
        polled = time.time(), time.process_time()
        records = await fetch(self, *args, **kwargs)
        if records and stats["first_poll_at"] is None:
            stats["first_poll_at"], stats["cpu_at_first_poll"] = polled
        return records

    AIOKafkaConsumerThread._fetch_records = _fetch_records  # type: ignore[method-assign]


def main() -> None:
    """Start the peer (blocks until stopped)."""
    s = load_settings()
    app = faust.App(
        s.app_id,
        broker=f"kafka://{s.bootstrap}",
        store="memory://",
        topic_partitions=s.partitions,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        web_port=s.web_port,
        web_bind="127.0.0.1",
        datadir=str(s.data_dir),
        **faust_broker_kwargs(s),
    )
    # The fetch wait the worker's own Faust agents use (Faust hardcodes 1.5 s, which the
    # embedded broker waits out in full): without it this agent idles most of its run.
    app.transport = transport(s, app)
    topic = app.topic(s.topic_launches, key_serializer="raw", value_serializer="raw")
    size, slack = s.window_s, s.allowed_lateness_s + s.out_of_orderness_s
    # stream -> (config, window) -> the durations that ran: a message closes only its own
    # stream's windows, so it looks at those alone.
    open_: dict[str, dict[tuple[str, int], list[np.ndarray]]] = defaultdict(
        lambda: defaultdict(list)
    )
    max_t: dict[str, float] = {}
    seen_at: dict[str, float] = {}
    closed: list[dict[str, Any]] = []
    stats = peer_stats()
    _stamp_first_poll(stats)

    def close(stream: str, before: float) -> None:
        windows = open_[stream]
        for k in [k for k in windows if (k[1] + 1) * size <= before]:
            d = np.concatenate(windows.pop(k))
            if d.size:
                closed.append(
                    {
                        "stream": stream,
                        "config_id": k[0],
                        "window_start": k[1] * size,
                        "count": int(d.size),
                        "mean": float(d.mean()),
                        "p95": float(np.percentile(d, 95)),
                    }
                )

    @app.agent(topic)
    async def aggregate(stream: Any) -> None:
        async for value in stream:
            if is_binary(value):
                batch = read_launch_batch(value)
                rec = orjson.loads(batch.meta_json)
                t, d = batch.columns["t_end"], batch.columns["duration_us"]
                ok = batch.columns["ok"].astype(bool)
            else:
                rec = orjson.loads(value)
                t = np.asarray(rec["t_end"], dtype=np.float64)
                d = np.asarray(rec["duration_us"], dtype=np.float64)
                ok = np.asarray(rec["ok"], dtype=bool)
            key = f"{rec['node']}:{rec['device_index']}/{rec['kernel']}"
            win = np.floor(t / size).astype(np.int64)
            windows = open_[key]
            for w in np.unique(win):
                windows[(rec["config_id"], int(w))].append(d[(win == w) & ok])
            max_t[key] = max(max_t.get(key, -np.inf), float(t.max()))
            close(key, max_t[key] - slack)
            now = time.time()
            seen_at[key] = now
            stats["launches"] += int(t.size)
            if stats["first_batch_at"] is None:
                stats["first_batch_at"] = now
                stats["cpu_at_first_batch"] = time.process_time()
            stats["last_batch_at"] = now
            stats["cpu_at_last_batch"] = time.process_time()

    @app.timer(interval=0.5)
    async def idle() -> None:
        # Idle once no message of any stream has come for the idle timeout: the input has
        # gone quiet. A stream's own last message would not do on a backlog: its next
        # batches may wait in another partition's turn longer than that, and its open
        # windows would close short (seen with a tuning fleet's input).
        now = time.time()
        if seen_at and now - max(seen_at.values()) >= s.idle_timeout_s:
            for key in list(seen_at):
                close(key, np.inf)
            seen_at.clear()

    @app.page("/ks/stats/")
    async def page(web: Any, request: Any) -> Any:
        return web.json({"window": stats})

    @app.page("/ks/windows/")
    async def windows(web: Any, request: Any) -> Any:
        return web.json(closed)

    app.main()


if __name__ == "__main__":
    import sys

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    main()
