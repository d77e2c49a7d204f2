"""Record batches to Kafka, one batch in flight per partition (the window agent's bursts).

A window agent publishes a burst at every window close: a window and a finding per
stream. Sent one by one, each record costs the producer's per-record work (its
partitioner's metadata lookups, the accumulator, a delivery future resolved on
acknowledgement); appended to a record batch (aiokafka's batch interface) it costs a
few microseconds with its share of the batch's compression. With 182-launch batches
publishing took 69 us a window record by record and 34 this way
(``bench/results/pipeline-peers-small-publish-ab-2026-11-28.txt``, medians of 5 rounds).

A batch handed to the producer while the partition's previous one is still waiting to
go out makes the caller wait until it has gone: with a broker round trip of a
millisecond or more and a burst spread over consecutive polls, the window agent would
wait. So here each partition has at most one batch with the producer; the records that
come meanwhile gather in the partition's next batch, handed over when the one before is
acknowledged. Order within a partition is the order of :meth:`BatchPublisher.add`. A
full batch waits for the one before it: that is the backpressure of the producer's own
full buffers.

A batch the broker did not take (after the producer's retries), or one the producer
refused, is logged and counted (``publish.failed``, its records) and fails the next
:meth:`BatchPublisher.add` or :meth:`BatchPublisher.flush` (:class:`PublishError`): the
window agent stops before a checkpoint could say those windows were published, and a
worker restarted from the last checkpoint publishes them again.

:meth:`BatchPublisher.flush` hands over what is gathered and waits for it to land; the
window agent calls it (through ``WorkerContext.flush``) before the producer's flush at a
checkpoint or a handover.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from kernelstream.agents.retry_log import advice

__all__ = ["BatchPublisher", "PublishError"]

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """A record batch was lost: what the publisher took since its last flush is not all on
    the broker."""


class BatchPublisher:
    """Record batches of one aiokafka producer (``create_batch``, ``send_batch``)."""

    def __init__(self, producer: Any, counters: Counter[str]) -> None:
        self.producer = producer
        self.counters = counters
        # per (topic, partition): records gathered for the next batch; the batch with the
        # producer (its delivery future); one hand-over at a time
        self._next: dict[tuple[str, int], Any] = {}
        self._flying: dict[tuple[str, int], asyncio.Future[Any]] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._tasks: set[asyncio.Future[None]] = set()
        self.error: PublishError | None = None  # the first batch lost, for good

    async def add(self, topic: str, partition: int, records: Sequence[tuple[bytes, bytes]]) -> None:
        """Publish ``records`` ((key, value), in order) to ``partition`` of ``topic``."""
        if self.error is not None:
            raise self.error
        tp = (topic, partition)
        for key, value in records:
            batch = self._next.get(tp)
            if batch is None:
                batch = self._next[tp] = self.producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is not None:
                continue
            # full (it closed itself): handed over once the one before it has landed;
            # this record starts the next (an empty batch takes any record)
            await self._hand_over(tp, wait=True)
            batch = self._next[tp] = self.producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:
                raise ValueError(f"a record of {len(value)} bytes does not fit a record batch")
        flying = self._flying.get(tp)
        if flying is None or flying.done():
            await self._hand_over(tp, wait=False)

    async def flush(self) -> None:
        """Hand over what is gathered and wait until it, and every batch handed over
        before, has landed. Records added meanwhile may wait for a later flush: a
        publisher that never stops would otherwise keep this one from returning."""
        if self._tasks:  # hand-overs under way: their batches are not yet in _flying
            await asyncio.wait(list(self._tasks))
        for tp in list(self._next):
            await self._hand_over(tp, wait=True)
        flying = [f for f in self._flying.values() if not f.done()]
        if flying:
            await asyncio.wait(flying)
        if self.error is not None:
            raise self.error

    async def _hand_over(self, tp: tuple[str, int], *, wait: bool) -> None:
        """Hand the partition's gathered batch to the producer, after the one before it
        has landed (``wait``), or only if it has (not ``wait``: it is handed over when that
        one lands)."""
        lock = self._locks.get(tp)
        if lock is None:
            lock = self._locks[tp] = asyncio.Lock()
        async with lock:
            flying = self._flying.get(tp)
            if flying is not None and not flying.done():
                if not wait:
                    return
                await asyncio.wait([flying])
            batch = self._next.pop(tp, None)
            if batch is None or not batch.record_count():
                return
            batch.close()
            count = batch.record_count()
            try:
                future = await self.producer.send_batch(batch, tp[0], partition=tp[1])
            except Exception as ex:
                self._lost(tp, count, ex)
                raise
            self._flying[tp] = future
            future.add_done_callback(lambda f: self._landed(tp, f, count))

    def _lost(self, tp: tuple[str, int], count: int, why: BaseException | None) -> None:
        self.counters["publish.failed"] += count
        # where the broker refused this client (its ACLs, its credentials): what to fix
        hint = advice(why) if why is not None else None
        fix = f"; {hint}" if hint else ""
        log.error("publishing %d records to %s[%d] failed: %r%s", count, tp[0], tp[1], why, fix)
        if self.error is None:
            self.error = PublishError(
                f"a batch of {count} records to {tp[0]}[{tp[1]}] was lost ({why!r}){fix}"
            )

    def _landed(self, tp: tuple[str, int], future: asyncio.Future[Any], count: int) -> None:
        if future.cancelled() or future.exception() is not None:
            self._lost(tp, count, None if future.cancelled() else future.exception())
        if tp in self._next:  # what gathered meanwhile goes now
            task = asyncio.ensure_future(self._hand_over(tp, wait=False))
            self._tasks.add(task)
            task.add_done_callback(self._handed)

    def _handed(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failure was logged, counted and kept (_lost)
