"""BatchPublisher's bookkeeping: one batch per partition with the producer, the rest
gathered in order, a lost batch never forgotten. (Against real brokers:
``tests/integration/test_publish_batches.py``.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from kernelstream.agents.publish import BatchPublisher, PublishError


class _Batch:
    def __init__(self, room: int) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self.room, self.closed = room, False

    def append(self, *, key: bytes, value: bytes, timestamp: Any) -> object | None:
        if self.closed or len(self.records) >= self.room:
            self.closed = True
            return None
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)

    def close(self) -> None:
        self.closed = True


class _Producer:
    """aiokafka's batch interface; each batch's delivery is settled by the test."""

    def __init__(self, room: int = 3) -> None:
        self.room = room
        self.sent: list[tuple[str, int, list[tuple[bytes, bytes]], asyncio.Future[None]]] = []

    def create_batch(self) -> _Batch:
        return _Batch(self.room)

    async def send_batch(self, batch: _Batch, topic: str, *, partition: int) -> Any:
        with_producer = [f for t, p, _, f in self.sent if (t, p) == (topic, partition)]
        assert all(f.done() for f in with_producer), "two batches of a partition at once"
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent.append((topic, partition, batch.records, future))
        return future

    def land(self, error: Exception | None = None) -> None:
        for *_, f in self.sent:
            if not f.done():
                f.set_exception(error) if error else f.set_result(None)


async def _landing(producer: _Producer, work: asyncio.Future[Any]) -> None:
    """Every batch handed over lands, until ``work`` is done."""
    while not work.done():
        producer.land()
        await asyncio.sleep(0)
    await work


def _records(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [(b"k", b"%d" % i) for i in range(start, start + n)]


def test_records_gather_while_a_batch_is_out_and_keep_their_order() -> None:
    async def main() -> _Producer:
        producer, counters = _Producer(), Counter[str]()
        pub = BatchPublisher(producer, counters)
        await pub.add("t", 0, _records(2))  # handed over at once
        await pub.add("t", 0, _records(2, 2))  # gathered: the first is out
        await pub.add("t", 1, _records(1, 4))  # another partition goes at once
        assert [len(r) for _, _, r, _ in producer.sent] == [2, 1]
        producer.land()
        await asyncio.sleep(0)  # the landing hands over what gathered
        await asyncio.sleep(0)
        assert [len(r) for _, _, r, _ in producer.sent] == [2, 1, 2]
        flushing = asyncio.ensure_future(pub.flush())
        await asyncio.sleep(0)
        assert not flushing.done()  # waits for the batch out
        await _landing(producer, flushing)
        assert not counters
        return producer

    producer = asyncio.run(main())
    on_0 = [v for t, p, r, _ in producer.sent if p == 0 for _, v in r]
    assert on_0 == [b"0", b"1", b"2", b"3"]


def test_a_full_batch_waits_for_the_one_out_then_goes() -> None:
    async def main() -> _Producer:
        producer = _Producer(room=3)
        pub = BatchPublisher(producer, Counter())
        await pub.add("t", 0, _records(3))  # fills a batch, handed over
        adding = asyncio.ensure_future(pub.add("t", 0, _records(4, 3)))  # fills the next
        await asyncio.sleep(0)
        assert not adding.done()  # backpressure: the first is still out
        producer.land()
        await adding
        producer.land()
        await _landing(producer, asyncio.ensure_future(pub.flush()))  # and the last record
        return producer

    producer = asyncio.run(main())
    assert [[v for _, v in r] for *_, r, _ in producer.sent] == [
        [b"0", b"1", b"2"],
        [b"3", b"4", b"5"],
        [b"6"],
    ]


def test_a_lost_batch_is_counted_and_fails_what_comes_after() -> None:
    async def main() -> Counter[str]:
        producer, counters = _Producer(), Counter[str]()
        pub = BatchPublisher(producer, counters)
        await pub.add("t", 0, _records(2))
        await pub.add("t", 0, _records(1, 2))  # gathered
        producer.land(RuntimeError("broker gone"))
        with pytest.raises(PublishError, match="2 records to t\\[0\\]"):
            # what gathered still goes (and lands): the loss is what flush reports
            await _landing(producer, asyncio.ensure_future(pub.flush()))
        assert [len(r) for *_, r, _ in producer.sent] == [2, 1]
        with pytest.raises(PublishError):
            await pub.add("t", 1, _records(1))
        return counters

    assert asyncio.run(main())["publish.failed"] == 2
