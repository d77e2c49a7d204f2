"""The naive baseline: a per-record Faust agent updating a windowed table, tutorial style.

Run as ``python -m kernelstream.bench.pipeline_naive`` with the benchmark's settings in the
environment. It consumes one launch per message and, for every record, decodes it
and increments a tumbling-window table keyed by stream key (Faust's changelog-backed
``Table(...).tumbling(...)``, as in Faust's windowing tutorial). Progress is served
as JSON on ``/ks/stats/`` like the real worker's.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import faust
import orjson

from kernelstream.app.settings import load_settings
from kernelstream.app.worker.faust_app import faust_broker_kwargs


def main() -> None:
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
    topic = app.topic(s.topic_launches, key_serializer="raw", value_serializer="raw")
    counts = app.Table("launch_counts", default=int, partitions=s.partitions).tumbling(
        s.window_s, expires=timedelta(seconds=60)
    )
    stats: dict[str, Any] = dict.fromkeys(
        ("first_batch_at", "last_batch_at", "cpu_at_first_batch", "cpu_at_last_batch")
    ) | {"launches": 0}

    @app.agent(topic)
    async def count(stream: Any) -> None:
        async for value in stream:
            rec = orjson.loads(value)
            counts[f"{rec['node']}:{rec['device_index']}/{rec['kernel']}"] += 1
            stats["launches"] += 1
            now = time.time()
            if stats["first_batch_at"] is None:
                stats["first_batch_at"] = now
                stats["cpu_at_first_batch"] = time.process_time()
            stats["last_batch_at"] = now
            stats["cpu_at_last_batch"] = time.process_time()

    @app.page("/ks/stats/")
    async def page(web: Any, request: Any) -> Any:
        return web.json({"window": stats})

    app.main()


if __name__ == "__main__":
    import sys

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    main()
