"""Exact window results after crashes and duplicate delivery, on the real embedded broker.

* Ten ``kill -9`` trials: one worker is killed at a random moment while input is being
  produced and processed, and restarted with its state directory, ten times over. The
  windows it publishes, deduplicated by window identity, equal the per-record reference
  computed from the input exactly (no launch lost, none counted twice), and every copy
  of a window published twice (after a crash) is byte-identical to the first.
* Group offsets reset back by N while the worker is stopped: the re-delivered batches
  are dead-lettered as ``duplicate`` and the results are the reference, each window
  published once.
* Both inputs also carry byte-identical copies of some batches (a node resending a
  batch whose acknowledgement was lost): dead-lettered as ``duplicate``, not counted.
* Every record of the launches topic deleted (retention, ``kafka-delete-records``) while
  the worker was down, after it had read them and checkpointed: restarted, it restores
  the open windows, takes the records' offsets as gone, and closes those windows when
  their streams are idle (they were held open forever, the partition "behind" its
  high watermark with nothing left to read).
* A worker paused (SIGSTOP, then SIGCONT: a throttled container, a long GC pause, a
  host swapping) for longer than the idle timeout while its streams' launches keep
  arriving on the broker: no stream counts as idle for the time nobody read it, so
  every window is complete and nothing is late.

Except in the pause, windows close on the watermark only (idle timeout far beyond the
test). The last batch
of every stream is one launch far ahead in event time that closes all earlier windows;
its own window stays open and is left out of the comparison.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from kernelstream.agents.logic.windowing import WindowSpec, aggregate_reference, launch_rows
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches
from kernelstream.schemas import DeadLetter, LaunchBatch, WindowAggregate, decode, encode
from tests.integration.helpers import TopicReader, env_security, produce
from tests.integration.workers import WorkerProc, closing_batches, wait_for

pytestmark = pytest.mark.integration

_PARTITIONS = 2
_CLOSE_AHEAD_S = 5.0
_TRIALS = 10


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"partitions": _PARTITIONS, "idle_timeout_s": 3600.0, "checkpoint_interval_s": 0.5}
    )


def _input(seconds: float, rate: float = 200.0) -> tuple[list[LaunchBatch], list[LaunchBatch]]:
    """2 nodes x 4 kernels in 0.1 s batches, plus one closing batch per stream."""
    t0 = time.time() - 60.0 - seconds
    spec = FleetSpec(nodes=2, launches_per_s_per_kernel=rate, seconds=seconds, t0=t0)
    batches = list(fleet_batches(spec))
    return batches, closing_batches(batches, _CLOSE_AHEAD_S)


def _with_resends(batches: list[LaunchBatch], every: int) -> list[tuple[bytes | None, bytes]]:
    """The wire: every ``every``-th batch is followed by a byte-identical copy."""
    items: list[tuple[bytes | None, bytes]] = []
    for i, b in enumerate(batches):
        item = (b.stream_key.encode(), encode(b))
        items.append(item)
        if i % every == every - 1:
            items.append(item)
    return items


def _want(s: Settings, body: list[LaunchBatch], closing: list[LaunchBatch]) -> list[Any]:
    spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s, s.idle_timeout_s)
    want = aggregate_reference(launch_rows(body + closing), spec)
    open_at_end = {(c.stream_key, spec.window_of(c.t_end[0])) for c in closing}
    return [w for w in want if (w.stream_key, spec.window_of(w.window_start)) not in open_at_end]


def _exact(w: WindowAggregate) -> tuple[Any, ...]:
    return (
        w.stream_key,
        w.window_start,
        w.config_id,
        w.count,
        w.failures,
        w.late_accepted,
        w.seq_min,
        w.seq_max,
    )


async def _collect(s: Settings, n_want: int) -> TopicReader:
    bootstrap = str(s.bootstrap)
    async with TopicReader(bootstrap, s.topic_windows, s.topic_late, s.topic_deadletter) as r:

        def distinct() -> int:
            return len(
                {(w.stream_key, w.window_start, w.config_id) for w in r.records[s.topic_windows]}
            )

        await r.until(lambda: distinct() >= n_want, 90, "all windows")
        await asyncio.sleep(1.0)  # anything published after the last expected window
        await r.poll()
        await r.poll()
    return r


def _check(s: Settings, r: TopicReader, want: list[WindowAggregate]) -> int:
    """The windows equal ``want``; returns how many were published more than once."""
    first: dict[tuple[str, float, str], Any] = {}
    again = 0
    for m in r.raw[s.topic_windows]:
        w = decode(m.value, WindowAggregate)
        ident = (w.stream_key, w.window_start, w.config_id)
        seen = first.setdefault(ident, m)
        if seen is not m:
            again += 1
            assert seen.value == m.value, f"window {ident} published twice with other content"
    got = sorted(
        (decode(m.value, WindowAggregate) for m in first.values()),
        key=lambda w: (w.stream_key, w.window_start, w.config_id),
    )
    assert not r.records[s.topic_late], "no launch may be late: the input is in order"
    assert [_exact(w) for w in got] == [_exact(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.duration_mean_us == pytest.approx(w.duration_mean_us, rel=1e-9)
        assert g.duration_p95_us == pytest.approx(w.duration_p95_us, rel=1e-9)
        assert g.idle_gap_mean_us == pytest.approx(w.idle_gap_mean_us, rel=1e-9, abs=1e-9)
    return again


def _duplicates(s: Settings, r: TopicReader) -> list[DeadLetter]:
    dls = [d for d in r.records[s.topic_deadletter] if isinstance(d, DeadLetter)]
    assert all(d.reason_code == "duplicate" for d in dls), {d.reason_code for d in dls}
    return dls


@contextmanager
def _worker(s: Settings, tmp: Path) -> Iterator[WorkerProc]:
    w = WorkerProc(s, tmp / "worker.log")
    try:
        yield w
    finally:
        w.close()


async def _kill_trials(s: Settings, tmp: Path) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    body, closing = _input(24.0)
    items = _with_resends(body, every=37)
    chunks = [
        items[i * len(items) // _TRIALS : (i + 1) * len(items) // _TRIALS] for i in range(_TRIALS)
    ]
    rng = random.Random(20261122)
    with _worker(s, tmp) as w:
        for chunk in chunks:
            w.start()
            await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
            # Kill at a random moment while this chunk is produced and processed.
            sending = asyncio.create_task(produce(bootstrap, s.topic_launches, chunk))
            await asyncio.sleep(rng.uniform(0.0, 2.5))
            w.kill9()
            await sending
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        await produce(bootstrap, s.topic_launches, _with_resends(closing, every=len(closing) + 1))
        want = _want(s, body, closing)
        r = await _collect(s, len(want))
        assert w.counter("window.state_lost") == 0
        assert w.window("restored_partitions") == _PARTITIONS, "restored from its checkpoint"
    again = _check(s, r, want)
    # Every resent copy was refused (more than those: replays after the crashes).
    assert len(_duplicates(s, r)) >= len(items) - len(body)
    print(f"{_TRIALS} kill -9 trials: {len(want)} windows exact, {again} published again")


async def _offset_reset(s: Settings, tmp: Path, back: int) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    body, closing = _input(8.0)
    half = len(body) // 2
    first, second = _with_resends(body[:half], every=13), _with_resends(body[half:], every=13)
    with _worker(s, tmp) as w:
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        await produce(bootstrap, s.topic_launches, first)
        await wait_for(
            lambda: w.window("batches") + w.window("duplicates") == len(first), 60, "first half"
        )
        w.stop()
        group = f"{s.app_id}.window"
        await _reset_offsets(bootstrap, group, s.topic_launches, back)
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        await produce(bootstrap, s.topic_launches, second + _with_resends(closing, every=99))
        want = _want(s, body, closing)
        r = await _collect(s, len(want))
    assert _check(s, r, want) == 0, "a duplicate delivery published a window again"
    resent = len(first) + len(second) - len(body)
    assert len(_duplicates(s, r)) == resent + back * _PARTITIONS


async def _pause(s: Settings, tmp: Path, pause_s: float) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    # 20,000 launches a second per kernel: what arrives in the pause is megabytes per
    # partition, more than one fetch returns, so the worker reads it over several polls.
    body, closing = _input(6.0, rate=20_000.0)
    half = len(body) // 2
    with _worker(s, tmp) as w:
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        await produce(bootstrap, s.topic_launches, _with_resends(body[:half], every=half + 1))
        await wait_for(lambda: w.window("batches") == half, 60, "first half")
        assert w.proc is not None
        w.proc.send_signal(signal.SIGSTOP)
        try:
            paused_at = time.monotonic()
            await produce(
                bootstrap,
                s.topic_launches,
                _with_resends(body[half:], every=len(body) + 1),
            )
            await asyncio.sleep(pause_s - (time.monotonic() - paused_at))
        finally:
            w.proc.send_signal(signal.SIGCONT)
        await wait_for(lambda: w.window("batches") == len(body), 60, "second half")
        await produce(bootstrap, s.topic_launches, _with_resends(closing, every=len(closing) + 1))
        want = _want(s, body, closing)
        # The closing batches' own windows close too, for idleness: so the worker's
        # reading of its consumer's fetches does say when a partition was read whole.
        r = await _collect(s, len(want) + len(closing))
        assert w.counter("launches.late") == 0, "launches of a paused worker's streams went late"
    spec = WindowSpec(s.window_s)
    last = {(c.stream_key, spec.window_of(c.t_end[0])) for c in closing}

    def closes(m: Any) -> bool:
        w = decode(m.value, WindowAggregate)
        return (w.stream_key, spec.window_of(w.window_start)) in last

    flushed = [decode(m.value, WindowAggregate) for m in r.raw[s.topic_windows] if closes(m)]
    assert sorted((w.stream_key, w.count) for w in flushed) == sorted(
        (c.stream_key, 1) for c in closing
    )
    r.raw[s.topic_windows] = [m for m in r.raw[s.topic_windows] if not closes(m)]
    assert _check(s, r, want) == 0
    assert not r.records[s.topic_deadletter]


async def _end_offsets(bootstrap: str, tps: list[Any]) -> dict[Any, int]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **env_security(), enable_auto_commit=False
    )
    await consumer.start()
    try:
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def _delete_records(bootstrap: str, topic: str) -> int:
    """Delete every record of ``topic`` (what retention does to an old log, or
    ``kafka-delete-records``); how many there were."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

    tps = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
    ends = await _end_offsets(bootstrap, tps)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(end) for tp, end in ends.items()})
    finally:
        await admin.close()
    return sum(ends.values())


