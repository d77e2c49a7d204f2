"""Each hop of the loop on the real embedded broker, with a real worker process.

launches -> windows -> findings -> recommendations -> a node applies one ->
an outcome is published; and a bad record goes to the dead-letter topic with its
reason while the worker keeps running.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
from typing import Any, TypeVar

import pytest

from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.node.runtime import run_node
from kernelstream.app.settings import Settings
from kernelstream.schemas import (
    DeadLetter,
    Finding,
    Recommendation,
    ReconfigOutcome,
    WindowAggregate,
)
from tests.integration.helpers import TopicReader, produce

pytestmark = pytest.mark.integration


T = TypeVar("T")


def of(records: list[object], cls: type[T]) -> list[T]:
    return [r for r in records if isinstance(r, cls)]


async def scenario(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    node_settings: Settings | None = None,
    observer: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """Every hop, on the broker and with the security of ``settings`` (the worker's);
    ``node_settings``: the node's, if other; ``observer``: the bootstrap servers and
    client options of the test's own readers and producers, if other."""
    bootstrap = str(settings.bootstrap)
    look, client = observer or (bootstrap, settings.kafka_client_kwargs())
    await ensure_topics(settings, bootstrap)
    s = (node_settings or settings).model_copy(
        update={
            "workloads": ("matmul", "transpose"),
            "device_model": "A100-SXM4-80GB",
            "backend": "sim",
        }
    )
    stop = asyncio.Event()
    node = asyncio.create_task(run_node(s, bootstrap, stop=stop))
    async with TopicReader(
        look,
        s.topic_windows,
        s.topic_findings,
        s.topic_recommendations,
        s.topic_reconfig,
        s.topic_deadletter,
        **client,
    ) as r:
        await r.until(lambda: bool(of(r.records[s.topic_windows], WindowAggregate)), 60, "a window")
        await r.until(lambda: bool(of(r.records[s.topic_findings], Finding)), 30, "a finding")
        await r.until(
            lambda: bool(of(r.records[s.topic_recommendations], Recommendation)),
            30,
            "a recommendation",
        )
        await r.until(
            lambda: any(
                o.status == "applied" for o in of(r.records[s.topic_reconfig], ReconfigOutcome)
            ),
            30,
            "an applied outcome",
        )
        await r.until(
            lambda: any(
                o.status in ("kept", "rolled_back")
                for o in of(r.records[s.topic_reconfig], ReconfigOutcome)
            ),
            30,
            "a measured outcome",
        )

        # A bad record: the worker dead-letters it with the reason and keeps going.
        bad = b'{"schema": "ks.launch_batch/1", "node": 42}'
        await produce(look, s.topic_launches, [(b"evil", bad)], **client)
        await r.until(
            lambda: bool(of(r.records[s.topic_deadletter], DeadLetter)), 30, "a dead letter"
        )
        dl = of(r.records[s.topic_deadletter], DeadLetter)[0]
        assert base64.b64decode(dl.value_b64) == bad
        assert "node" in dl.reason and dl.stage == "window"
        # A bad recommendation addressed to the node: dead-lettered by the node itself.
        await produce(look, s.topic_recommendations, [(s.node_id.encode(), b"{not json")], **client)
        await r.until(
            lambda: any(
                d.stage == "node.reconfig" for d in of(r.records[s.topic_deadletter], DeadLetter)
            ),
            30,
            "the node's dead letter",
        )
        windows_before = len(r.records[s.topic_windows])
        await r.until(
            lambda: len(r.records[s.topic_windows]) > windows_before + 2,
            30,
            "windows after the bad record",
        )
        assert worker.poll() is None, "the worker must keep running"

        w = of(r.records[s.topic_windows], WindowAggregate)[0]
        assert w.node == s.node_id and w.count > 0 and w.duration_mean_us > 0
        rec = of(r.records[s.topic_recommendations], Recommendation)[0]
        assert rec.node == s.node_id and rec.config_id != rec.from_config_id
    stop.set()
    report = await node
    assert report.launches > 0 and report.outcomes.get("applied", 0) >= 1


def test_every_hop(settings: Settings, worker: subprocess.Popen[bytes]) -> None:
    asyncio.run(scenario(settings, worker))
