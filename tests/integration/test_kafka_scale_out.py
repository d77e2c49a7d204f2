"""Scale-out on Apache Kafka: three workers in one group over a 12-partition ``ks.launches``.

On the 3-broker cluster: worker A works alone through the first third of the
input, B and C join (the group moves partitions to them, A hands their window
state over), the three share the second third, C leaves (its partitions go back
to A and B with their state) and the last third follows. The windows of all
three together must be exactly the per-record reference's
(:func:`agents.logic.windowing.aggregate_reference`): none lost, none doubled.

The workers' CPU time (user + system, from /proc) while they process the first
third (one worker) and the second (three) gives the CPU cost per launch, printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from kernelstream.agents.logic.windowing import WindowSpec, aggregate_reference, launch_rows
from kernelstream.app.kafka.apache import KafkaCluster
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches
from kernelstream.schemas import LaunchBatch, WindowAggregate, decode, encode
from tests.integration.conftest import make_settings
from tests.integration.helpers import TopicReader, produce
from tests.integration.workers import WorkerProc, closing_batches, wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 12
_CLOSE_AHEAD_S = 5.0
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpu(workers: list[WorkerProc]) -> float:
    return sum(_cpu_s(w.proc.pid) for w in workers if w.proc is not None)


def _input(t0: float) -> tuple[list[LaunchBatch], list[LaunchBatch]]:
    """4 nodes x 4 kernels (16 streams over 12 partitions), 9 s of 0.1 s batches."""
    spec = FleetSpec(nodes=4, launches_per_s_per_kernel=2000.0, seconds=9.0, max_delay_s=0.1, t0=t0)
    batches = list(fleet_batches(spec))
    return batches, closing_batches(batches, _CLOSE_AHEAD_S)


def _items(batches: list[LaunchBatch]) -> list[tuple[bytes | None, bytes]]:
    return [(b.stream_key.encode(), encode(b)) for b in batches]


def _launches(batches: list[LaunchBatch]) -> int:
    return sum(len(b.t_end) for b in batches)


@contextmanager
def _workers(s: Settings, tmp: Path) -> Iterator[list[WorkerProc]]:
    ws = [WorkerProc(s, tmp / f"worker-{n}.log") for n in "abc"]
    try:
        yield ws
    finally:
        for w in ws:
            w.close()


def _assigned(ws: list[WorkerProc]) -> list[int]:
    return [int(w.window("assigned_partitions") or 0) for w in ws]


def _processed(ws: list[WorkerProc]) -> int:
    return sum(int(w.window("batches") or 0) for w in ws)


async def _process(ws: list[WorkerProc], s: Settings, part: list[LaunchBatch], upto: int) -> float:
    """Produce ``part``, wait until the workers processed ``upto`` batches; their CPU s."""
    before = _cpu(ws)
    await produce(str(s.bootstrap), s.topic_launches, _items(part))
    await wait_for(lambda: _processed(ws) >= upto, 120, f"{upto} batches processed")
    return _cpu(ws) - before


async def _scenario(s: Settings, tmp: Path) -> None:
    await ensure_topics(s, str(s.bootstrap))
    body, closing = _input(time.time() - 120.0)
    third = len(body) // 3
    spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s, s.idle_timeout_s)
    want = aggregate_reference(launch_rows(body + closing), spec)
    open_at_end = {(c.stream_key, spec.window_of(c.t_end[0])) for c in closing}
    want = [w for w in want if (w.stream_key, spec.window_of(w.window_start)) not in open_at_end]

    with _workers(s, tmp) as ws:
        a, b, c = ws
        a.start()
        await wait_for(lambda: _assigned([a]) == [PARTITIONS], 90, "A owns all")
        cpu1 = await _process([a], s, body[:third], third)

        b.start()
        c.start()
        await wait_for(
            lambda: min(_assigned(ws)) > 0 and sum(_assigned(ws)) == PARTITIONS,
            90,
            "A, B and C to share the partitions",
        )
        spread = _assigned(ws)
        cpu3 = await _process(ws, s, body[third : 2 * third], 2 * third)
        assert b.window("handovers_in") + c.window("handovers_in") > 0

        c.stop()  # leaves: its partitions and their state go to A and B
        await wait_for(
            lambda: sum(_assigned([a, b])) == PARTITIONS,
            90,
            "A and B to own everything",
        )
        await produce(str(s.bootstrap), s.topic_launches, _items(body[2 * third :] + closing))
        async with TopicReader(str(s.bootstrap), s.topic_windows, s.topic_late) as r:
            with contextlib.suppress(AssertionError):  # what is missing is reported below
                await r.until(lambda: len(r.records[s.topic_windows]) >= len(want), 90, "windows")
            await asyncio.sleep(2.0)  # anything published twice would arrive now
            await r.poll()
            await r.poll()

    first: dict[tuple[str, float, str], bytes] = {}
    for m in r.raw[s.topic_windows]:
        w = decode(m.value, WindowAggregate)
        ident = (w.stream_key, w.window_start, w.config_id)
        assert first.setdefault(ident, m.value) == m.value, f"window {ident} differs"
    assert not r.records[s.topic_late], "no launch may be late: the input is in order"

    def exact(w: WindowAggregate) -> tuple[object, ...]:
        return (
            w.stream_key,
            w.window_start,
            w.config_id,
            w.count,
            w.failures,
            w.seq_min,
            w.seq_max,
        )

    got = sorted((decode(v, WindowAggregate) for v in first.values()), key=exact)
    assert [exact(w) for w in got] == sorted(exact(w) for w in want)
    n1, n3 = _launches(body[:third]), _launches(body[third : 2 * third])
    print(
        f"scale-out over {PARTITIONS} partitions: partitions per worker {spread}; "
        f"{len(want)} windows exact after a join of two and a leave; worker CPU per launch "
        f"{cpu1 / n1 * 1e9:.0f} ns with 1 worker ({n1} launches), "
        f"{cpu3 / n3 * 1e9:.0f} ns with 3 workers ({n3} launches)"
    )


def test_three_workers_share_twelve_partitions(kafka3: KafkaCluster, tmp_path: Path) -> None:
    s = make_settings(kafka3.bootstrap, tmp_path, PARTITIONS).model_copy(
        update={"idle_timeout_s": 3600.0}
    )
    asyncio.run(_scenario(s, tmp_path))