async def _until_committed(bootstrap: str, group: str, topic: str) -> None:
    """Until ``group`` has committed the end of every partition of ``topic`` (the window
    agent commits a partition's offset once the checkpoint holding its state is written)."""
    from aiokafka import TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    tps = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
    ends = await _end_offsets(bootstrap, tps)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **env_security())
    await admin.start()
    try:
        deadline = time.monotonic() + 30.0
        while True:
            offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
            if all(offsets.get(tp) is not None and offsets[tp].offset == ends[tp] for tp in tps):
                return
            assert time.monotonic() < deadline, f"{group} committed {offsets}, not {ends}"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def _deleted_while_down(s: Settings, tmp: Path) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    body, _ = _input(4.0)
    read, unread = body[: len(body) // 2], body[len(body) // 2 :]
    with _worker(s, tmp) as w:
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        await produce(bootstrap, s.topic_launches, _with_resends(read, every=len(body)))
        await wait_for(lambda: w.window("batches") == len(read), 60, "the first half")
        await _until_committed(bootstrap, f"{s.app_id}.window", s.topic_launches)
        w.kill9()  # well within the idle timeout: each stream's last windows are open
        # While it is down: the second half arrives, then retention deletes every record.
        await produce(bootstrap, s.topic_launches, _with_resends(unread, every=len(body)))
        assert await _delete_records(bootstrap, s.topic_launches) == len(body)
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == _PARTITIONS, 90, "assignment")
        spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s)
        want = aggregate_reference(launch_rows(read), spec)
        r = await _collect(s, len(want))
        assert w.window("restored_partitions") == _PARTITIONS, "restored from its checkpoint"
        assert w.stats()["open_windows"] == 0
        assert w.counter("window.messages_skipped") == len(unread)
    # The windows of the half it had read, each complete; the other half's launches are gone.
    _check(s, r, want)


