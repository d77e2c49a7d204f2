"""``LiveFleet.prebuild``: the batches built ahead hold exactly the messages sent live."""

from __future__ import annotations

import asyncio

from aiokafka.partitioner import murmur2
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from kernelstream.bench.pipeline_input import LiveFleet


class _Producer:
    """What ``prebuild`` asks of a producer: the topic's partitions and empty batches (the
    real aiokafka batch builder, compressing with zstd as the nodes do)."""

    async def partitions_for(self, topic: str) -> set[int]:
        return {0, 1, 2}

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(1 << 20, compression_type=4)  # 4: zstd


def _records(batch: BatchBuilder) -> list[tuple[bytes, bytes, int]]:
    got = DefaultRecordBatch(bytearray(batch._build()))
    return [(r.key, r.value, r.timestamp) for r in got]


def test_prebuilt_batches_hold_the_live_messages_in_order_on_their_partitions() -> None:
    live, ahead = LiveFleet(256_000.0), LiveFleet(256_000.0)
    plan = asyncio.run(ahead.prebuild(_Producer(), "t", 1_800_000_000, 2))
    assert [sj for sj, _, _ in plan] == [
        (s, j) for s in (1_800_000_000, 1_800_000_001) for j in range(len(live.slices))
    ]
    for (second, j), batches, launches in plan:
        want = live.messages(second, j)
        stamp = int(live.send_time(second, j) * 1000)
        got: dict[int, list[tuple[bytes, bytes, int]]] = {}
        for p, batch in batches:
            got.setdefault(p, []).extend(_records(batch))
        for p, records in got.items():
            mine = [(k, v, stamp) for k, v in want if (murmur2(k) & 0x7FFFFFFF) % 3 == p]
            assert records == mine
        assert sum(map(len, got.values())) == len(want)
        a, b, _ = live.slices[j]
        assert launches == (b - a) * len(live.streams)


def test_build_time_leaves_the_sequence_numbers_as_they_were() -> None:
    fleet, other = LiveFleet(64_000.0), LiveFleet(64_000.0)
    assert asyncio.run(fleet.build_time(_Producer(), "t")) > 0.0
    assert fleet.messages(1_800_000_000, 0) == other.messages(1_800_000_000, 0)
