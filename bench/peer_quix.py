"""A peer: the windowed aggregates as a Quix Streams application, its tumbling windows.

Run as ``python -m kernelstream.bench.peer_quix`` with the benchmark's settings in the
environment. The application reads the batched launch messages (JSON), expands each
into one record per launch that ran (Quix windows take one event time per record),
sets the record's timestamp to the launch's end time, and collects durations per
stream key in tumbling windows of ``window_s`` with the worker's lateness as grace,
emitted when final. Each closed window gives count, mean and p95 (NumPy's default
linear percentile) per configuration. Windows are kept in Quix's RocksDB state without
changelog topics (the Faust peer keeps its windows in memory). Progress and closed
windows are served as JSON on ``/ks/stats/`` and ``/ks/windows/``.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import orjson
from quixstreams import Application
from quixstreams.dataframe.windows import Collect

from kernelstream.app.settings import load_settings
from kernelstream.bench.pipeline_procs import peer_stats

__all__ = ["main"]


def _serve(port: int, stats: dict[str, Any], closed: list[dict[str, Any]]) -> None:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = orjson.dumps({"window": stats} if self.path == "/ks/stats/" else closed)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def _stamp_assignment(stats: dict[str, Any]) -> None:
    """Record in ``stats`` when the application first got partitions, and the process's
    CPU time then (as ``first_poll_at``, ``cpu_at_first_poll``).

    Quix Streams consumes with librdkafka, which starts fetching and decompressing in its
    own threads as soon as partitions are assigned, ahead of any poll: the benchmark
    counts its work from there.
    """
    assign = Application._on_assign

    def _on_assign(self: Any, consumer: Any, partitions: Any) -> None:
        assign(self, consumer, partitions)
        if partitions and stats["first_poll_at"] is None:
            stats["first_poll_at"], stats["cpu_at_first_poll"] = time.time(), time.process_time()

    # setattr: quixstreams is an optional dependency, untyped where it is not installed
    setattr(Application, "_on_assign", _on_assign)  # noqa: B010


def main() -> None:
    """Start the peer (blocks until stopped)."""
    s = load_settings()
    size_ms = round(s.window_s * 1000)
    grace_ms = round((s.allowed_lateness_s + s.out_of_orderness_s) * 1000)
    stats = peer_stats()
    _stamp_assignment(stats)
    closed: list[dict[str, Any]] = []
    _serve(s.web_port, stats, closed)

    def launches(rec: dict[str, Any]) -> list[dict[str, Any]]:
        now = time.time()
        stats["launches"] += len(rec["t_end"])
        if stats["first_batch_at"] is None:
            stats["first_batch_at"] = now
            stats["cpu_at_first_batch"] = time.process_time()
        stats["last_batch_at"] = now
        stats["cpu_at_last_batch"] = time.process_time()
        c = rec["config_id"]
        return [
            {"c": c, "t": t, "d": d}
            for t, d, ok in zip(rec["t_end"], rec["duration_us"], rec["ok"], strict=True)
            if ok
        ]

    def record(key: str, window: dict[str, Any]) -> None:
        by_config: dict[str, list[float]] = defaultdict(list)
        for launch in window["launches"]:
            by_config[launch["c"]].append(launch["d"])
        for config_id, ds in by_config.items():
            d = np.asarray(ds)
            closed.append(
                {
                    "stream": key,
                    "config_id": config_id,
                    "window_start": window["start"] / 1000,
                    "count": int(d.size),
                    "mean": float(d.mean()),
                    "p95": float(np.percentile(d, 95)),
                }
            )

    app = Application(
        broker_address=s.bootstrap,
        consumer_group=s.app_id,
        auto_offset_reset="earliest",
        state_dir=str(s.data_dir / "quix-state"),
        use_changelog_topics=False,
        commit_interval=1.0,
    )
    topic = app.topic(s.topic_launches, key_deserializer="str", value_deserializer="json")
    sdf = app.dataframe(topic)
    sdf = sdf.apply(launches, expand=True)
    sdf = sdf.set_timestamp(lambda value, key, ts, headers: int(value["t"] * 1000))
    window = sdf.tumbling_window(duration_ms=size_ms, grace_ms=grace_ms)
    sdf = window.agg(launches=Collect()).final()
    sdf.update(lambda value, key, ts, headers: record(key, value), metadata=True)
    app.run()


if __name__ == "__main__":
    main()
