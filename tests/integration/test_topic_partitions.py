"""A launches topic with more partitions than the worker's settings say.

A broker that creates topics on first use (Apache Kafka and the embedded broker do by
default) gives the launches topic its own partition count when a node publishes, or any
client asks for its metadata, before a worker has created it; an operator may add
partitions. The window agent hands each launches partition's state over on the same
partition of ``<launches>.window-state``, so that topic must have as many: a worker that
created it with ``settings.partitions`` crashed at its first assignment (the handover
marker for partition 2 of a 2-partition topic), and every restart crashed the same way.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import murmur2

from kernelstream.agents.window_agent import state_topic
from kernelstream.app.node.runtime import run_node
from kernelstream.app.settings import Settings
from kernelstream.schemas import WindowAggregate
from kernelstream.schemas.keys import stream_key
from tests.integration.conftest import settings_env
from tests.integration.helpers import TopicReader, env_security

pytestmark = pytest.mark.integration

WIDER = 3  # launches partitions beyond settings.partitions
WORKLOADS = ("matmul", "transpose")


def _partition(key: str, partitions: int) -> int:
    """The partition the producers' default partitioner gives ``key``."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """A node id with one of its streams on a partition past ``settings.partitions``."""
    total = settings.partitions + WIDER
    for i in range(1000):
        node = f"{settings.node_id}-{i}"
        parts = {_partition(stream_key(node, settings.device_index, w), total) for w in WORKLOADS}
        if max(parts) >= settings.partitions:
            break
    return settings.model_copy(
        update={
            "node_id": node,
            "workloads": WORKLOADS,
            "device_model": "A100-SXM4-80GB",
            "backend": "sim",
        }
    )


async def _partition_counts(bootstrap: str, *names: str) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(list(names))}
    finally:
        await admin.close()


async def _create(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, p, 1) for n, p in topics.items()])
    finally:
        await admin.close()


@pytest.fixture
def wider_launches(settings: Settings) -> int:
    """The launches topic created before the worker, with more partitions."""
    total = settings.partitions + WIDER
    asyncio.run(_create(str(settings.bootstrap), {settings.topic_launches: total}))
    return total


async def _windows_of_every_stream(s: Settings, total: int) -> None:
    bootstrap = str(s.bootstrap)
    stop = asyncio.Event()
    node = asyncio.create_task(run_node(s, bootstrap, stop=stop))
    try:
        async with TopicReader(bootstrap, s.topic_windows) as r:

            def kernels() -> set[str]:
                return {
                    w.kernel for w in r.records[s.topic_windows] if isinstance(w, WindowAggregate)
                }

            await r.until(lambda: kernels() == set(WORKLOADS), 90, "windows of every stream")
    finally:
        stop.set()
        await node
    counts = await _partition_counts(bootstrap, s.topic_launches, state_topic(s))
    assert counts == {s.topic_launches: total, state_topic(s): total}


def test_worker_follows_the_launches_topics_partitions(
    settings: Settings, wider_launches: int, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    asyncio.run(_windows_of_every_stream(settings, wider_launches))
    assert worker.poll() is None, "the worker must keep running"
    log = (tmp_path / "worker.log").read_text(errors="replace")
    assert "takeover failed" not in log and "Crashed" not in log


def test_handover_topic_with_fewer_partitions(
    settings: Settings, engine: str, tmp_path: Path
) -> None:
    """Launches partitions added after the handover topic was created: the worker adds
    them to it (Apache Kafka), or, on a broker that cannot (the embedded one), stops at
    once with one line saying what to do instead of failing at every assignment."""
    s, bootstrap = settings, str(settings.bootstrap)
    total = s.partitions + WIDER
    asyncio.run(_create(bootstrap, {s.topic_launches: total, state_topic(s): s.partitions}))
    # The worker's output goes to a file: a pipe nobody reads while the worker runs fills
    # up (64 KiB of log lines) and blocks it mid-write, where SIGTERM cannot stop it.
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelstream.app.cli", "worker"],
            env=settings_env(s),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        if engine == "tansu":
            proc.wait(timeout=120)
            text = log_path.read_text(errors="replace")
            assert proc.returncode == 1, text
            error = [line for line in text.splitlines() if line.startswith("Error:")]
            assert len(error) == 1 and state_topic(s) in error[0], text
            assert f"has {total} partitions" in error[0] and "Traceback" not in text, text
            return
        asyncio.run(_windows_of_every_stream(s, total))
        assert proc.poll() is None, "the worker must keep running"
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()  # never left behind: a worker stuck in its stop never exits
                proc.wait()
                raise


def test_a_topic_with_fewer_partitions_is_reported(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A launches topic the broker created with 1 partition (Apache Kafka's default) bounds
    the workers to one: creating the topics says so rather than leaving it unseen."""
    from kernelstream.app.kafka.topics import ensure_topics

    bootstrap = str(settings.bootstrap)
    asyncio.run(_create(bootstrap, {settings.topic_launches: 1}))
    with caplog.at_level("WARNING", logger="kernelstream.topics"):
        created = asyncio.run(ensure_topics(settings, bootstrap))
    assert settings.topic_launches not in created and settings.topic_windows in created
    [warning] = [r.getMessage() for r in caplog.records if r.name == "kernelstream.topics"]
    assert settings.topic_launches in warning and "has 1 partition(s)" in warning, warning
