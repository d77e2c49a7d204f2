"""Broker outage while two nodes run: nothing produced during it is lost, the loop keeps pace.

The test owns its embedded broker (the session's is shared), stops it for
``KS_TEST_OUTAGE_S`` seconds (30 by default, the issue's figure) while two nodes
run, and starts it again on the same port. Then every launch the nodes produced
from the moment the broker went down must be on the new broker, each
(node, device, kernel, seq) once after deduplication, and any duplicate on the
wire must be an exact re-send of the same batch (what a consumer removes by
sequence number).

The embedded broker comes back empty (memory storage) and acknowledges, then
loses, records produced to topics it no longer has (see app/kafka/embedded.py); there
the nodes reach the broker through a gate (a TCP proxy) that opens only once the
topics exist again. On Apache Kafka (the ``kafka`` run, a node of the test's own)
topics survive the restart on the node's storage and no gate is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kernelstream.app.kafka.apache import KafkaCluster
from kernelstream.app.kafka.embedded import EmbeddedBroker, free_port
from kernelstream.app.kafka.topics import ensure_topics, topic_specs
from kernelstream.app.node.runtime import NodeReport, run_node
from kernelstream.app.settings import Settings
from kernelstream.schemas import LaunchBatch, decode
from tests.integration.helpers import TopicReader

pytestmark = pytest.mark.integration

OUTAGE_S = float(os.environ.get("KS_TEST_OUTAGE_S", "30"))

# The launch loop ticks every 50 ms. A loop that waited for the broker would stall for
# the whole outage (or aiokafka's 10 s request timeout); on this shared 2-core machine a
# healthy tick has been seen to overrun by a few hundred ms under load. 2 s separates
# the two cases with a wide margin.
MAX_TICK_LAG_S = 2.0


async def _scenario(
    base: Settings,
    bootstrap: str,
    down: Callable[[], Awaitable[None]],
    up: Callable[[], Awaitable[None]],
) -> None:
    await ensure_topics(base, bootstrap)
    nodes = {}
    for name, model in (("a", "A100-SXM4-80GB"), ("b", "H100-SXM5-80GB")):
        s = base.model_copy(
            update={
                "node_id": f"{base.node_id}-{name}",
                "device_model": model,
                "workloads": ("matmul", "transpose"),
                "max_launches_per_s": 2000.0,
                "outbox_drain_s": 30.0,
            }
        )
        stop, report = asyncio.Event(), NodeReport(s.node_id)
        task = asyncio.create_task(run_node(s, bootstrap, stop=stop, report=report))
        nodes[s.node_id] = (stop, report, task)

    # The nodes run and publish normally: both have delivered launches (their producers
    # are connected) before the outage begins. Under load a node can take seconds to
    # start; cutting the gate while its producer is still connecting tests nothing more.
    async with TopicReader(bootstrap, base.topic_launches) as early:
        await early.until(
            lambda: (
                {
                    decode(m.value, LaunchBatch).stream_key.split(":")[0]
                    for m in early.raw[base.topic_launches]
                }
                >= set(nodes)
            ),
            60,
            "launches from both nodes before the outage",
        )
    await asyncio.sleep(1.0)
    at_down = {n: dict(r.next_seq) for n, (_, r, _) in nodes.items()}
    await down()
    assert all(at_down.values()), "the nodes had not started launching before the outage"
    await asyncio.sleep(OUTAGE_S)
    during = {n: dict(r.next_seq) for n, (_, r, _) in nodes.items()}
    await up()
    await asyncio.sleep(4.0)
    for stop, _, _ in nodes.values():
        stop.set()
    reports: list[NodeReport] = await asyncio.gather(*(t for _, _, t in nodes.values()))

    for r in reports:
        produced = sum(during[r.node][k] - at_down[r.node][k] for k in at_down[r.node])
        assert produced > 0, f"{r.node} launched nothing during the outage"
        assert r.max_tick_lag_s < MAX_TICK_LAG_S, f"{r.node}'s launch loop stalled: {r}"
        if r.worst_tick:  # where the worst tick's time went: its parts make up the tick
            parts = r.worst_tick["launch_s"] + r.worst_tick["thread_wait_s"]
            assert parts + r.worst_tick["rest_s"] == pytest.approx(
                r.max_tick_lag_s + 0.05, abs=0.01
            )
        assert r.outbox["pending"] == 0, f"{r.node} did not deliver everything: {r.outbox}"
        assert r.outbox["dropped_batches"] == 0

    want = {
        stream: set(range(first, r.next_seq[stream]))
        for r in reports
        for stream, first in at_down[r.node].items()
    }
    seqs: dict[str, set[int]] = defaultdict(set)
    copies: dict[tuple[str, int], set[bytes]] = defaultdict(set)
    wire: dict[tuple[str, int], int] = defaultdict(int)
    placed: dict[tuple[str, int], tuple[int, int]] = {}  # (partition, offset) of each batch
    offsets: dict[int, set[int]] = defaultdict(set)  # every offset read, by partition
    async with TopicReader(bootstrap, base.topic_launches) as reader:
        seen = 0

        def arrived() -> bool:
            nonlocal seen
            for msg in reader.raw[base.topic_launches][seen:]:
                b = decode(msg.value, LaunchBatch)
                copies[(b.stream_key, b.seq_start)].add(msg.value)
                wire[(b.stream_key, b.seq_start)] += 1
                placed[(b.stream_key, b.seq_start)] = (msg.partition, msg.offset)
                offsets[msg.partition].add(msg.offset)
                seqs[b.stream_key].update(range(b.seq_start, b.seq_start + len(b.t_end)))
            seen = len(reader.raw[base.topic_launches])
            return all(w <= seqs[s] for s, w in want.items())

        with contextlib.suppress(AssertionError):
            await reader.until(arrived, 60, "every launch since the outage began")
    for stream, w in want.items():
        missing = sorted(w - seqs[stream])
        assert not missing, (
            f"{stream}: {len(missing)} launches produced during or after the outage never "
            f"arrived (seq {missing[0]}..{missing[-1]}; from seq {min(w)}; "
            f"reports {[(r.node, r.outbox, r.refused) for r in reports]}; "
            f"{_where(placed, offsets, stream, missing[0])})"
        )
    for (stream, seq), values in copies.items():
        assert len(values) == 1, f"{stream} seq {seq}: differing copies on the wire"
    print(
        f"outage {OUTAGE_S:.0f} s: {sum(len(w) for w in want.values())} launches produced "
        f"since it began, all on the restarted broker "
        f"({ {s: (min(w), max(w)) for s, w in want.items()} }); "
        f"{sum(n - 1 for n in wire.values())} exact re-sends on the wire; max tick lag "
        f"{max(r.max_tick_lag_s for r in reports) * 1000:.0f} ms "
        f"(worst ticks {[r.worst_tick for r in reports]}); outboxes "
        f"{[r.outbox for r in reports]}"
    )


def _where(
    placed: dict[tuple[str, int], tuple[int, int]],
    offsets: dict[int, set[int]],
    stream: str,
    seq: int,
) -> str:
    """Where a lost batch would have been: the stream's batches around ``seq`` on the
    wire, and any offsets the reader did not see in their partitions."""
    near = sorted(
        (s, *at) for (key, s), at in placed.items() if key == stream and abs(s - seq) < 60
    )
    holes = {
        part: sorted(set(range(max(offsets[part]) + 1)) - offsets[part])[:10]
        for part in {p for _, p, _ in near}
    }
    return f"batches near it (seq, partition, offset): {near}; unseen offsets: {holes}"


class Gate:
    """A loopback TCP proxy that can cut every connection and refuse new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.is_open = True
        self._conns: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.is_open:
            writer.close()
            return
        self._conns.add(writer)  # from here on close() cuts it, even mid-connect
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            self._conns.discard(writer)
            return
        if not self.is_open or writer.is_closing():
            # close() ran while this connection was being made: a connection that
            # slipped through would reach the old broker, which acknowledges records
            # and then loses them when it stops (a CI run lost one batch that way).
            up_w.close()
            writer.close()
            self._conns.discard(writer)
            return
        self._conns.add(up_w)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()
                self._conns.discard(dst)

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def close(self) -> None:
        self.is_open = False
        for w in list(self._conns):
            w.close()
        self._conns.clear()

    def open(self) -> None:
        self.is_open = True

    async def stop(self) -> None:
        self.close()
        if self._server is not None:
            self._server.close()