async def _reset_offsets(bootstrap: str, group: str, topic: str, back: int) -> None:
    """What ``kafka-consumer-groups --reset-offsets --shift-by -N`` does to a stopped group.

    Done as the group's only member (the embedded broker refuses commits from a
    consumer outside the group, and aiokafka has no admin call to alter offsets).
    """
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        **env_security(),
        group_id=group,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        while len(consumer.assignment()) < _PARTITIONS:
            await consumer.getmany(timeout_ms=200, max_records=1)
        tps = sorted(consumer.assignment())
        committed = {tp: await consumer.committed(tp) for tp in tps}
        assert all(c is not None and c > back for c in committed.values()), committed
        await consumer.commit({tp: c - back for tp, c in committed.items() if c is not None})
    finally:
        await consumer.stop()


def test_kill9_ten_times_final_windows_equal_ground_truth(
    settings: Settings, tmp_path: Path
) -> None:
    asyncio.run(_kill_trials(settings, tmp_path))


def test_a_paused_worker_takes_no_stream_for_idle(settings: Settings, tmp_path: Path) -> None:
    # The default idle timeout; a session timeout the pause stays within (a member that
    # misses it is another drill: the rebalance tests).
    s = settings.model_copy(update={"idle_timeout_s": 3.0, "session_timeout_s": 30.0})
    asyncio.run(_pause(s, tmp_path, pause_s=s.idle_timeout_s + 2.0))


def test_records_deleted_while_down_leave_no_window_open(
    settings: Settings, engine: str, tmp_path: Path
) -> None:
    if engine == "tansu":
        pytest.skip("the embedded broker does not implement DeleteRecords (drops the connection)")
    s = settings.model_copy(update={"idle_timeout_s": 6.0})
    asyncio.run(_deleted_while_down(s, tmp_path))


def test_group_offsets_reset_back_changes_no_result(settings: Settings, tmp_path: Path) -> None:
    asyncio.run(_offset_reset(settings, tmp_path, back=5))
