"""A burst published as record batches (``WorkerContext.send_many``) lands on the broker as
the same records sent one by one would: same partitions, same order, same keys and values,
through the worker's own Faust app and producer."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from kernelstream.agents.context import WorkerContext
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.app.worker.faust_app import create_app
from tests.integration.helpers import TopicReader, run


def _burst() -> list[tuple[bytes, bytes]]:
    """Keys over both partitions, values from a few bytes to ~3 kB (~900 kB in all: several
    batches per partition), and one record larger than a whole batch (256 KiB)."""
    items = [
        (f"node-{i % 7}:{i % 2}/kernel-{i % 3}".encode(), b"%d:" % i + b"v" * (i * 37 % 3000))
        for i in range(600)
    ]
    items.insert(300, (b"node-big:0/kernel", b"B" * 300_000))
    return items


def test_a_burst_in_batches_lands_as_record_by_record(settings: Settings) -> None:
    async def main() -> tuple[dict[int, list[Any]], dict[int, list[Any]]]:
        bootstrap = str(settings.bootstrap)
        await ensure_topics(settings, bootstrap)
        app = create_app(settings, bootstrap, web=False)
        topics = {
            role: app.topic(
                getattr(settings, f"topic_{role}"), key_serializer="raw", value_serializer="raw"
            )
            for role in ("windows", "findings")
        }
        ctx = WorkerContext(settings=settings, topics=topics, app=app)
        items = _burst()
        try:
            # in three bursts, the later ones while the first one's batches are in flight
            for burst in (items[:200], items[200:201], items[201:]):
                await ctx.send_many("windows", burst)
            assert ctx._batcher()[0] is not None  # the batches were the producer's
            for key, value in items:
                await ctx.send("findings", key, value)
            await ctx.flush()
        finally:
            await app.producer.stop()
        by_topic: dict[str, dict[int, list[Any]]] = defaultdict(lambda: defaultdict(list))
        async with TopicReader(
            bootstrap, settings.topic_windows, settings.topic_findings
        ) as reader:
            await reader.until(
                lambda: all(len(reader.raw[t]) == len(items) for t in reader.topics),
                60,
                "both bursts",
            )
            for topic, msgs in reader.raw.items():
                for m in msgs:
                    by_topic[topic][m.partition].append((m.key, m.value))
        return by_topic[settings.topic_windows], by_topic[settings.topic_findings]

    batched, one_by_one = run(main())
    assert batched == one_by_one
    assert len(batched) == settings.partitions  # the burst spans every partition
