"""The window agent gives the event loop a turn after every consumer poll.

aiokafka's ``getmany`` returns records already fetched without suspending. Under load the
agent then ran poll after poll, and the worker's other tasks (the Faust consumer handing
findings to the tuner, the producer's sender, the timers) waited until it caught up: the
finding -> recommendation hop took 0.65-1.5 s at 90% of capacity, 0.37-0.50 s with a turn
per poll (``bench/results/pipeline-latency-2026-11-26-yield-ab-*.txt``).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.windowing import Windower
from kernelstream.agents.window_agent import WindowIngest
from kernelstream.app.settings import Settings
from kernelstream.schemas import encode
from tests.bad_input import good_batch
from tests.unit.agents.test_window_agent_failures import Topic

_TP = TopicPartition("ks.launches", 0)
_POLLS = 20


class Polls:
    """A consumer with records already fetched: each poll returns at once the next of
    ``offsets``, one 20-launch batch each, then the agent is told to leave."""

    def __init__(self, ingest: WindowIngest, offsets: list[int], t0: float) -> None:
        self.ingest, self.offsets, self.t0, self.polls = ingest, offsets, t0, 0

    def highwater(self, tp: Any) -> int:
        return self.offsets[-1] + 1

    async def position(self, tp: Any) -> int:
        return int(self.ingest._next[tp])

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        if self.polls == len(self.offsets):
            self.ingest._left = True
            return {}
        i, self.polls = self.polls, self.polls + 1
        batch = good_batch("n1", "matmul", self.t0 + 0.1 * i, 20, 20 * i)
        msg = SimpleNamespace(
            topic=_TP.topic,
            partition=_TP.partition,
            offset=self.offsets[i],
            key=batch.stream_key.encode(),
            value=encode(batch),
        )
        return {_TP: [msg]}


async def _turns_of_another_task() -> tuple[int, WindowIngest]:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ingest = WindowIngest(None, WorkerContext(Settings(), topics), Windower())
    ingest._consumer = Polls(ingest, list(range(_POLLS)), time.time() - 10.0)
    ingest._next[_TP] = 0
    ingest._keys_of[_TP] = set()
    ingest._taken_over.set()
    turns = 0

    async def other() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)  # it starts
    start = turns
    await ingest._run()
    task.cancel()
    return turns - start, ingest


def test_other_tasks_run_between_polls_that_return_at_once() -> None:
    turns, ingest = asyncio.run(_turns_of_another_task())
    assert ingest.stats.batches == _POLLS and ingest._next[_TP] == _POLLS
    assert turns >= _POLLS, f"another task ran {turns} times in {_POLLS} polls"
