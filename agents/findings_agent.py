"""Findings reader: ks.findings -> the tuner stage and the alert stage, each finding read once.

Findings are keyed by fleet group, so one worker owns a group's whole history, and both
stages that learn from findings (the tuner, :mod:`agents.tuner_agent`, and the predictive
alerts, :mod:`agents.alert_agent`) want every finding of the groups it owns, in order.
The reader takes them a consumer poll at a time, checks and decodes each once at the edge,
and hands the poll's findings to each stage in turn: the tuner first (a node waits for its
recommendation), then the alerts.

Findings are the worker's second stream by rate, one per window closed (a fleet of 512
streams closes about 500 windows a second), so like the launches (:mod:`agents.window_agent`)
they do not go through Faust's per-event stream machinery: its consumer thread, per-event
futures, acknowledgements and take buffer cost about 250 us an event on a two-core machine
(``kernelstream bench pipeline-peers``: the Faust peer spends that per message beyond its
NumPy work, and a worker's tuner and alert stages spent as much again as its window stage
with 182-launch batches). A plain aiokafka consumer reads them, about 9 us a record.

**Ownership follows the app's group.** The tuner learns from a group's findings and from
its nodes' reconfiguration outcomes (ks.reconfig, read by the Faust app's group, agent
``outcomes``), so both must reach the same worker. The two topics are co-partitioned (same
key, the fleet group; same partition count), so the reader takes exactly the findings
partitions whose numbers the app's group assigned this worker on ks.reconfig, and follows
every rebalance through the app's ``on_partitions_revoked`` and ``on_partitions_assigned``
signals: it stops reading a revoked partition before the new owner starts.

**At least once.** Positions are the committed offsets of the consumer group
``<app_id>.findings``, which has no members (the reader assigns its partitions itself):
committed after the stages took the findings, about once a second, when a partition is
revoked and when the worker stops. A crash re-reads at most the last second's findings,
as the Faust agent before it re-read those after its last commit.

A finding that does not pass the edge checks is dead-lettered once, stage ``findings``;
what a stage refuses of a valid finding carries that stage's name (``tuner``, ``alerts``).
The counter ``read.findings`` (``kernelstream_worker_findings_read_total``) counts every
finding taken and done with, valid or not: against the findings published it says how far
behind the stages that learn from them are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiokafka import TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError
from mode import Service

from kernelstream.agents.context import RecordEvent, WorkerContext, partition_lag
from kernelstream.agents.first_offset import seek_to_first
from kernelstream.schemas import Finding

__all__ = ["POLL_RECORDS", "STAGE", "FindingStage", "FindingsReader", "owned_findings", "register"]

log = logging.getLogger("kernelstream.findings")

STAGE = "findings"

# Records a poll takes (the stages get them as one burst), and how often the position is
# committed while reading.
POLL_RECORDS = 256
_COMMIT_EVERY_S = 1.0


class FindingStage(Protocol):
    """A stage fed with every decoded finding of the worker's fleet groups, in order."""

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        """Take a burst of (event, finding), in the topic's order per partition."""


def owned_findings(
    assigned: Iterable[Any],
    reconfig: str,
    findings: str,
    counts: tuple[int, int] | None = None,
) -> set[TopicPartition]:
    """The findings partitions co-partitioned with the ks.reconfig partitions among
    ``assigned`` (the app group's assignment: any topics, each with ``topic`` and
    ``partition``).

    ``counts``: the partition counts of (findings, reconfig) where known. Topics created
    by kernelstream have equal counts; where an operator gave them different ones, findings
    partition ``p`` goes with reconfig partition ``p % reconfig's count``, so that every
    findings partition has an owner (a group's findings and outcomes may then meet on
    different workers: give the two topics the same count).

    >>> from collections import namedtuple
    >>> TP = namedtuple("TP", "topic partition")
    >>> sorted(owned_findings([TP("r", 2), TP("x", 5), TP("r", 0)], "r", "f"))
    [TopicPartition(topic='f', partition=0), TopicPartition(topic='f', partition=2)]
    >>> sorted(p.partition for p in owned_findings([TP("r", 1)], "r", "f", (6, 4)))
    [1, 5]
    """
    mine = {tp.partition for tp in assigned if tp.topic == reconfig}
    if counts is None or counts[0] == counts[1] or counts[1] <= 0:
        return {TopicPartition(findings, p) for p in mine}
    return {TopicPartition(findings, p) for p in range(counts[0]) if p % counts[1] in mine}


