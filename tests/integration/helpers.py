"""Small helpers for integration tests: read topics until a condition holds."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from kernelstream.agents.first_offset import assign_from_first
from kernelstream.app.settings import Settings
from kernelstream.schemas import SchemaError, decode_any


def env_security() -> dict[str, Any]:
    """aiokafka's security options of the environment's settings, as a worker started by
    a test reads them: plaintext unless ``KERNELSTREAM_SECURITY_PROTOCOL`` says otherwise
    (a cluster of the user's, ``KERNELSTREAM_TEST_KAFKA_BOOTSTRAP``)."""
    return Settings().kafka_client_kwargs()


def _security(client: dict[str, Any]) -> dict[str, Any]:
    """``client`` (aiokafka's security options), or, where none are given, the
    environment's (:func:`env_security`)."""
    return client or env_security()


class TopicReader:
    """Reads every record of some topics from the beginning, grouped by topic.
    ``client``: aiokafka's security options (``Settings.kafka_client_kwargs()``; by
    default the environment's)."""

    def __init__(self, bootstrap: str, *topics: str, **client: Any) -> None:
        self.bootstrap, self.topics, self.client = bootstrap, topics, _security(client)
        self.records: dict[str, list[Any]] = defaultdict(list)
        self.raw: dict[str, list[Any]] = defaultdict(list)
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> TopicReader:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **self.client,
        )
        await self._consumer.start()
        try:  # from offset 0: the embedded broker's "beginning" can be one too high
            await assign_from_first(self._consumer, self.topics)
        except BaseException:
            await self._consumer.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._consumer is not None
        await self._consumer.stop()

    async def poll(self) -> None:
        assert self._consumer is not None
        batch = await self._consumer.getmany(timeout_ms=200)
        for msgs in batch.values():
            for m in msgs:
                self.raw[m.topic].append(m)
                try:
                    self.records[m.topic].append(decode_any(m.value))
                except SchemaError:
                    self.records[m.topic].append(None)

    async def until(
        self,
        cond: Callable[[], bool],
        timeout_s: float,
        what: str,
        detail: Callable[[], str] | None = None,
    ) -> None:
        """Poll until ``cond()``; on timeout say what was read (and ``detail()``)."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                counts = {t: len(v) for t, v in self.records.items()}
                extra = f"; {detail()}" if detail is not None else ""
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {what}; "
                    f"records so far: {counts}{extra}"
                )
            await self.poll()


async def produce(
    bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes]], **client: Any
) -> None:
    """Each (key, value) to ``topic``, acknowledged by all replicas (``client``: aiokafka's
    security options, by default the environment's)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", **_security(client))
    await producer.start()
    try:
        for key, value in items:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def run(coro: Any) -> Any:
    return asyncio.run(coro)
