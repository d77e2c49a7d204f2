"""One reader takes ks.findings for the tuner and alert stages: each finding decoded once,
from the partitions the app's group assigned this worker on ks.reconfig."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from kernelstream.agents import findings_agent
from kernelstream.agents.context import WorkerContext
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, Finding, decode, encode
from tests.unit.agents.test_logic_tuning import START, finding
from tests.unit.agents.test_window_agent_failures import Topic


class _Consumer:
    """What the reader uses of an aiokafka consumer: its assignment and commits."""

    def __init__(
        self, assigned: set[TopicPartition] | None = None, uncommitted: int | None = None
    ) -> None:
        self.assigned = set(assigned or ())
        self.commits: list[dict[TopicPartition, int]] = []
        # the partition the group never committed, and where the broker says its log begins
        self.uncommitted, self.beginning = uncommitted, 1
        self.seeks: dict[TopicPartition, int] = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = set(tps)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def highwater(self, tp: TopicPartition) -> int:
        return 10

    async def committed(self, tp: TopicPartition) -> int | None:
        return None if tp.partition == self.uncommitted else 3

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks[tp] = offset

    async def position(self, tp: TopicPartition) -> int:
        if tp in self.seeks:
            return self.seeks[tp]
        # a committed offset, else the reset's: the broker's beginning
        return self.beginning if tp.partition == self.uncommitted else 3


class _Stage:
    def __init__(self) -> None:
        self.bursts: list[list[tuple[Any, Finding]]] = []

    async def on_findings(self, burst: list[tuple[Any, Finding]]) -> None:
        self.bursts.append(burst)


F0 = TopicPartition("ks.findings", 0)


def _msg(offset: int, value: bytes, partition: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        topic="ks.findings", partition=partition, offset=offset, key=b"g", value=value
    )


def _reader(
    stages: list[Any], consumer: _Consumer | None = None
) -> tuple[findings_agent.FindingsReader, dict[str, Topic]]:
    topics = {role: Topic() for role in ("findings", "deadletter")}
    ctx = WorkerContext(Settings(), topics)
    reader = findings_agent.FindingsReader(None, ctx, stages, None)
    reader._consumer = consumer or _Consumer({F0})
    reader._consumer_started.set()
    return reader, topics


def test_each_finding_is_decoded_once_for_every_stage_and_refused_once() -> None:
    tuner, alerts = _Stage(), _Stage()
    reader, topics = _reader([tuner, alerts])
    good = [encode(finding(START, 100.0, node=n)) for n in ("a", "b", "c")]
    polls = [
        {F0: [_msg(0, good[0]), _msg(1, b'{"schema": "ks.finding/2"'), _msg(2, good[1])]},
        {F0: [_msg(3, good[2])]},
    ]
    for poll in polls:
        asyncio.run(reader.take(poll))
    assert tuner.bursts == alerts.bursts
    assert [[f.node for _, f in b] for b in tuner.bursts] == [["a", "b"], ["c"]]
    # the same objects: one decode serves both stages
    tuned = [f for b in tuner.bursts for _, f in b]
    assert all(x is y for x, y in zip(tuned, [f for b in alerts.bursts for _, f in b], strict=True))
    [letter] = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert (letter.stage, letter.reason_code, letter.offset) == ("findings", "truncated", 1)
    assert reader.ctx.counters["read.findings"] == 4
    assert reader.lag() == {("ks.findings", 0): 6}  # high watermark 10, next offset 4


def test_a_burst_with_nothing_valid_reaches_no_stage() -> None:
    stage = _Stage()
    reader, topics = _reader([stage])
    asyncio.run(reader.take({F0: [_msg(0, b"[]")]}))
    assert stage.bursts == [] and len(topics["deadletter"].sent) == 1


def test_records_of_a_partition_not_owned_or_taken_before_are_left_out() -> None:
    stage = _Stage()
    reader, _ = _reader([stage])
    good = encode(finding(START, 100.0, node="a"))
    f1 = TopicPartition("ks.findings", 1)
    asyncio.run(reader.take({F0: [_msg(0, good), _msg(1, good)]}))
    # a poll from before a re-assignment: offsets 0 and 1 again, and a partition revoked
    asyncio.run(reader.take({F0: [_msg(1, good), _msg(2, good)], f1: [_msg(0, good, 1)]}))
    assert [len(b) for b in stage.bursts] == [2, 1]
    assert reader.ctx.counters["read.findings"] == 3


def test_the_reader_follows_the_app_groups_reconfig_partitions_and_commits_on_revoke() -> None:
    consumer = _Consumer(set())
    reader, _ = _reader([_Stage()], consumer)
    tp = findings_agent.TopicPartition

    async def run() -> None:
        # the app's group: outcomes (ks.reconfig) partitions 0 and 2, and another topic
        await reader.on_assigned({tp("ks.reconfig", 0), tp("ks.reconfig", 2), tp("x", 1)})
        assert consumer.assigned == {tp("ks.findings", 0), tp("ks.findings", 2)}
        # reading starts at the committed offset (3): its lag is known before any record
        assert reader.lag() == {("ks.findings", 0): 7, ("ks.findings", 2): 7}
        await reader.take({tp("ks.findings", 2): [_msg(2, b"[]", 2), _msg(5, b"[]", 2)]})
        assert reader.ctx.counters["read.findings"] == 1  # offset 2 is before the position
        await reader.on_revoked({tp("ks.reconfig", 2)})
        assert consumer.assigned == {tp("ks.findings", 0)}
        assert consumer.commits == [{tp("ks.findings", 2): 6}]  # taken through offset 5
        await reader.on_assigned({tp("ks.reconfig", 0), tp("ks.reconfig", 1)})
        assert consumer.assigned == {tp("ks.findings", 0), tp("ks.findings", 1)}
        assert len(consumer.commits) == 1  # nothing new to commit

    asyncio.run(run())


def test_a_partition_without_a_committed_offset_is_read_from_its_first_record() -> None:
    # The embedded broker can say a fresh partition begins at 1 while offset 0 holds a
    # finding (agents.first_offset): the reader starts at 0, not at the broker's beginning.
    consumer = _Consumer(set(), uncommitted=1)
    reader, _ = _reader([_Stage()], consumer)
    tp = findings_agent.TopicPartition

    async def run() -> None:
        await reader.on_assigned({tp("ks.reconfig", 0), tp("ks.reconfig", 1)})
        assert consumer.seeks == {tp("ks.findings", 1): 0}  # the committed one is not moved
        assert reader.lag() == {("ks.findings", 0): 7, ("ks.findings", 1): 10}

    asyncio.run(run())