class FindingsReader(Service):
    """Reads the findings of the fleet groups this worker owns and feeds the stages."""

    def __init__(
        self,
        app: Any,
        ctx: WorkerContext,
        stages: list[FindingStage],
        make_consumer: Callable[[], Any] | None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.app, self.ctx, self.stages = app, ctx, stages
        self._make_consumer = make_consumer
        self._consumer: Any = None
        self._consumer_started = asyncio.Event()
        # One reader of the consumer's state at a time: the poll's processing, the commits
        # and the (re)assignments the app's rebalances make.
        self._lock = asyncio.Lock()
        self._next: dict[TopicPartition, int] = {}  # next offset to process, per partition
        self._committed: dict[TopicPartition, int] = {}
        self._committed_at = 0.0
        self._closed = False
        # partition counts of (findings, reconfig), read at each assignment
        self._counts: tuple[int, int] | None = None
        self._warned_counts: tuple[int, int] | None = None
        self._findings_topic = str(ctx.settings.topic_findings)
        self._reconfig_topic = str(ctx.settings.topic_reconfig)

    async def on_start(self) -> None:
        if self._make_consumer is None:
            raise RuntimeError("the findings reader needs a way to make its consumer")
        self._consumer = self._make_consumer()
        await self._consumer.start()
        self._consumer_started.set()
        self.add_future(self._run())

    async def on_stop(self) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit what the stages took and stop reading (idempotent)."""
        if self._consumer is None or self._closed:
            return
        self._closed = True
        async with self._lock:
            await self._commit()
        await self._consumer.stop()

    def ready(self) -> bool:
        return self._consumer_started.is_set() and not self._closed

    def lag(self) -> dict[tuple[str, int], int]:
        """Findings not yet taken per owned partition (the last fetch's high watermark;
        ``_next`` holds exactly the partitions owned)."""
        return partition_lag(self._consumer, self._next)

    # -- ownership, from the app group's rebalances -----------------------------------

    def _owned(self, assigned: Iterable[Any]) -> set[TopicPartition]:
        counts = self._counts
        if counts is not None and counts[0] != counts[1] and counts != self._warned_counts:
            self._warned_counts = counts
            log.warning(
                "%s has %d partitions and %s %d: a fleet group's findings and its outcomes "
                "may reach different workers; give both the same count",
                self._findings_topic,
                counts[0],
                self._reconfig_topic,
                counts[1],
            )
        return owned_findings(assigned, self._reconfig_topic, self._findings_topic, counts)

    async def on_revoked(self, revoked: Iterable[Any]) -> None:
        """Commit the revoked partitions' positions and stop reading them."""
        await self._consumer_started.wait()
        drop = self._owned(revoked)
        if not drop or self._closed:
            return
        async with self._lock:
            await self._commit()
            keep = set(self._consumer.assignment()) - drop
            self._consumer.assign(sorted(keep))
            for tp in drop:
                self._next.pop(tp, None)
                self._committed.pop(tp, None)

    async def on_assigned(self, assigned: Iterable[Any]) -> None:
        """Read exactly the findings partitions co-partitioned with the assignment."""
        await self._consumer_started.wait()
        await self._metadata()
        want = self._owned(assigned)
        if self._closed:
            return
        async with self._lock:
            if want == set(self._consumer.assignment()):
                return
            await self._commit()
            # assign() replaces the assignment; every partition then reads on from its
            # committed offset, just written for those it keeps.
            self._consumer.assign(sorted(want))
            self._next = {tp: n for tp, n in self._next.items() if tp in want}
            self._committed = {tp: n for tp, n in self._committed.items() if tp in want}
            for tp in want - set(self._next):
                # where reading starts (the committed offset, else the first record, not
                # the broker's "beginning": agents.first_offset): the lag is known before
                # the first record
                try:
                    if await asyncio.wait_for(self._consumer.committed(tp), 10.0) is None:
                        seek_to_first(self._consumer, [tp])
                    at = await asyncio.wait_for(self._consumer.position(tp), 10.0)
                    self._next[tp] = self._committed[tp] = at
                except (KafkaError, TimeoutError) as ex:
                    log.warning("position of %s not read: %r", tp, ex)
        log.info("reading findings partitions %s", sorted(tp.partition for tp in want))

    async def _metadata(self) -> None:
        """Read the two topics' partition counts (at each assignment: an operator may have
        added partitions). A failure leaves the last counts read, or none: partitions are
        then taken by number."""
        client = getattr(self._consumer, "_client", None)
        if client is None:
            return
        try:
            cluster = await client.fetch_all_metadata()
        except KafkaError as ex:
            log.warning("reading the partitions of %s failed: %r", self._findings_topic, ex)
            return
        f = cluster.partitions_for_topic(self._findings_topic)
        r = cluster.partitions_for_topic(self._reconfig_topic)
        if f and r:
            self._counts = (len(f), len(r))

    # -- reading ------------------------------------------------------------------------

    async def _run(self) -> None:
        consumer = self._consumer
        while not (self.should_stop or self._closed):
            if not consumer.assignment():
                await asyncio.sleep(0.1)
                continue
            try:
                fetched = await consumer.getmany(timeout_ms=200, max_records=POLL_RECORDS)
            except ConsumerStoppedError:
                break
            except KafkaError as ex:  # the assignment changed under the poll, or the broker
                log.debug("findings poll: %r", ex)
                await asyncio.sleep(0.1)
                continue
            async with self._lock:
                if fetched:
                    await self.take(fetched)
                if time.monotonic() - self._committed_at >= _COMMIT_EVERY_S:
                    await self._commit()
            if fetched:
                await asyncio.sleep(0)  # a turn of the loop for the window agent

    async def take(self, fetched: dict[Any, list[Any]]) -> None:
        """One poll's findings (partition -> records): each decoded once, then the valid
        ones to every stage as one burst, in order per partition. Records of a partition no
        longer owned, or from before a re-assignment's position, are left out."""
        assignment = set(self._consumer.assignment()) if self._consumer is not None else None
        burst: list[tuple[Any, Finding]] = []
        taken = 0
        for tp, msgs in fetched.items():
            if assignment is not None and tp not in assignment:
                continue
            nxt = self._next.get(tp, -1)
            for msg in msgs:
                if msg.offset < nxt:
                    continue
                taken += 1
                event = RecordEvent(msg)
                finding = await self.ctx.decode(STAGE, event, Finding)
                if finding is not None:
                    burst.append((event, finding))
            if msgs:
                self._next[tp] = max(nxt, msgs[-1].offset + 1)
        if burst:
            for stage in self.stages:
                await stage.on_findings(burst)
        self.ctx.counters["read.findings"] += taken

    async def _commit(self) -> None:
        """Commit the positions the stages have taken (a failure is retried next time:
        until then a restart re-reads those findings)."""
        self._committed_at = time.monotonic()
        offsets = {tp: n for tp, n in self._next.items() if self._committed.get(tp) != n}
        if not offsets or self._consumer is None:
            return
        try:
            await self._consumer.commit(offsets)
        except KafkaError as ex:
            log.warning("committing findings positions failed (retried): %r", ex)
            return
        self._committed.update(offsets)


def register(
    app: Any,
    ctx: WorkerContext,
    stages: list[FindingStage],
    make_consumer: Callable[[], Any] | None,
) -> FindingsReader:
    """The findings reader, a child of the app, following the app group's assignment."""
    reader = FindingsReader(app, ctx, stages, make_consumer)
    app.add_dependency(reader)

    async def revoked(sender: Any, /, revoked: Any, *args: Any, **kwargs: Any) -> None:
        await reader.on_revoked(revoked)

    async def assigned(sender: Any, /, assigned: Any, *args: Any, **kwargs: Any) -> None:
        await reader.on_assigned(assigned)

    app.on_partitions_revoked.connect(revoked)  # strong references (weak=False)
    app.on_partitions_assigned.connect(assigned)

    # Faust stops its producer before its children: commit and stop while it runs.
    async def shutdown(sender: Any, /, *args: Any, **kwargs: Any) -> None:
        await reader.close()

    app.on_before_shutdown.connect(shutdown)
    ctx.probes.update({"findings.ready": reader.ready, "findings.lag": reader.lag})
    return reader
