"""Two workers share the launches topic; one joins and then one leaves mid-stream.

On the real embedded broker, with real ``kernelstream worker`` processes (state
handed over in 1 KiB chunks, as a busy partition's megabytes are): worker A
starts alone, B joins after the first third of the input (A hands the state of
its revoked partitions over to B through the window-state topic), A stops after
the second third (B adopts everything). The windows published by the two
workers together must be exactly the windows the per-record reference
(:func:`agents.logic.windowing.aggregate_reference`) computes from the whole
input: none lost, none published twice, every count and sequence range equal.

Windows close on the watermark only (the idle timeout is set far beyond the test,
so a pause during a rebalance flushes nothing early). The last batch of every
stream is one launch far ahead in event time that closes all earlier windows;
its own window stays open and is left out of the comparison on both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kernelstream.agents.logic.windowing import WindowSpec, aggregate_reference, launch_rows
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches
from kernelstream.schemas import LaunchBatch, WindowAggregate, decode, encode
from tests.integration.helpers import TopicReader, produce
from tests.integration.workers import WorkerProc, closing_batches, wait_for

pytestmark = pytest.mark.integration

_PARTITIONS = 4
_CLOSE_AHEAD_S = 5.0


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Handover messages of at most 1 KiB: each partition's state crosses in chunks.
    return settings.model_copy(
        update={
            "partitions": _PARTITIONS,
            "idle_timeout_s": 3600.0,
            "window_state_chunk_bytes": 1024,
        }
    )


def _input(t0: float) -> tuple[list[LaunchBatch], list[LaunchBatch]]:
    """2 nodes x 4 kernels, 9 s of event time in 0.1 s batches, plus one closing batch each."""
    spec = FleetSpec(nodes=2, launches_per_s_per_kernel=400.0, seconds=9.0, max_delay_s=0.1, t0=t0)
    batches = list(fleet_batches(spec))
    return batches, closing_batches(batches, _CLOSE_AHEAD_S)


@contextmanager
def _workers(settings: Settings, tmp: Path) -> Iterator[tuple[WorkerProc, WorkerProc]]:
    a, b = WorkerProc(settings, tmp / "worker-a.log"), WorkerProc(settings, tmp / "worker-b.log")
    try:
        yield a, b
    finally:
        for w in (a, b):
            w.close()


def _items(batches: list[LaunchBatch]) -> list[tuple[bytes | None, bytes]]:
    return [(b.stream_key.encode(), encode(b)) for b in batches]


async def _scenario(s: Settings, tmp: Path) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    body, closing = _input(time.time() - 120.0)
    batches = body + closing
    third = len(body) // 3
    spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s, s.idle_timeout_s)
    want = aggregate_reference(launch_rows(batches), spec)
    open_at_end = {(c.stream_key, spec.window_of(c.t_end[0])) for c in closing}
    want = [w for w in want if (w.stream_key, spec.window_of(w.window_start)) not in open_at_end]

    with _workers(s, tmp) as (a, b):
        a.start()
        await wait_for(lambda: a.window("assigned_partitions") == _PARTITIONS, 90, "A owns all")
        await produce(bootstrap, s.topic_launches, _items(body[:third]))
        await wait_for(lambda: a.window("batches") == third, 60, "A to process the first third")

        b.start()  # joins: A hands over the partitions the group gives B
        await wait_for(lambda: (b.window("assigned_partitions") or 0) > 0, 90, "B to join")
        await wait_for(
            lambda: (
                a.window("assigned_partitions") + b.window("assigned_partitions") == _PARTITIONS
            ),
            90,
            "the group to settle",
        )
        await produce(bootstrap, s.topic_launches, _items(body[third : 2 * third]))
        await wait_for(
            lambda: a.window("batches") + b.window("batches") >= 2 * third,
            60,
            "the second third",
        )
        assert a.window("handovers_out") > 0 and b.window("handovers_in") > 0
        assert a.window("handover_messages_out") > a.window("handovers_out"), "not chunked"

        a.stop()  # leaves: hands everything to B
        await wait_for(lambda: b.window("assigned_partitions") == _PARTITIONS, 90, "B owns all")
        await produce(bootstrap, s.topic_launches, _items(body[2 * third :] + closing))
        async with TopicReader(bootstrap, s.topic_windows, s.topic_late) as r:
            with contextlib.suppress(AssertionError):  # what is missing is reported below
                await r.until(
                    lambda: len(r.records[s.topic_windows]) >= len(want), 60, "all windows"
                )
            await asyncio.sleep(2.0)  # anything published twice would arrive now
            await r.poll()
            await r.poll()
        assert b.window("handovers_in") >= 2, "B adopted state when A left"

    # The embedded broker has no idempotent producer: a produce request retried
    # after a timeout lands twice. Such a copy is the same record bytes with the
    # same producer timestamp (set once, at send); a window a worker emitted twice
    # would carry a new timestamp. Copies are removed by the window's identity
    # (as consumers do, with the deterministic finding id); second emissions fail.
    first: dict[tuple[str, float, str], Any] = {}
    for m, w in zip(r.raw[s.topic_windows], r.records[s.topic_windows], strict=True):
        assert isinstance(w, WindowAggregate), m.value
        ident = (w.stream_key, w.window_start, w.config_id)
        seen = first.setdefault(ident, m)
        assert (seen.value, seen.timestamp) == (m.value, m.timestamp), (
            f"window {ident} emitted twice: offsets {seen.offset} and {m.offset}"
        )
    got = [decode(m.value, WindowAggregate) for m in first.values()]
    missing = sorted({(w.stream_key, w.window_start, w.config_id) for w in want} - set(first))
    assert not missing, f"windows lost: {missing}"
    assert not r.records[s.topic_late], "no launch may be late: the input is in order"
    got.sort(key=lambda w: (w.stream_key, w.window_start, w.config_id))

    def exact(w: WindowAggregate) -> tuple[Any, ...]:
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

    assert [exact(w) for w in got] == [exact(w) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.duration_mean_us == pytest.approx(w.duration_mean_us, rel=1e-9)
        assert g.duration_p95_us == pytest.approx(w.duration_p95_us, rel=1e-9)
        assert g.idle_gap_mean_us == pytest.approx(w.idle_gap_mean_us, rel=1e-9, abs=1e-9)


def test_two_workers_split_partitions_and_rebalance_loses_and_doubles_nothing(
    settings: Settings, tmp_path: Path
) -> None:
    asyncio.run(_scenario(settings, tmp_path))
