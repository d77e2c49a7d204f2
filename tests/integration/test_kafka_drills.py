"""Fault drills on a 3-broker Apache Kafka cluster (RF 3, min.insync.replicas=2, acks=all).

Two simulated GPU nodes (in this process) and one real worker process run while
a fault is injected; then the nodes stop, drain their outboxes, and report what
they sent: every stream's sequence numbers ``first_seq .. next_seq - 1``. That is
the ground truth. Every one of those launches must be on ``ks.launches`` and be
counted exactly once in ``ks.windows`` (windows taken once per identity
``(stream, window_start, config)``; any copy published again must be identical).

* a ``ks.launches`` partition leader SIGKILLed mid-stream and restarted, 5 times;
* the worker SIGKILLed at random moments and restarted, 5 times;
* one broker frozen with SIGSTOP for 30 s, then SIGCONT: also, the nodes' launch
  loops never stall (their worst tick overrun stays under 2 s).

Each drill prints its figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaClient

from kernelstream.app.kafka.apache import KafkaCluster
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.node.runtime import NodeReport, run_node
from kernelstream.app.settings import Settings
from kernelstream.schemas import LaunchBatch, WindowAggregate, decode, encode
from tests.integration.conftest import make_settings
from tests.integration.helpers import TopicReader, produce
from tests.integration.workers import WorkerProc, closing_batches, wait_for

pytestmark = pytest.mark.integration

DRILLS = 5
PARTITIONS = 3
FREEZE_S = float(os.environ.get("KS_TEST_OUTAGE_S", "30"))
MAX_TICK_LAG_S = 2.0  # as in test_outage.py: a loop waiting on the broker stalls for seconds


def _settings(kafka3: KafkaCluster, tmp_path: Path) -> Settings:
    # Windows close on the watermark only: an idle flush (processing time) during a
    # fault's stall would close a window early and send the rest of it to ks.late.
    # After the nodes stop, one closing launch per stream closes the last windows.
    return make_settings(kafka3.bootstrap, tmp_path, PARTITIONS).model_copy(
        update={"idle_timeout_s": 3600.0, "checkpoint_interval_s": 0.5}
    )


@contextmanager
def _worker(s: Settings, tmp: Path) -> Iterator[WorkerProc]:
    w = WorkerProc(s, tmp / "worker.log")
    try:
        yield w
    finally:
        w.close()


async def _assigned(w: WorkerProc) -> None:
    await wait_for(lambda: w.window("assigned_partitions") == PARTITIONS, 90, "assignment")


async def _partitions(bootstrap: str, topic: str) -> dict[int, Any]:
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        cluster = await client.fetch_all_metadata()
        return dict(cluster._partitions.get(topic, {}))
    finally:
        await client.close()


async def _leader(bootstrap: str, topic: str, partition: int) -> int:
    return int((await _partitions(bootstrap, topic))[partition].leader)


async def _all_in_sync(kafka3: KafkaCluster, topic: str, timeout_s: float = 90.0) -> None:
    """Wait until every partition of ``topic`` has all 3 replicas in sync again."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = await _partitions(kafka3.bootstrap, topic)
        if parts and all(len(p.isr) == 3 for p in parts.values()):
            return
        assert time.monotonic() < deadline, f"{topic} not back in sync: {parts}"
        await asyncio.sleep(0.5)


async def _run_with_fault(
    s: Settings, fault: Callable[[], Awaitable[None]]
) -> tuple[list[NodeReport], float]:
    """Run two sim nodes, inject ``fault`` while they run; their reports and its seconds."""
    bootstrap = str(s.bootstrap)
    stop = asyncio.Event()
    tasks, reports = [], []
    for i, model in enumerate(("A100-SXM4-80GB", "H100-SXM5-80GB")):
        ns = s.model_copy(
            update={
                "node_id": f"{s.node_id}-{i}",
                "device_model": model,
                "workloads": ("matmul", "transpose"),
                "max_launches_per_s": 500.0,
                "outbox_drain_s": 60.0,
                "seed": i,
            }
        )
        reports.append(NodeReport(ns.node_id))
        tasks.append(asyncio.create_task(run_node(ns, bootstrap, stop=stop, report=reports[-1])))
    await asyncio.sleep(3.0)  # both streaming before the first fault
    t0 = time.monotonic()
    await fault()
    took = time.monotonic() - t0
    await asyncio.sleep(2.0)
    stop.set()
    return list(await asyncio.gather(*tasks)), took


async def _counted_once(s: Settings, reports: list[NodeReport]) -> dict[str, int]:
    """Check the ground truth against both topics; figures for the drill's line."""
    want: dict[str, set[int]] = {}
    for rep in reports:
        assert rep.outbox["pending"] == 0, f"{rep.node} did not deliver everything: {rep.outbox}"
        assert rep.outbox["dropped_batches"] == 0, rep.outbox
        for stream, end in rep.next_seq.items():
            want[stream] = set(range(rep.first_seq.get(stream, 0), end))
    total = sum(len(v) for v in want.values())
    assert total > 0
    topics = (s.topic_launches, s.topic_windows, s.topic_late)
    async with TopicReader(str(s.bootstrap), *topics) as reader:

        def batches() -> list[LaunchBatch]:
            return [b for b in reader.records[s.topic_launches] if isinstance(b, LaunchBatch)]

        def on_topic() -> dict[str, set[int]]:
            seqs: dict[str, set[int]] = defaultdict(set)
            for b in batches():
                seqs[b.stream_key].update(range(b.seq_start, b.seq_start + len(b.t_end)))
            return seqs

        with contextlib.suppress(AssertionError):  # what is missing is reported below
            await reader.until(
                lambda: all(w <= on_topic()[k] for k, w in want.items()), 60, "launches"
            )
        seqs = on_topic()
        for stream, sent in want.items():
            missing = sorted(sent - seqs[stream])
            assert not missing, f"{stream}: {len(missing)} acknowledged launches not on the topic"
        ahead = s.window_s + s.out_of_orderness_s + s.allowed_lateness_s + 1.0
        last = sorted(batches(), key=lambda b: (b.stream_key, b.seq_start))
        await produce(str(s.bootstrap), s.topic_launches, _items(closing_batches(last, ahead)))
        windows = await _windows(reader, s, total)
        assert not reader.records[s.topic_late], "no launch may be late: each stream is in order"
    per_stream: dict[str, int] = defaultdict(int)
    for agg in windows.values():
        per_stream[agg.stream_key] += agg.count + agg.failures
    assert dict(per_stream) == {k: len(v) for k, v in want.items()}
    copies = len(reader.raw[s.topic_windows]) - len(windows)
    return {"launches": total, "windows": len(windows), "again": copies}