def test_broker_outage_loses_nothing_and_never_stalls_the_nodes(
    settings: Settings, engine: str, tmp_path: Path
) -> None:
    if engine == "kafka":
        asyncio.run(_kafka_outage(settings, tmp_path))
        return
    broker = EmbeddedBroker(tmp_path / "own-broker", advertised_port=free_port())
    gate = Gate(broker.port)

    async def down() -> None:
        gate.close()  # from here on nothing the nodes send can reach a broker
        await asyncio.to_thread(broker.stop)

    async def up() -> None:
        await asyncio.to_thread(broker.start)
        for spec in topic_specs(settings):  # it came back empty
            await asyncio.to_thread(broker.create_topic, spec.name, spec.partitions)
        gate.open()

    try:

        async def main() -> None:
            await gate.start(broker.advertised_port)
            await asyncio.to_thread(broker.start)
            try:
                s = settings.model_copy(update={"bootstrap": broker.bootstrap})
                await _scenario(s, broker.bootstrap, down, up)
            finally:
                await gate.stop()

        asyncio.run(main())
    finally:
        broker.stop()


async def _kafka_outage(settings: Settings, tmp_path: Path) -> None:
    """The same outage on an Apache Kafka node of its own: stopped, started on its storage."""
    kafka = KafkaCluster(tmp_path / "own-kafka")
    await asyncio.to_thread(kafka.start)
    try:
        s = settings.model_copy(update={"bootstrap": kafka.bootstrap})

        async def down() -> None:
            await asyncio.to_thread(kafka.stop)

        async def up() -> None:  # topics, records and offsets survive on its storage
            await asyncio.to_thread(kafka.start)

        await _scenario(s, kafka.bootstrap, down, up)
    finally:
        await asyncio.to_thread(kafka.stop)
