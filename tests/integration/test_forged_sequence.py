"""One forged launch batch with a huge sequence number, then the stream's real batches,
through a real worker: every real launch is windowed, the forgery is dead-lettered.

Emission is at least once (see :mod:`agents.window_agent`): a redelivery after a
rebalance or a producer retry under load may dead-letter the forgery again, or a real
batch as a ``duplicate``. Neither changes what was windowed, so both are allowed; any
other letter is not."""

from __future__ import annotations

import asyncio
import math
import subprocess
import time

import orjson
import pytest

from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, WindowAggregate, encode
from tests.bad_input import good_batch
from tests.integration.helpers import TopicReader, produce

pytestmark = pytest.mark.integration


async def _scenario(s: Settings) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    # Half a second into a window: the first batch (its first launch fails) never begins
    # in the last 10 ms of a window, where that window would hold only the failed launch
    # and the alert stage would rightly refuse to forecast from it (``series_gap``).
    now = math.floor(time.time()) + 0.5
    first = good_batch(s.node_id, "matmul", now - 3.0, 20, 0)
    forged = first.to_wire() | {"seq_start": 2**53, "t_end": [now - 2.7] * 20}
    real = [
        good_batch(s.node_id, "matmul", now - 2.6 + 0.2 * i, 20, 20 + 20 * i) for i in range(10)
    ]
    key = first.stream_key.encode()
    items: list[tuple[bytes | None, bytes]] = [(key, encode(first)), (key, orjson.dumps(forged))]
    items += [(key, encode(b)) for b in real]
    await produce(bootstrap, s.topic_launches, items)

    def windowed(r: TopicReader) -> int:
        return sum(
            w.count + w.failures
            for w in r.records[s.topic_windows]
            if isinstance(w, WindowAggregate)
        )

    async with TopicReader(bootstrap, s.topic_windows, s.topic_deadletter) as r:
        await r.until(lambda: windowed(r) >= 220, 60, "windows of all 220 real launches")
        await asyncio.sleep(1.0)
        await r.poll()
    assert windowed(r) == 220
    letters = [d for d in r.records[s.topic_deadletter] if isinstance(d, DeadLetter)]
    seen = "; ".join(f"{d.reason_code}@{d.partition}:{d.offset} {d.reason}" for d in letters)
    forgeries = [d for d in letters if d.reason_code == "implausible_seq"]
    assert forgeries, f"the forgery was not dead-lettered; letters: {seen or 'none'}"
    assert all(str(2**53) in d.reason for d in forgeries), seen
    assert len({(d.partition, d.offset) for d in forgeries}) == 1, seen
    assert all(d.reason_code in ("implausible_seq", "duplicate") for d in letters), seen


def test_a_forged_sequence_number_does_not_silence_the_stream(
    settings: Settings, worker: subprocess.Popen[bytes]
) -> None:
    asyncio.run(_scenario(settings))
    assert worker.poll() is None
