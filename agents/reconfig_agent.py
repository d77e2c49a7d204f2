"""Reconfiguration agent (node side): this node's recommendations in, outcomes out.

The inbox reads only the partition that the node's id hashes to (recommendations
are keyed by node id), from the beginning: the node cannot trust a broker's end
offsets (the embedded one reports them wrongly), so it reads everything and lets
the reconfiguration logic drop what is expired, replayed or for someone else.
Undecodable recommendations go to the dead-letter topic with their reason.

Partitions added to the recommendations topic (to run more workers) move the node's
key to another partition: every ``follow_s`` the inbox reads the topic's partitions
again and, when its key hashes elsewhere, reads that partition too, from its
beginning, while keeping the old one (a worker's producer goes on sending there until
it reads the new partition count, up to its metadata age of five minutes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from kernelstream.agents.context import dead_letter_key, dead_letter_record
from kernelstream.agents.first_offset import partitions_of, seek_to_first
from kernelstream.agents.logic.reconfiguration import outcome_record
from kernelstream.agents.retry_log import RetryLog
from kernelstream.schemas import Recommendation, SchemaError, decode, encode

__all__ = ["RecommendationInbox", "outcome_record", "partition_for_key"]

log = logging.getLogger("kernelstream.reconfig")


def partition_for_key(key: bytes, partitions: list[int]) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for ``key``."""
    from aiokafka.partitioner import DefaultPartitioner

    return int(DefaultPartitioner()(key, sorted(partitions), sorted(partitions)))


class RecommendationInbox:
    """Consumes this node's recommendations in the background; ``drain`` hands them over.

    ``publish(topic, key, value)`` must not block (the node's outbox): the inbox
    dead-letters undecodable recommendations through it. ``handled(id, offset)``
    tells whether this very message (same id at the same offset) was already
    decided before a restart: re-reading the partition from the beginning then
    skips it silently, while the same id at another offset is a replay and goes
    to the reconfiguration logic to be rejected in public. The consumer connects
    in the background, retrying, so a node may start while the broker is down.
    """

    def __init__(
        self,
        settings: Any,
        bootstrap: str,
        publish: Callable[[str, bytes | None, bytes], None],
        *,
        handled: Callable[[str, int], bool] | None = None,
        retry_s: float = 1.0,
        follow_s: float = 30.0,
        fetch_wait: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.settings = settings
        # the consumer's fetch wait, asked of the broker (the node's capabilities), else
        # the settings'
        self._fetch_wait = fetch_wait
        self.bootstrap = bootstrap
        self.publish = publish
        self.handled = handled
        self.retry_s = retry_s
        self._queue: list[tuple[Recommendation, int]] = []
        self._task: asyncio.Task[None] | None = None
        self._consumer: Any = None
        self.ready = asyncio.Event()
        self.dead_letters: Counter[str] = Counter()  # by reason code
        self.follow_s = follow_s
        self._tp: Any = None  # the partition the node's key hashes to, once assigned
        self._read: dict[int, int] = {}  # partition -> the last offset received
        self._retry_log = RetryLog(log, "recommendation inbox")

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="recommendation-inbox")

    async def _connect(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        topic = self.settings.topic_recommendations
        while True:
            consumer = None
            try:
                wait_ms = (
                    await self._fetch_wait() if self._fetch_wait else self.settings.fetch_wait()
                )
                consumer = AIOKafkaConsumer(
                    bootstrap_servers=self.bootstrap,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    # The embedded broker holds a fetch this long even when a
                    # recommendation is there (Apache Kafka answers at once).
                    fetch_max_wait_ms=wait_ms,
                    **self.settings.kafka_client_kwargs(),
                )
                await consumer.start()
                parts = (await partitions_of(consumer, [topic], timeout_s=5.0))[topic]
                part = partition_for_key(self.settings.node_id.encode(), parts)
                tp = TopicPartition(topic, part)
                consumer.assign([tp])
                seek_to_first(consumer, [tp])
                self._consumer, self._tp = consumer, tp
                self.ready.set()
                self._retry_log.recovered()
                return
            except BaseException as exc:
                if consumer is not None:  # stopped too when the node stops meanwhile
                    with contextlib.suppress(Exception):
                        await consumer.stop()
                if not isinstance(exc, Exception):
                    raise
                self._retry_log.failed(exc)
                await asyncio.sleep(self.retry_s)

    async def _run(self) -> None:
        await self._connect()
        followed_at = time.monotonic()
        while True:
            for msgs in (await self._consumer.getmany(timeout_ms=1000)).values():
                for msg in msgs:
                    self._receive(msg)
            if time.monotonic() - followed_at >= self.follow_s:
                followed_at = time.monotonic()
                try:
                    await self._follow_key()
                except Exception as exc:  # the broker: the next turn asks again
                    log.info("could not read the partitions of the recommendations: %r", exc)

    async def _follow_key(self) -> None:
        """Read the partition the node's key hashes to now, if partitions were added."""
        from aiokafka import TopicPartition

        consumer, topic = self._consumer, self.settings.topic_recommendations
        await asyncio.wait_for(consumer._client.force_metadata_update(), 10.0)
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            return
        tp = TopicPartition(topic, partition_for_key(self.settings.node_id.encode(), list(parts)))
        kept = set(consumer.assignment())
        if tp in kept:
            return
        positions = {old: await asyncio.wait_for(consumer.position(old), 10.0) for old in kept}
        consumer.assign([*kept, tp])
        for old, pos in positions.items():
            consumer.seek(old, pos)  # assign() forgets where the kept ones were
        seek_to_first(consumer, [tp])
        log.warning(
            "%s now has %d partitions: node %s reads partition %d too (its key moved there)",
            topic,
            len(parts),
            self.settings.node_id,
            tp.partition,
        )
        self._tp = tp

    def _receive(self, msg: Any) -> None:
        self._read[msg.partition] = msg.offset
        if msg.key is not None and msg.key != self.settings.node_id.encode():
            return  # another node hashed to the same partition
        try:
            rec = decode(msg.value, Recommendation)
        except SchemaError as exc:
            self.dead_letters[exc.code] += 1
            dl = dead_letter_record(
                "node.reconfig",
                msg.topic,
                msg.value,
                str(exc),
                key=msg.key,
                partition=msg.partition,
                offset=msg.offset,
                reason_code=exc.code,
            )
            self.publish(self.settings.topic_deadletter, dead_letter_key(msg.key), encode(dl))
            return
        if self.handled is not None and self.handled(rec.id, msg.offset):
            return  # decided before this node restarted; not a replay
        self._queue.append((rec, msg.offset))

    def lag(self) -> dict[tuple[str, int], int]:
        """Messages of each partition read not yet received, from the fetch high watermark.

        Empty until the partition is assigned; the high watermark is the one the
        broker reported with the last fetch (no ListOffsets request, which the
        embedded broker answers wrongly).
        """
        if self._consumer is None or self._tp is None:
            return {}
        out = {}
        for tp in self._consumer.assignment():
            high = self._consumer.highwater(tp)
            done = self._read[tp.partition] + 1 if tp.partition in self._read else 0
            out[(tp.topic, tp.partition)] = max(0, high - done) if high is not None else 0
        return out

    def drain(self) -> list[tuple[Recommendation, int]]:
        """The recommendations received since the last call, with their offsets."""
        out, self._queue = self._queue, []
        return out

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer:
            await self._consumer.stop()
