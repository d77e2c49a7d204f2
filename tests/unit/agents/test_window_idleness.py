"""A stream is idle only for the time its partition was read up to date.

The window agent flushes the open windows of a stream that sent nothing for
``idle_timeout_s``. Measured on the processing clock alone, a worker that is behind on
its input (catching up a backlog a fetch at a time) or was paused (a throttled
container, a long pause of the process) takes the streams it has not read yet for idle:
their windows close short and the rest of their launches go to the late topic. The
agent asks its consumer how far each partition was read (fetch-response stamps and high
watermarks, :meth:`WindowIngest._note_read_through`). Offsets the broker deleted before
the agent read them (retention) do not leave it behind for good
(:meth:`WindowIngest._follow_skipped`).
"""

from __future__ import annotations

import asyncio
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.agents.window_agent import WindowIngest
from kernelstream.app.settings import Settings
from kernelstream.schemas import WindowAggregate, decode, encode
from tests.bad_input import good_batch
from tests.unit.agents.test_window_agent_failures import Topic
from tests.unit.agents.test_window_agent_turns import Polls

_TP = TopicPartition("ks.launches", 0)
_IDLE_S = 3.0


class _Consumer:
    """What the agent asks of aiokafka's consumer about a partition's fetches."""

    def __init__(self) -> None:
        self.high: int | None = None
        self.stamp_ms: int | None = None
        self.at: int | None = None  # the position, when a test sets it

    def highwater(self, tp: Any) -> int | None:
        return self.high

    async def position(self, tp: Any) -> int:
        assert self.at is not None, "the agent asked for a position nobody set"
        return self.at

    def last_poll_timestamp(self, tp: Any) -> int | None:
        return self.stamp_ms

    def fetched(self, at: float, high: int) -> None:
        """A fetch response handled at ``at`` whose high watermark is ``high``."""
        self.stamp_ms, self.high = int(at * 1000), high


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock(time.time())
    monkeypatch.setattr(time, "time", c)
    return c


def _agent() -> tuple[WindowIngest, _Consumer, dict[str, Topic]]:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    spec = WindowSpec(size_s=1.0, out_of_orderness_s=0.2, allowed_lateness_s=0.5)
    ingest = WindowIngest(
        None, ctx, Windower(WindowSpec(**{**spec.__dict__, "idle_timeout_s": _IDLE_S}))
    )
    consumer = _Consumer()
    ingest._consumer = consumer
    ingest._next[_TP] = 0
    ingest._keys_of[_TP] = set()
    return ingest, consumer, topics


def _read(ingest: WindowIngest, offset: int, t0: float, seq: int) -> None:
    """The agent's part of a poll: message ``offset`` of the partition, 50 launches."""
    batch = good_batch("n1", "matmul", t0, 50, seq)
    msg = SimpleNamespace(
        topic=_TP[0], partition=0, offset=offset, key=batch.stream_key.encode(), value=encode(batch)
    )
    event = SimpleNamespace(message=msg, key=msg.key, value=msg.value)
    asyncio.run(ingest.ingest([event], ingest._keys_of[_TP]))
    ingest._next[_TP] = offset + 1


def _windows(topics: dict[str, Topic]) -> list[WindowAggregate]:
    return [decode(v, WindowAggregate) for v in topics["windows"].sent]


def _idle_from(
    ingest: WindowIngest, consumer: _Consumer, clock: _Clock, topics: dict[str, Topic], high: int
) -> float:
    """Tick every 0.2 s, each after an empty fetch, until a window is flushed; how long
    that took."""
    start = clock.now
    while not _windows(topics):
        assert clock.now - start < 10 * _IDLE_S, "a stream that sent nothing more was never flushed"
        clock.now += 0.2
        consumer.fetched(clock.now - 0.05, high=high)
        asyncio.run(ingest.tick())
    return clock.now - start


def test_a_stream_the_agent_has_not_read_up_to_is_not_idle(clock: _Clock) -> None:
    ingest, consumer, topics = _agent()
    start = clock.now
    t0 = math.floor(start) - 2.0  # event times: two batches, one window
    _read(ingest, 0, t0, 0)
    # The agent falls behind: every fetch since shows more on the partition than it read.
    for step in range(1, 40):
        clock.now = start + 0.25 * step
        consumer.fetched(clock.now - 0.05, high=2)
        asyncio.run(ingest.tick())
    assert _windows(topics) == [], "a stream whose next batch was not read yet was flushed"
    # It catches up: the next batch continues the same window, which closes whole.
    _read(ingest, 1, t0 + 0.5, 50)
    assert _IDLE_S <= _idle_from(ingest, consumer, clock, topics, high=2) <= _IDLE_S + 0.6
    [window] = _windows(topics)
    assert window.count + window.failures == 100 and not topics["late"].sent


