"""The consumers' fetch wait follows the broker: short where a waiting fetch is answered
only when its wait runs out (the embedded broker), long where it is answered as soon as a
record arrives (Apache Kafka), and a value set in the settings wins."""

from __future__ import annotations

import asyncio

import pytest

from kernelstream.agents.reconfig_agent import RecommendationInbox
from kernelstream.app.kafka.capabilities import BrokerCapabilities
from kernelstream.app.settings import LONG_FETCH_WAIT_MS, SHORT_FETCH_WAIT_MS, Settings
from kernelstream.app.worker.start import findings_consumer, window_consumer

TANSU = BrokerCapabilities(brokers=1, idempotent_producer=False)
KAFKA = BrokerCapabilities(brokers=3, idempotent_producer=True)


def test_the_broker_decides_the_wait_unless_the_settings_do() -> None:
    assert (TANSU.fetch_wait_ms, KAFKA.fetch_wait_ms) == (SHORT_FETCH_WAIT_MS, LONG_FETCH_WAIT_MS)
    unset = Settings(bootstrap="kafka:9092")
    assert unset.fetch_max_wait_ms is None
    assert unset.fetch_wait() == SHORT_FETCH_WAIT_MS  # before any broker answered
    assert unset.for_broker(KAFKA).fetch_wait() == LONG_FETCH_WAIT_MS
    assert unset.for_broker(TANSU).fetch_wait() == SHORT_FETCH_WAIT_MS
    given = Settings(bootstrap="kafka:9092", fetch_max_wait_ms=200)
    assert given.for_broker(KAFKA) is given and given.for_broker(TANSU).fetch_wait() == 200


def test_the_workers_consumers_take_the_brokers_wait() -> None:
    async def waits(caps: BrokerCapabilities) -> tuple[int, int]:
        s = Settings(bootstrap="kafka:9092").for_broker(caps)
        made = [window_consumer(s, "kafka:9092"), findings_consumer(s, "kafka:9092")]
        return made[0]._fetch_max_wait_ms, made[1]._fetch_max_wait_ms

    assert asyncio.run(waits(KAFKA)) == (LONG_FETCH_WAIT_MS, LONG_FETCH_WAIT_MS)
    assert asyncio.run(waits(TANSU)) == (SHORT_FETCH_WAIT_MS, SHORT_FETCH_WAIT_MS)


def test_a_nodes_inbox_asks_for_its_wait_before_each_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The node hands its inbox a way to ask the broker (the node's capabilities); the
    # consumer the inbox makes waits that long. Asking fails like a connection: retried.
    made: list[int] = []
    twice = asyncio.Event()

    class Consumer:
        def __init__(self, *args: object, fetch_max_wait_ms: int, **kw: object) -> None:
            made.append(fetch_max_wait_ms)
            if len(made) == 2:
                twice.set()

        async def start(self) -> None:
            raise ConnectionError("no broker here")

        async def stop(self) -> None:
            pass

    monkeypatch.setattr("aiokafka.AIOKafkaConsumer", Consumer)
    asked = [0]

    async def fetch_wait() -> int:
        asked[0] += 1
        if asked[0] == 1:
            raise ConnectionError("the broker did not answer the probe")
        return LONG_FETCH_WAIT_MS

    async def run() -> None:
        s = Settings(bootstrap="kafka:9092")
        inbox = RecommendationInbox(
            s, "kafka:9092", lambda *a: None, retry_s=0.0, fetch_wait=fetch_wait
        )
        task = asyncio.create_task(inbox._connect())
        await twice.wait()
        task.cancel()

    asyncio.run(asyncio.wait_for(run(), 10.0))
    assert made[:2] == [LONG_FETCH_WAIT_MS, LONG_FETCH_WAIT_MS] and asked[0] >= 3
