"""Reading a partition from its first record: offset 0, not the broker's "beginning".

A consumer that starts at a partition's beginning asks the broker where its log starts
(ListOffsets, what ``auto_offset_reset="earliest"`` and ``seek_to_beginning`` do). The
embedded broker (Tansu, memory storage) can answer one too high: when the first records
of a fresh partition come from two producers at once (two nodes' launch batches, the
burst after an outage), the log's start becomes the offset of whichever write finished
first. Measured: 4 producers writing the first record of 30 fresh topics together, 3
topics answered a beginning of 1 while a fetch at offset 0 returned that record; a
consumer starting at the beginning skips it, silently (a CI run of the outage test lost
one launch batch that way).

So the consumers that must read a partition whole seek to offset 0. On Apache Kafka,
whose log start moves only when records are deleted (retention, DeleteRecords), a
fetch at 0 of such a log is answered OffsetOutOfRange and the consumer's reset
(``auto_offset_reset="earliest"``, which these consumers must have) takes it to the
log's start: where ``seek_to_beginning`` would have gone, one round trip later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

__all__ = ["assign_from_first", "partitions_of", "seek_to_first"]


def seek_to_first(consumer: Any, tps: Iterable[Any]) -> None:
    """Position an ``earliest``-resetting aiokafka consumer at each partition's first
    record (offset 0, or the log's start where records before it were deleted)."""
    for tp in tps:
        consumer.seek(tp, 0)


async def partitions_of(
    consumer: Any, topics: Iterable[str], timeout_s: float = 30.0
) -> dict[str, list[int]]:
    """Each of ``topics``' partition numbers, as a started consumer's metadata has them,
    refreshed until every topic has some; after ``timeout_s`` a topic still without
    partitions raises ``LookupError``, and one the broker's ACLs do not let this client
    describe raises aiokafka's ``TopicAuthorizationFailedError`` at once."""
    from aiokafka.errors import TopicAuthorizationFailedError

    topics = list(topics)
    deadline = time.monotonic() + timeout_s
    while True:
        parts = {t: consumer.partitions_for_topic(t) for t in topics}
        missing = [t for t, p in parts.items() if not p]
        if not missing:
            return {t: sorted(p) for t, p in parts.items()}
        # A topic the broker's ACLs hide has no partitions either: say that, at once. A
        # metadata request for every topic leaves it out; one that names it says why.
        client = consumer._client
        hidden = set(missing) & set(getattr(client.cluster, "unauthorized_topics", ()))
        if hidden:
            raise TopicAuthorizationFailedError(", ".join(sorted(hidden)))
        for t in missing:
            client.add_topic(t)
        if time.monotonic() > deadline:
            raise LookupError(
                f"no partitions for {missing} after {timeout_s:.0f} s; were they created?"
            )
        await client.force_metadata_update()
        await asyncio.sleep(0.1)


async def assign_from_first(
    consumer: Any, topics: Iterable[str], timeout_s: float = 30.0
) -> list[Any]:
    """Assign every partition of ``topics`` to a started consumer (no group) and seek
    each to its first record; return them (:func:`partitions_of` waits for them)."""
    from aiokafka import TopicPartition

    parts = await partitions_of(consumer, topics, timeout_s)
    tps = [TopicPartition(t, p) for t, ps in parts.items() for p in ps]
    consumer.assign(tps)
    seek_to_first(consumer, tps)
    return tps
