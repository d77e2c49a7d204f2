"""InOrderRun / Windower.add_in_order: the same windows and state as batch by batch.

The window agent windows the batches that continue their streams exactly a run at a
time; every other batch goes the general way (sequence verdict, add_columns). Both
drivers here read the same decoded batches; everything they produce must be equal:
every window (all fields, in order per stream), too-late launches, the verdicts, the
windower's metrics and its snapshot.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.logic.sequencing import SeqLimits, judge_sequence
from kernelstream.agents.logic.windowing import (
    InOrderRun,
    Windower,
    WindowSpec,
    make_example_batch,
)
from kernelstream.schemas import encode
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.columnar import LaunchColumns, decode_launch_columns_many

SPEC = WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05, idle_timeout_s=3)
NOW = 1_000.0


def _fleet(seed: int, wire: str) -> list[LaunchColumns]:
    """Decoded batches of several streams, interleaved; mostly in line, with resent
    copies, overlaps, gaps, launches out of order, late ones and failures mixed in."""
    rng = random.Random(seed)
    streams = [(f"n{i}", {"block": 64 * (1 + i % 3)}) for i in range(7)]
    seq = dict.fromkeys(range(len(streams)), 0)
    clock = dict.fromkeys(range(len(streams)), 100.0)
    sent: list[Any] = []
    for _ in range(400):
        i = rng.randrange(len(streams))
        node, config = streams[i]
        n = rng.choice([1, 2, 3, 50, 182, 700])
        gaps = [rng.expovariate(n / rng.choice([0.05, 0.3, 1.5])) for _ in range(n)]
        t = (clock[i] + np.cumsum(gaps)).tolist()
        roll = rng.random()
        if roll < 0.05 and sent:
            sent.append(rng.choice(sent))  # a resent copy (same or another stream)
            continue
        if roll < 0.10:
            t = sorted(t, key=lambda _: rng.random())  # out of completion order
        elif roll < 0.14:
            t = [x - rng.uniform(0.5, 3.0) for x in t]  # late: before what was counted
        ok = [0 if rng.random() < 0.03 else 1 for _ in range(n)]
        start = seq[i] + (rng.choice([-5, 7]) if roll > 0.97 else 0)  # overlap or gap
        batch = make_example_batch(
            t,
            [rng.uniform(5.0, 500.0) for _ in range(n)],
            ok,
            node=node,
            config=config,
            seq_start=max(0, start),
        )
        sent.append(batch)
        seq[i] = max(seq[i], max(0, start) + n)
        clock[i] = max(clock[i], max(t))
    values = [encode_launch_batch(b) if wire == "binary" else encode(b) for b in sent]
    out = decode_launch_columns_many(values)
    assert all(isinstance(c, LaunchColumns) for c in out)
    return out  # type: ignore[return-value]


def _general(w: Windower, cols: LaunchColumns, out: dict[str, Any]) -> None:
    verdict = judge_sequence(w, cols, NOW, SeqLimits())
    out["verdicts"].append((verdict.action, verdict.skipped))
    if verdict.action != "count":
        return
    for late in w.add_columns(verdict.cols, NOW):
        out["late"].append(encode(late))
    out["windows"] += w.poll_key(verdict.cols.stream_key)


def _one_by_one(batches: list[LaunchColumns]) -> dict[str, Any]:
    w = Windower(SPEC)
    out: dict[str, Any] = {"windows": [], "late": [], "verdicts": []}
    for cols in batches:
        _general(w, cols, out)
    return _result(w, out)


def _in_runs(batches: list[LaunchColumns], poll: int) -> tuple[dict[str, Any], int]:
    w = Windower(SPEC)
    out: dict[str, Any] = {"windows": [], "late": [], "verdicts": []}
    taken = 0

    def flush(run: InOrderRun) -> None:
        n = len(run)
        out["verdicts"] += [("count", 0)] * n
        keys, late = run.flush(NOW)
        out["late"] += [encode(x) for x in late]
        for key in keys:
            out["windows"] += w.poll_key(key)

    for at in range(0, len(batches), poll):
        run = InOrderRun(w)
        for cols in batches[at : at + poll]:
            if run.take(cols):
                taken += 1
                continue
            flush(run)
            _general(w, cols, out)
        flush(run)
    return _result(w, out), taken


def _result(w: Windower, out: dict[str, Any]) -> dict[str, Any]:
    out["windows"] += w.flush_all()
    by_key: dict[str, list[bytes]] = {}
    for agg in out["windows"]:
        by_key.setdefault(agg.stream_key, []).append(encode(agg))
    return {
        "windows": by_key,
        "late": sorted(out["late"]),
        "verdicts": out["verdicts"],
        "metrics": w.metrics,
    }


@pytest.mark.parametrize("wire", ["binary", "json"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("poll", [1, 7, 128])
def test_runs_give_what_batch_by_batch_gives(seed: int, wire: str, poll: int) -> None:
    batches = _fleet(seed, wire)
    want = _one_by_one(batches)
    got, taken = _in_runs(batches, poll)
    assert got == want
    # most batches went through the runs, and the general way was exercised too
    assert len(batches) // 2 < taken < len(batches)


def test_a_run_leaves_the_state_batch_by_batch_leaves() -> None:
    batches = _fleet(11, "binary")
    a, b = Windower(SPEC), Windower(SPEC)
    run = InOrderRun(b)
    for cols in batches:
        verdict = judge_sequence(a, cols, NOW, SeqLimits())
        if verdict.action == "count":
            a.add_columns(verdict.cols, NOW)
        if not run.take(cols):
            run.flush(NOW)
            verdict = judge_sequence(b, cols, NOW, SeqLimits())
            if verdict.action == "count":
                b.add_columns(verdict.cols, NOW)
    run.flush(NOW)
    assert a.snapshot() == b.snapshot()
    assert a.metrics == b.metrics


def test_take_refuses_what_is_not_next_in_line() -> None:
    w = Windower(SPEC)
    first = _decoded(make_example_batch([10.0, 10.5], seq_start=0))
    run = InOrderRun(w)
    assert run.take(first)
    # judged against the batches taken before it, not only the windower
    assert not run.take(_decoded(make_example_batch([10.6], seq_start=0)))  # a copy
    assert not run.take(_decoded(make_example_batch([10.6], seq_start=5)))  # a gap
    assert not run.take(_decoded(make_example_batch([10.4], seq_start=2)))  # before 10.5
    assert not run.take(_decoded(make_example_batch([10.9, 10.7], seq_start=2)))  # unordered
    assert run.take(_decoded(make_example_batch([10.5, 11.2], seq_start=2)))
    keys, late = run.flush(NOW)
    assert keys == ["n1:0/saxpy"] and late == [] and len(run) == 0
    assert w.seen_through("n1:0/saxpy") == 3 and w.newest_event_time("n1:0/saxpy") == 11.2
    # a window already emitted (an idle flush) takes nothing more
    w.flush_all()
    assert not InOrderRun(w).take(_decoded(make_example_batch([11.3], seq_start=4)))
    assert InOrderRun(w).take(_decoded(make_example_batch([12.0], seq_start=4)))


def test_a_launch_on_a_rounded_window_edge_goes_launch_by_launch() -> None:
    # A time k * size whose quotient t / size rounds below k: floor puts it in window
    # k - 1, whose end computed as k * size is the time itself, not above it.
    size = 0.1
    edge = next(
        t
        for k in range(1, 10_000)
        for t in [k * size]
        if math.floor(t / size) < k and not t < (math.floor(t / size) + 1) * size
    )
    spec = WindowSpec(size_s=size, out_of_orderness_s=0.0, allowed_lateness_s=0.0)
    batch = _decoded(make_example_batch([edge - size / 2, edge], seq_start=0))
    a, b = Windower(spec), Windower(spec)
    want = a.add_columns(batch, NOW)
    run = InOrderRun(b)
    assert run.take(batch)
    _, late = run.flush(NOW)
    assert [encode(x) for x in late] == [encode(x) for x in want]
    assert a.snapshot() == b.snapshot()


def _decoded(batch: Any) -> LaunchColumns:
    (cols,) = decode_launch_columns_many([encode_launch_batch(batch)])
    assert isinstance(cols, LaunchColumns)
    return cols
