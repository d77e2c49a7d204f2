"""The window agent skips a message it fails on, with a dead letter, instead of dying."""

from __future__ import annotations

import asyncio
import base64
import math
import time
from types import SimpleNamespace
from typing import Any

import pytest

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.detector_agent import InlineDetector
from kernelstream.agents.logic.detection import Detector
from kernelstream.agents.logic.windowing import Windower
from kernelstream.agents.window_agent import WindowIngest
from kernelstream.app.settings import Settings
from kernelstream.schemas import (
    DeadLetter,
    Finding,
    WindowAggregate,
    columnar,
    decode,
    encode,
)
from tests.bad_input import OVERFLOWING, good_batch, overflowing


class Topic:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None) -> None:
        self.sent.append(value)


class FailingWindower(Windower):
    def add_columns(self, cols: Any, now: float) -> Any:
        raise ZeroDivisionError("a defect in the window maths")

    def add_in_order(self, run: Any, now: float) -> Any:
        raise ZeroDivisionError("a defect in the window maths")


class RunFailsAfterOne(Windower):
    """Counts the first batch of a run, then fails (a defect in the run's path only)."""

    def add_in_order(self, run: Any, now: float) -> Any:
        super().add_in_order(run[:1], now)
        raise ZeroDivisionError("a defect in the run's window maths")


def _msg(offset: int, kernel: str = "matmul") -> SimpleNamespace:
    batch = good_batch("n1", kernel, time.time() - 1.0, 20, 0)
    value = encode(batch)
    return SimpleNamespace(
        topic="ks.launches",
        partition=0,
        offset=offset,
        key=batch.stream_key.encode(),
        value=value,
    )


async def _poll(ingest: WindowIngest, msgs: list[Any]) -> None:
    events = [SimpleNamespace(message=m, key=m.key, value=m.value) for m in msgs]
    await ingest.ingest(events, set())


def test_an_unforeseen_failure_is_dead_lettered_and_the_agent_goes_on() -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, FailingWindower())
    asyncio.run(_poll(ingest, [_msg(3)]))  # does not raise
    [letter] = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert letter.reason_code == "internal_error" and "ZeroDivisionError" in letter.reason
    assert letter.offset == 3 and ctx.counters["deadletter.window.internal_error"] == 1


def test_a_failed_run_goes_batch_by_batch_and_counts_each_launch_once() -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    windower = RunFailsAfterOne()
    ingest = WindowIngest(None, ctx, windower)
    msgs = [_msg(5, "matmul"), _msg(6, "reduction"), _msg(7, "transpose")]
    keys: set[str] = set()
    events = [SimpleNamespace(message=m, key=m.key, value=m.value) for m in msgs]
    asyncio.run(ingest.ingest(events, keys))
    assert topics["deadletter"].sent == []  # none refused, the counted one included
    assert windower.metrics.launches_in == ingest.stats.launches == 3 * 20
    assert ctx.counters["launches.in"] == 3 * 20
    assert keys == {m.key.decode() for m in msgs}


class CloseFails(Windower):
    def poll_key(self, key: str) -> Any:
        raise ZeroDivisionError("a defect in the aggregate maths")


def test_a_close_that_fails_after_a_run_is_dead_lettered_and_the_agent_goes_on() -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, CloseFails())
    asyncio.run(_poll(ingest, [_msg(8), _msg(9, "reduction")]))  # does not raise
    letters = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert [x.offset for x in letters] == [8, 9]  # each stream's batch that closed
    assert {x.reason_code for x in letters} == {"internal_error"}
    assert ingest.stats.launches == 2 * 20  # counted: the windowing itself went through


def test_a_poll_that_fails_to_decode_is_decoded_again_one_message_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, Windower())
    msgs = [_msg(5, "matmul"), _msg(6, "reduction"), _msg(7, "transpose")]
    alone = columnar.decode_launch_columns

    def fail_the_poll(values: Any) -> Any:
        raise ZeroDivisionError("a defect in the poll's checks")

    def fail_on_reduction(data: bytes) -> Any:
        if b'"reduction"' in data:
            raise ZeroDivisionError("a defect in one message's checks")
        return alone(data)

    monkeypatch.setattr(columnar, "decode_launch_columns_many", fail_the_poll)
    monkeypatch.setattr(columnar, "decode_launch_columns", fail_on_reduction)
    asyncio.run(_poll(ingest, msgs))
    [letter] = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert letter.reason_code == "internal_error" and letter.offset == 6
    assert ingest.stats.batches == 2


def _extreme_msgs(changes: dict[str, Any]) -> list[SimpleNamespace]:
    """Three seconds of one stream (two or three windows close), and a normal stream."""
    now = time.time()
    msgs: list[SimpleNamespace] = []
    for node, over in (("n1", changes), ("n2", {})):
        batch = overflowing(good_batch(node, "matmul", now - 3.2, 300, 0), over)
        msgs.append(
            SimpleNamespace(
                topic="ks.launches",
                partition=0,
                offset=len(msgs),
                key=batch.stream_key.encode(),
                value=encode(batch),
            )
        )
    return msgs


