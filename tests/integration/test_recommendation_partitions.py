"""Partitions added to the recommendations topic while a node runs.

Recommendations are keyed by node id and a node reads the one partition its id hashes
to. Adding partitions (to run more workers: ``KERNELSTREAM_PARTITIONS`` is the useful
number of worker replicas) moves most keys; a node that kept reading its old partition
never received another recommendation once the workers' producers read the new count,
and nothing said so. The inbox now follows its key and keeps the old partition too.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from kernelstream.agents.reconfig_agent import RecommendationInbox, partition_for_key
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import Recommendation, encode
from tests.integration.helpers import env_security

pytestmark = pytest.mark.integration

GROWN = 6


def _rec(node: str, rid: str) -> Recommendation:
    now = time.time()
    return Recommendation(
        id=rid,
        node=node,
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel="matmul",
        workload="matmul",
        problem_size=[2048],
        from_config_id="a",
        config={"block_x": 16},
        config_id="b",
        reason="test",
        evidence={},
        expected_gain=1.5,
        issued_at=now,
        expires_at=now + 60.0,
    )


def _moving_node(base: str, before: int) -> str:
    """A node id whose partition changes, to one of the added ones, when the topic grows."""
    for i in range(1000):
        node = f"{base}-{i}"
        old = partition_for_key(node.encode(), list(range(before)))
        new = partition_for_key(node.encode(), list(range(GROWN)))
        if new >= before and new != old:
            return node
    raise AssertionError("no node id moves")


async def _scenario(settings: Settings) -> None:
    bootstrap = str(settings.bootstrap)
    await ensure_topics(settings, bootstrap)
    before = settings.partitions
    node = _moving_node(settings.node_id, before)
    s = settings.model_copy(update={"node_id": node})
    topic = s.topic_recommendations
    old = partition_for_key(node.encode(), list(range(before)))
    inbox = RecommendationInbox(s, bootstrap, lambda *a: None, follow_s=1.0)
    got: list[tuple[Recommendation, int]] = []

    async def received(ids: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not ids <= {r.id for r, _ in got}:
            assert time.monotonic() < deadline, f"waited for {ids}, got {[r.id for r, _ in got]}"
            await asyncio.sleep(0.2)
            got.extend(inbox.drain())

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **env_security())
    await producer.start()
    await inbox.start()
    try:
        await asyncio.wait_for(inbox.ready.wait(), 60)
        sent: Any = await producer.send_and_wait(topic, encode(_rec(node, "r1")), key=node.encode())
        assert sent.partition == old
        await received({"r1"}, 30)

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
        await admin.start()
        try:
            await admin.create_partitions({topic: NewPartitions(GROWN)})
        finally:
            await admin.close()
        # A producer that has read the new count (a worker after its metadata refresh)...
        fresh = AIOKafkaProducer(bootstrap_servers=bootstrap, **env_security())
        await fresh.start()
        try:
            sent = await fresh.send_and_wait(topic, encode(_rec(node, "r2")), key=node.encode())
        finally:
            await fresh.stop()
        assert sent.partition != old
        # ...and one that has not yet (its cached metadata still has the old count).
        sent = await producer.send_and_wait(
            topic, encode(_rec(node, "r3")), key=node.encode(), partition=old
        )
        await received({"r2", "r3"}, 30)
        assert sorted(r.id for r, _ in got) == ["r1", "r2", "r3"], "each exactly once"
        assert {p for _, p in inbox.lag()} == {
            old,
            partition_for_key(node.encode(), list(range(GROWN))),
        }
    finally:
        await inbox.stop()
        await producer.stop()


def test_node_follows_its_key_when_partitions_are_added(settings: Settings, engine: str) -> None:
    if engine == "tansu":
        pytest.skip("the embedded broker cannot add partitions (no CreatePartitions)")
    asyncio.run(_scenario(settings))