async def _windows(
    reader: TopicReader, s: Settings, total: int
) -> dict[tuple[str, float, str], WindowAggregate]:
    """Windows by identity once they hold ``total`` launches; copies must be identical."""
    first: dict[tuple[str, float, str], bytes] = {}
    windows: dict[tuple[str, float, str], WindowAggregate] = {}
    read = 0

    def complete() -> bool:
        nonlocal read
        new, read = reader.raw[s.topic_windows][read:], len(reader.raw[s.topic_windows])
        for m in new:
            w = decode(m.value, WindowAggregate)
            ident = (w.stream_key, w.window_start, w.config_id)
            assert first.setdefault(ident, m.value) == m.value, f"window {ident} differs"
            windows[ident] = w
        return sum(w.count + w.failures for w in windows.values()) >= total

    await reader.until(complete, 120, f"{total} launches in windows")
    return windows


def _items(batches: list[LaunchBatch]) -> list[tuple[bytes | None, bytes]]:
    return [(b.stream_key.encode(), encode(b)) for b in batches]


def test_partition_leader_killed_five_times(kafka3: KafkaCluster, tmp_path: Path) -> None:
    s = _settings(kafka3, tmp_path)
    killed: list[int] = []

    async def fault() -> None:
        for i in range(DRILLS):
            leader = await _leader(kafka3.bootstrap, s.topic_launches, i % PARTITIONS)
            await asyncio.to_thread(kafka3.signal, leader, signal.SIGKILL)
            killed.append(leader)
            await asyncio.sleep(3.0)  # the stream goes on without that leader
            await asyncio.to_thread(kafka3.start_node, leader)
            # so that the next kill never takes a partition below min.insync.replicas
            await _all_in_sync(kafka3, s.topic_launches)
            await asyncio.sleep(1.0)

    async def drill() -> None:
        await ensure_topics(s, kafka3.bootstrap)
        with _worker(s, tmp_path) as w:
            w.start()
            await _assigned(w)
            reports, took = await _run_with_fault(s, fault)
            figures = await _counted_once(s, reports)
        print(
            f"{DRILLS} partition-leader SIGKILLs (brokers {killed}) over {took:.0f} s: "
            f"{figures['launches']} acknowledged launches, each counted once in "
            f"{figures['windows']} windows ({figures['again']} identical re-publications)"
        )

    asyncio.run(drill())


def test_worker_killed_five_times(kafka3: KafkaCluster, tmp_path: Path) -> None:
    s = _settings(kafka3, tmp_path)
    rng = random.Random(20261124)

    async def drill() -> None:
        await ensure_topics(s, kafka3.bootstrap)
        with _worker(s, tmp_path) as w:
            w.start()
            await _assigned(w)

            async def fault() -> None:
                for _ in range(DRILLS):
                    await asyncio.sleep(rng.uniform(0.5, 4.0))
                    await asyncio.to_thread(w.kill9)
                    w.start()
                    await _assigned(w)

            reports, took = await _run_with_fault(s, fault)
            figures = await _counted_once(s, reports)
        print(
            f"{DRILLS} worker SIGKILLs over {took:.0f} s: {figures['launches']} acknowledged "
            f"launches, each counted once in {figures['windows']} windows "
            f"({figures['again']} identical re-publications)"
        )

    asyncio.run(drill())


def test_broker_frozen_for_30_s(kafka3: KafkaCluster, tmp_path: Path) -> None:
    s = _settings(kafka3, tmp_path)
    frozen: list[int] = []

    async def fault() -> None:
        leader = await _leader(kafka3.bootstrap, s.topic_launches, 0)
        frozen.append(leader)
        kafka3.signal(leader, signal.SIGSTOP)
        try:
            await asyncio.sleep(FREEZE_S)
        finally:
            kafka3.signal(leader, signal.SIGCONT)
        await _all_in_sync(kafka3, s.topic_launches)

    async def drill() -> None:
        await ensure_topics(s, kafka3.bootstrap)
        with _worker(s, tmp_path) as w:
            w.start()
            await _assigned(w)
            reports, took = await _run_with_fault(s, fault)
            for r in reports:
                assert r.max_tick_lag_s < MAX_TICK_LAG_S, f"{r.node}'s launch loop stalled: {r}"
            figures = await _counted_once(s, reports)
        lag_ms = max(r.max_tick_lag_s for r in reports) * 1000
        print(
            f"broker {frozen[0]} frozen (SIGSTOP) for {FREEZE_S:.0f} s, back in sync after "
            f"{took:.0f} s: {figures['launches']} acknowledged launches, each counted once in "
            f"{figures['windows']} windows; worst launch-loop tick overrun {lag_ms:.0f} ms"
        )

    asyncio.run(drill())