def test_a_stream_of_a_partition_read_up_to_date_is_flushed_after_the_timeout(
    clock: _Clock,
) -> None:
    ingest, consumer, topics = _agent()
    _read(ingest, 0, clock.now - 2.0, 0)
    consumer.fetched(clock.now, high=1)
    # after the timeout, by at most two fetch stamps and a tick
    assert _IDLE_S <= _idle_from(ingest, consumer, clock, topics, high=1) <= _IDLE_S + 0.6


def test_a_paused_agent_waits_for_a_fetch_sent_after_the_pause(clock: _Clock) -> None:
    ingest, consumer, topics = _agent()
    start = clock.now
    t0 = math.floor(start) - 2.0  # event times: two batches, one window
    _read(ingest, 0, t0, 0)
    consumer.fetched(start, high=1)
    asyncio.run(ingest.tick())
    # Paused for twice the timeout. The response handled first after the pause was asked
    # for before it: its high watermark says nothing of what was sent during the pause.
    clock.now = start + 2 * _IDLE_S
    consumer.fetched(clock.now, high=1)
    asyncio.run(ingest.tick())
    assert _windows(topics) == []
    # The next response was asked for after the pause: what was sent in it is there.
    _read(ingest, 1, t0 + 0.5, 50)
    assert _IDLE_S <= _idle_from(ingest, consumer, clock, topics, high=2) <= _IDLE_S + 0.6
    [window] = _windows(topics)
    assert window.count + window.failures == 100 and not topics["late"].sent


def test_without_a_consumer_to_ask_idleness_is_processing_time(clock: _Clock) -> None:
    ingest, _, topics = _agent()
    ingest._consumer = None
    start = clock.now
    _read(ingest, 0, math.floor(start) - 2.0, 0)
    clock.now = start + _IDLE_S
    asyncio.run(ingest.tick())
    assert len(_windows(topics)) == 1


def test_offsets_deleted_before_they_were_read_do_not_hold_the_stream_open(
    clock: _Clock,
) -> None:
    ingest, consumer, topics = _agent()
    _read(ingest, 0, clock.now - 2.0, 0)
    # Retention deleted offsets 1-9 before the agent read them: the consumer reset to
    # the log's start, 10, and nothing below it will ever come.
    consumer.fetched(clock.now, high=10)
    consumer.at = 10
    asyncio.run(ingest._follow_skipped({_TP: ["a poll's records of this partition"]}))
    assert ingest._next[_TP] == 1, "a partition the poll returned records of has just moved"
    asyncio.run(ingest._follow_skipped({}))
    assert ingest._next[_TP] == 10
    assert ingest.ctx.counters["window.messages_skipped"] == 9
    assert _IDLE_S <= _idle_from(ingest, consumer, clock, topics, high=10) <= _IDLE_S + 0.6


def test_a_partition_read_up_to_its_position_is_left_where_it_is(clock: _Clock) -> None:
    ingest, consumer, _ = _agent()
    _read(ingest, 0, clock.now - 2.0, 0)
    consumer.fetched(clock.now, high=5)  # more to read, not yet returned
    consumer.at = 1
    asyncio.run(ingest._follow_skipped({}))
    assert ingest._next[_TP] == 1 and not ingest.ctx.counters["window.messages_skipped"]


def test_a_poll_that_starts_after_deleted_offsets_counts_them(clock: _Clock) -> None:
    ingest, _, _ = _agent()
    ingest._consumer = Polls(ingest, [7], clock.now - 2.0)
    ingest._taken_over.set()
    asyncio.run(ingest._run())
    assert ingest._next[_TP] == 8 and ingest.stats.batches == 1
    assert ingest.ctx.counters["window.messages_skipped"] == 7


def test_a_partition_without_a_committed_offset_starts_where_its_log_starts(
    clock: _Clock,
) -> None:
    ingest, _, _ = _agent()
    ingest._uncommitted.add(_TP)  # a new group: what retention deleted was never its own
    ingest._consumer = Polls(ingest, [7], clock.now - 2.0)
    ingest._taken_over.set()
    asyncio.run(ingest._run())
    assert ingest._next[_TP] == 8 and ingest.stats.batches == 1
    assert not ingest.ctx.counters["window.messages_skipped"] and not ingest._uncommitted