@pytest.mark.parametrize("changes", OVERFLOWING.values(), ids=list(OVERFLOWING))
def test_valid_batches_whose_ratios_overflow_still_give_windows_and_findings(
    changes: dict[str, Any],
) -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, Windower(), InlineDetector(ctx))
    asyncio.run(_poll(ingest, _extreme_msgs(changes)))  # does not raise
    assert topics["deadletter"].sent == []
    windows = [decode(v, WindowAggregate) for v in topics["windows"].sent]
    findings = [decode(v, Finding) for v in topics["findings"].sent]
    # the stream with the extreme numbers closes as many windows as the normal one
    assert [w.window_start for w in windows if w.node == "n1"] == [
        w.window_start for w in windows if w.node == "n2"
    ]
    assert sorted(f.node for f in findings) == sorted(w.node for w in windows)
    assert len(windows) >= 4
    for record in (*windows, *findings):  # decode() validated them: finite throughout
        assert all(math.isfinite(v) for v in record.model_dump().values() if isinstance(v, float))


def test_names_at_their_length_limit_give_findings_consumers_accept() -> None:
    # 200 characters each: the finding's id (stream key, config id, window start) is longer
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, Windower(), InlineDetector(ctx))
    batch = good_batch("n" * 200, "matmul", time.time() - 3.2, 300, 0)
    msg = SimpleNamespace(
        topic="ks.launches",
        partition=0,
        offset=0,
        key=batch.stream_key.encode(),
        value=encode(batch),
    )
    asyncio.run(_poll(ingest, [msg]))
    assert topics["deadletter"].sent == [] and len(topics["windows"].sent) >= 2
    findings = [decode(v, Finding) for v in topics["findings"].sent]
    assert len(findings) == len(topics["windows"].sent) and len(findings[0].id) > 200


def test_a_detector_failure_dead_letters_the_window_and_the_stream_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, Windower(), InlineDetector(ctx))

    def fail(self: Detector, agg: WindowAggregate, series: Any) -> Any:
        raise ZeroDivisionError("a defect in the detector")

    # the judgement both classify and classify_wire make
    monkeypatch.setattr(Detector, "_judge", fail)
    asyncio.run(_poll(ingest, _extreme_msgs({})))  # does not raise
    windows = topics["windows"].sent
    assert len(windows) >= 4 and topics["findings"].sent == []
    letters = [decode(v, DeadLetter) for v in topics["deadletter"].sent]
    assert [(d.stage, d.reason_code, d.topic) for d in letters] == [
        ("detector", "internal_error", "ks.windows")
    ] * len(windows)
    assert "ZeroDivisionError" in letters[0].reason
    assert [base64.b64decode(d.value_b64) for d in letters] == windows
    assert ctx.counters["deadletter.detector.internal_error"] == len(windows)


class _Consumer:
    """What a take-over asks of the consumer: each partition's committed offset."""

    async def committed(self, tp: Any) -> int:
        return 7


def _taking_over(monkeypatch: pytest.MonkeyPatch, handed: Any) -> WindowIngest:
    from kernelstream.agents import window_agent

    async def read_states(ingest: WindowIngest, partitions: set[int]) -> dict[int, bytes]:
        if isinstance(handed, Exception):
            raise handed
        return dict(handed)

    monkeypatch.setattr(window_agent, "_read_states", read_states)
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ingest = WindowIngest(None, WorkerContext(Settings(), topics), Windower())
    ingest._consumer = _Consumer()
    return ingest


def test_a_state_record_that_is_no_window_state_loses_only_its_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka import TopicPartition

    from kernelstream.agents.logic.snapshot_codec import pack

    w = Windower()
    w.add(good_batch("n1", "matmul", time.time() - 0.5, 20, 0), time.time())
    good = pack({"partition": 2, "offset": 7, "keys": w.export_keys(["n1:0/matmul"]), "at": 0.0})
    handed = {
        0: pack([1, 2, 3]),  # valid encoding, not a state
        1: pack({"partition": 1, "offset": 9, "keys": {"k": {"max_t": "x"}}, "at": 0.0}),
        2: good,
    }
    ingest = _taking_over(monkeypatch, handed)
    tps = {TopicPartition("ks.launches", p) for p in (0, 1, 2, 3)}
    asyncio.run(ingest._take_over(tps))  # does not raise
    assert {tp.partition: n for tp, n in ingest._next.items()} == {0: 7, 1: 7, 2: 7, 3: 7}
    assert ingest.ctx.counters["window.state_unreadable"] == 1  # partition 1's keys
    assert ingest.windower.seen_through("n1:0/matmul") == 19  # partition 2 restored


def test_a_take_over_the_broker_fails_stops_the_worker_instead_of_skipping_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka import TopicPartition

    from kernelstream.agents.window_agent import _Listener

    ingest = _taking_over(monkeypatch, ConnectionError("the broker went away"))
    crashed: list[BaseException] = []

    async def crash(reason: BaseException) -> None:
        crashed.append(reason)

    monkeypatch.setattr(ingest, "crash", crash)
    asyncio.run(_Listener(ingest).on_partitions_assigned({TopicPartition("ks.launches", 0)}))
    assert [type(c) for c in crashed] == [ConnectionError] and ingest._taken_over.is_set()
