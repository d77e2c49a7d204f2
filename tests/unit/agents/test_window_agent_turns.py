"""The window agent leaves the event loop to the worker's other agents while it works.

aiokafka's ``getmany`` hands out records it has buffered without suspending, so under
load a window agent that never awaited anything that suspends kept the loop for poll
after poll, and the Faust agents beside it (the tuner) waited: the finding ->
recommendation hop grew with the load.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.logic.windowing import Windower
from kernelstream.agents.window_agent import WindowIngest, poll_parts
from kernelstream.app.settings import Settings
from kernelstream.schemas import encode
from tests.bad_input import good_batch


class Topic:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None) -> None:
        self.sent.append(value)


class BufferedConsumer:
    """Hands out one full poll that it already holds, without suspending, as aiokafka
    does with buffered records; the agent's next poll ends the run."""

    def __init__(self, ingest: WindowIngest, tp: Any, msgs: list[Any]) -> None:
        self.ingest, self.tp, self.msgs = ingest, tp, msgs

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if not self.msgs:
            self.ingest._left = True
            return {}
        msgs, self.msgs = self.msgs, []
        return {self.tp: msgs}


def _poll(n_msgs: int, launches: int) -> list[SimpleNamespace]:
    """A full poll at the real sizes: ``n_msgs`` streams' batches of ``launches`` each."""
    t0 = time.time() - 60.0
    out = []
    for i in range(n_msgs):
        batch = good_batch(f"node-{i}", "matmul", t0, launches, 0)
        key, value = batch.stream_key.encode(), encode(batch)
        out.append(SimpleNamespace(topic="t", partition=0, offset=i, key=key, value=value))
    return out


def test_other_tasks_run_while_the_agent_works_through_a_buffered_poll() -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ingest = WindowIngest(None, WorkerContext(Settings(), topics), Windower())
    tp = TopicPartition("ks.launches", 0)
    ingest._next[tp], ingest._keys_of[tp] = 0, set()
    msgs = _poll(128, 2000)  # the agent's poll size, nodes' default batch size
    ingest._consumer = BufferedConsumer(ingest, tp, msgs)
    seen_during: list[int] = []

    async def other_agent() -> None:
        while not ingest._left:
            seen_during.append(ingest.stats.batches)
            await asyncio.sleep(0)

    async def main() -> None:
        other = asyncio.create_task(other_agent())
        await asyncio.sleep(0)  # it runs once before the agent starts
        await ingest._run()
        await other

    asyncio.run(main())
    assert ingest.stats.batches == 128
    # It ran again while the poll was being processed, not only once the poll was done.
    assert any(0 < b < 128 for b in seen_during), seen_during
    assert ingest.stats.turns_given > 0


def test_a_poll_is_decoded_in_parts_of_bounded_size() -> None:
    events = [SimpleNamespace(value=b"x" * 300_000) for _ in range(10)]
    parts = list(poll_parts(events))
    assert [len(p) for p in parts] == [4, 4, 2]
    assert [e for p in parts for e in p] == events
