"""The node's durable outbox: survives a restart, stays bounded, resends in order."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import errors as aiokafka_errors

from kernelstream.app.errors import ConfigError
from kernelstream.app.node.outbox import DurableSeenIds, NodeStore, Outbox, OutboxSender


def msg(i: int, stream: str = "n:0/k", size: int = 10) -> tuple[str, bytes, bytes, bool, int, int]:
    return ("launches", stream.encode(), bytes([i % 256]) * size, True, i * 10, 10)


class FakeProducer:
    """Accepts sends while ``up``; a send while down fails like a timed-out request."""

    def __init__(self) -> None:
        self.up = True
        self.log: list[tuple[str, bytes | None, bytes]] = []

    async def start(self) -> None:
        if not self.up:
            raise ConnectionError("broker down")

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.up:
            self.log.append((topic, key, value))
            fut.set_result(None)
        else:
            fut.set_exception(TimeoutError("no broker"))
        return fut


def test_entries_and_sequences_survive_a_restart(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "n")
    box = Outbox(store)
    box.append([msg(i) for i in range(3)], extra_puts=NodeStore.seq_puts({"n:0/k": 30}))
    store.close()

    store = NodeStore(tmp_path / "n")
    box = Outbox(store)
    assert len(box) == 3 and store.next_seqs() == {"n:0/k": 30}
    [head] = box.heads(set())
    assert head.seq_start == 0 and box.value(head) == bytes([0]) * 10
    box.ack(head)
    store.close()
    box = Outbox(NodeStore(tmp_path / "n"))
    assert [e.seq_start for e in box._order.values()] == [10, 20]


def test_full_outbox_drops_oldest_launches_never_control_messages(tmp_path: Path) -> None:
    box = Outbox(NodeStore(tmp_path / "n"), max_records=4)
    box.append([("reconfig", b"g", b"outcome", False, 0, 0)])
    box.append([msg(i) for i in range(6)])
    assert len(box) == 4
    kept = list(box._order.values())
    assert kept[0].topic == "reconfig"  # the oldest, but not telemetry
    assert [e.seq_start for e in kept[1:]] == [30, 40, 50]
    assert box.stats.dropped_batches == 3 and box.stats.dropped_launches == 30
    report = orjson.loads(box.take_drop_report() or b"")
    assert report["ranges"] == {"n:0/k": [[0, 30]]}
    assert box.take_drop_report() is None


def test_byte_bound_and_drop_report_survive_restart(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "n")
    box = Outbox(store, max_bytes=100)
    box.append([msg(i, size=40) for i in range(4)])
    assert box.stats.pending_bytes <= 100 and box.stats.dropped_batches == 2
    store.close()
    box = Outbox(NodeStore(tmp_path / "n"), max_bytes=100)
    assert orjson.loads(box.take_drop_report() or b"")["batches"] == 2


def test_sender_resends_in_order_after_an_outage(tmp_path: Path) -> None:
    async def scenario() -> None:
        box = Outbox(NodeStore(tmp_path / "n"), max_records=5)
        producer = FakeProducer()
        drops: list[bytes] = []

        def on_drops(report: bytes) -> tuple[str, bytes | None, bytes]:
            drops.append(report)
            return ("deadletter", b"n", report)

        async def make() -> Any:
            return producer

        sender = OutboxSender(box, make, on_drops=on_drops, retry_backoff_s=0.01)
        sender.start()
        box.append([msg(0, "n:0/a"), msg(0, "n:0/b")])
        assert await sender.drain(2.0)
        producer.up = False
        box.append([msg(i, "n:0/a") for i in range(1, 8)])  # 7 > 5: the two oldest drop
        await asyncio.sleep(0.05)
        assert box.stats.send_failures > 0 and len(box) == 5
        producer.up = True
        assert await sender.drain(2.0)
        await sender.stop()
        sent_a = [v[0] for t, k, v in producer.log if k == b"n:0/a"]
        assert sent_a == [0, 3, 4, 5, 6, 7]  # in order; 1 and 2 were dropped when full
        assert len(drops) == 1 and orjson.loads(drops[0])["ranges"] == {"n:0/a": [[10, 30]]}
        assert [t for t, _, _ in producer.log].count("deadletter") == 1

    asyncio.run(scenario())


class RejectedProducer(FakeProducer):
    """An idempotent producer whose sequence numbers the broker no longer accepts.

    What aiokafka's producer does after a batch expired during a long outage: it keeps
    its producer id and sequence numbers, and the broker answers every later batch
    with OutOfOrderSequenceNumber; only a new producer (a new id) gets through.
    """

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_exception(aiokafka_errors.OutOfOrderSequenceNumber())
        return fut


def test_sender_replaces_a_producer_the_broker_rejects(tmp_path: Path) -> None:
    async def scenario() -> None:
        box = Outbox(NodeStore(tmp_path / "n"))
        made: list[FakeProducer] = []

        async def make() -> Any:
            made.append(RejectedProducer() if not made else FakeProducer())
            return made[-1]

        sender = OutboxSender(box, make, retry_backoff_s=0.01)
        sender.start()
        box.append([msg(i, "n:0/a") for i in range(3)])
        assert await sender.drain(2.0), box.stats
        await sender.stop()
        assert len(made) == 2
        assert [v[0] for _, _, v in made[1].log] == [0, 1, 2]  # all, in order

    asyncio.run(scenario())


class _HangingProducer(FakeProducer):
    """A producer whose start never finishes (a broker that does not answer)."""

    stopped = False

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.stopped = True


def test_a_sender_stopped_while_connecting_stops_its_producer(tmp_path: Path) -> None:
    """The node stopping during an outage: the producer still starting is stopped too,
    instead of aiokafka warning "Unclosed AIOKafkaProducer" at exit."""

    async def scenario() -> None:
        box = Outbox(NodeStore(tmp_path / "n"))
        made: list[_HangingProducer] = []

        async def make() -> Any:
            made.append(_HangingProducer())
            return made[-1]

        sender = OutboxSender(box, make, retry_backoff_s=0.01)
        sender.start()
        await asyncio.sleep(0.05)
        await sender.stop()
        assert len(made) == 1 and made[0].stopped

    asyncio.run(scenario())


def test_seen_ids_remember_their_first_offset(tmp_path: Path) -> None:
    seen = DurableSeenIds(NodeStore(tmp_path / "n"))
    seen.add("r1", expires_at=100.0, offset=7)
    assert "r1" in seen and "r2" not in seen
    assert seen.handled("r1", 7) and not seen.handled("r1", 8) and not seen.handled("r2", 0)
    seen.add("r1", expires_at=100.0, offset=8)  # a replay, decided too
    assert seen.handled("r1", 8) and seen.handled("r1", 7)
    assert seen.forget_expired(before=101.0) == 1 and "r1" not in seen


def test_a_second_process_on_the_same_node_state_is_refused_clearly(tmp_path: Path) -> None:
    store = NodeStore(tmp_path / "n")
    with pytest.raises(ConfigError, match="another node with the same id"):
        NodeStore(tmp_path / "n")
    store.close()
