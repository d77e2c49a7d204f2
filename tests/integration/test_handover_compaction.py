"""Apache Kafka compacts the window agent's handover topic as the worker declares it.

The worker declares ``<launches>.window-state`` with ``cleanup.policy=compact,delete``:
every handover writes a whole ``state`` record per partition (or, for a large state, a
run of uniquely keyed chunks), and only the newest one matters. This test lets a real
worker declare the topic, writes handovers with the agent's own ``state_messages``,
rolls segments quickly (the production default rolls weekly, so compaction there runs
over days), and checks that Kafka dropped the superseded ``state`` records while the
agent's ``StateReassembler`` still finds the newest state. Tansu stores the policy
without applying it, so there the test is skipped.
"""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from kernelstream.agents.window_agent import StateReassembler, state_messages, state_topic
from kernelstream.app.settings import Settings
from tests.integration.helpers import env_security

pytestmark = pytest.mark.integration

SEGMENT_MS = 300
HANDOVERS = 6
# The agent's real chunk size: a 2.5-chunk record exercises the chunked path.
CHUNK = Settings().window_state_chunk_bytes


async def _wait_declared(admin: AIOKafkaAdminClient, topic: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while topic not in set(await admin.list_topics()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the worker did not declare {topic} within {timeout_s} s")
        await asyncio.sleep(0.5)


async def _topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    resp = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    # DescribeConfigs v0..: resources -> (error, msg, type, name, entries); entries start
    # with (name, value, ...).
    entries = resp[0].resources[0][4]
    return {e[0]: e[1] for e in entries}


async def _read_partition(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes]]:
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **env_security(), enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        got: list[tuple[bytes | None, bytes]] = []
        while await consumer.position(tp) < end:
            for msgs in (await consumer.getmany(tp, timeout_ms=500)).values():
                got += [(m.key, m.value) for m in msgs if m.value is not None]
        return got
    finally:
        await consumer.stop()


def _record(i: int) -> bytes:
    size = CHUNK * 5 // 2 if i == 2 else 1000  # handover 2 is chunked
    return (b"%d:" % i) * (size // 2)


async def _scenario(settings: Settings) -> None:
    bootstrap = str(settings.bootstrap)
    topic = state_topic(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
    await admin.start()
    try:
        await _wait_declared(admin, topic, 90)
        assert (await _topic_configs(admin, topic))["cleanup.policy"] == "compact,delete"
        await admin.alter_configs(
            [
                ConfigResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    {
                        "cleanup.policy": "compact,delete",
                        "segment.ms": str(SEGMENT_MS),
                        "min.cleanable.dirty.ratio": "0.01",
                    },
                )
            ]
        )
    finally:
        await admin.close()

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, **env_security(), acks="all", max_request_size=CHUNK + 4096
    )
    await producer.start()
    try:
        for i in range(HANDOVERS):
            for key, value in state_messages(_record(i), CHUNK):
                await producer.send_and_wait(topic, value, key=key, partition=0)
            await asyncio.sleep(2 * SEGMENT_MS / 1000)  # each handover in its own segment
    finally:
        await producer.stop()

    newest = _record(HANDOVERS - 1)
    deadline = time.monotonic() + 90
    while True:
        records = await _read_partition(bootstrap, topic)
        states = [v for k, v in records if k == b"state"]
        if len(states) < HANDOVERS - 1:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"Kafka kept all {len(states)} state records in 90 s")
        await asyncio.sleep(1.0)
    # Superseded whole states are gone (the oldest first); the chunks (unique keys) stay
    # until retention; the newest state is always kept.
    assert _record(0) not in states
    assert states[-1] == newest
    assert sum(1 for k, _ in records if k is not None and k.startswith(b"chunk:")) == 3
    reassembled = StateReassembler()
    for k, v in records:
        reassembled.add(0, k, v)
    assert reassembled.latest[0] == newest


def test_handover_topic_is_compacted(
    settings: Settings, engine: str, request: pytest.FixtureRequest
) -> None:
    if engine != "kafka":
        pytest.skip("Tansu stores cleanup.policy without applying it")
    worker: subprocess.Popen[bytes] = request.getfixturevalue("worker")  # declares the topic
    asyncio.run(_scenario(settings))
    assert worker.poll() is None
