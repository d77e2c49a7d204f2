"""Event-time tumbling windows: assignment, watermark, lateness, idleness, state."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.logic.errors import LogicSettingsError, SnapshotError
from kernelstream.agents.logic.windowing import (
    Windower,
    WindowSpec,
    aggregate_reference,
    launch_rows,
    make_example_batch,
)
from kernelstream.schemas.records import LaunchBatch, WindowAggregate

batch = make_example_batch
NO_WAIT = WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.0)


def _drain(w: Windower, now: float = 0.0) -> list[WindowAggregate]:
    return w.poll(now) + w.flush_all()


def test_spec_rejects_bad_values() -> None:
    with pytest.raises(LogicSettingsError, match="size_s"):
        WindowSpec(size_s=0.0)
    with pytest.raises(LogicSettingsError, match="allowed_lateness_s"):
        WindowSpec(allowed_lateness_s=-1.0)


def test_boundary_goes_to_next_window() -> None:
    w = Windower(NO_WAIT)
    w.add(batch([0.0, 0.999, 1.0, 1.5, 2.0]), now=0.0)
    aggs = _drain(w)
    assert [(a.window_start, a.window_end, a.count) for a in aggs] == [
        (0.0, 1.0, 2),
        (1.0, 2.0, 2),
        (2.0, 3.0, 1),
    ]
    assert [(a.seq_min, a.seq_max) for a in aggs] == [(0, 1), (2, 3), (4, 4)]


def test_watermark_progression_closes_windows() -> None:
    spec = WindowSpec(size_s=1.0, out_of_orderness_s=0.2, allowed_lateness_s=0.5)
    w = Windower(spec)
    w.add(batch([0.1, 0.9]), now=0.0)
    assert w.poll(0.0) == []
    w.add(batch([1.6], seq_start=2), now=0.0)  # watermark 1.4 < 1.0 + 0.5
    assert w.poll(0.0) == []
    w.add(batch([1.7], seq_start=3), now=0.0)  # watermark 1.5 == end + lateness
    closed = w.poll(0.0)
    assert [(a.window_start, a.count) for a in closed] == [(0.0, 2)]
    assert w.poll(0.0) == []  # exactly once
    assert w.metrics.windows_emitted == 1


def test_out_of_order_within_bound_is_not_late() -> None:
    w = Windower(WindowSpec(out_of_orderness_s=0.3, allowed_lateness_s=0.0))
    assert w.add(batch([0.5, 0.3, 0.4]), now=0.0) is None
    assert w.metrics.late_accepted == 0
    (agg,) = w.flush_all()
    assert agg.count == 3 and agg.late_accepted == 0


def test_late_within_lateness_is_accepted_and_counted() -> None:
    w = Windower(WindowSpec(out_of_orderness_s=0.0, allowed_lateness_s=0.5))
    # 1.2 moves the watermark past 0.9's window end, but not past end + lateness.
    assert w.add(batch([0.2, 1.2, 0.9]), now=0.0) is None
    assert w.metrics.late_accepted == 1
    first, second = w.flush_all()
    assert (first.window_start, first.count, first.late_accepted) == (0.0, 2, 1)
    assert (second.window_start, second.count, second.late_accepted) == (1.0, 1, 0)


def test_too_late_goes_to_late_batch_never_dropped() -> None:
    w = Windower(WindowSpec(out_of_orderness_s=0.0, allowed_lateness_s=0.5))
    w.add(batch([0.2, 2.0]), now=0.0)
    assert [a.window_start for a in w.poll(0.0)] == [0.0]
    late = w.add(batch([0.5, 0.6, 2.1], duration_us=[1.0, 2.0, 3.0], seq_start=2), now=0.0)
    assert late is not None
    assert late.t_end == [0.5, 0.6] and late.duration_us == [1.0, 2.0]
    assert late.seq_start == 2 and late.stream_key == "n1:0/saxpy"
    # Late even by watermark alone, before any poll emitted the window:
    w2 = Windower(WindowSpec(out_of_orderness_s=0.0, allowed_lateness_s=0.5))
    late2 = w2.add(batch([3.0, 0.1]), now=0.0)
    assert late2 is not None and late2.t_end == [0.1] and late2.seq_start == 1
    rest = _drain(w)
    assert sum(a.count for a in rest) == 2  # 2.0 and 2.1
    assert w.metrics.late_dropped_to_topic == 2


def test_conservation_launches_in_equals_counted_plus_late() -> None:
    rng = np.random.default_rng(7)
    w = Windower(WindowSpec(out_of_orderness_s=0.1, allowed_lateness_s=0.2))
    aggs: list[WindowAggregate] = []
    late_n = 0
    for i in range(40):
        t = np.sort(rng.uniform(i * 0.25, i * 0.25 + 0.5, 50)) - rng.exponential(0.2, 50)
        ok = (rng.random(50) > 0.1).astype(int).tolist()
        late = w.add(batch(t.tolist(), ok=ok, seq_start=i * 50), now=float(i))
        late_n += 0 if late is None else len(late.t_end)
        aggs += w.poll(float(i))
    aggs += w.flush_all()
    m = w.metrics
    assert late_n == m.late_dropped_to_topic > 0
    assert m.late_accepted > 0
    assert m.launches_in == 2000 == sum(a.count + a.failures for a in aggs) + late_n
    assert m.windows_emitted == len(aggs)
    assert m.late_accepted == sum(a.late_accepted for a in aggs)


def test_non_contiguous_late_runs_keep_sequence_numbers() -> None:
    w = Windower(WindowSpec(out_of_orderness_s=0.0, allowed_lateness_s=0.0))
    runs = w.add_runs(batch([5.0, 0.1, 5.1, 0.2, 0.3]), now=0.0)
    assert [(r.seq_start, r.t_end) for r in runs] == [(1, [0.1]), (3, [0.2, 0.3])]
    merged = Windower(WindowSpec(out_of_orderness_s=0.0, allowed_lateness_s=0.0)).add(
        batch([5.0, 0.1, 5.1, 0.2, 0.3]), now=0.0
    )
    assert merged is not None and merged.t_end == [0.1, 0.2, 0.3]


def test_idle_flush_after_timeout() -> None:
    w = Windower(WindowSpec(idle_timeout_s=3.0))
    w.add(batch([10.1, 10.2]), now=100.0)
    w.add(batch([10.3], node="n2"), now=102.0)
    assert w.poll(102.9) == []
    flushed = w.poll(103.0)
    assert [(a.node, a.count) for a in flushed] == [("n1", 2)]
    assert [a.node for a in w.flush_idle(105.0)] == ["n2"]
    # The flushed window is closed: a straggler for it goes to the late topic.
    late = w.add(batch([10.9], seq_start=2), now=106.0)
    assert late is not None and late.t_end == [10.9]
    assert w.add(batch([11.0], seq_start=3), now=106.0) is None


def test_config_switch_within_window_gives_two_aggregates() -> None:
    w = Windower(NO_WAIT)
    w.add(batch([0.1, 0.2], duration_us=[10.0, 12.0], config={"block": 128}), now=0.0)
    w.add(batch([0.6, 0.7], duration_us=[5.0, 7.0], config={"block": 256}, seq_start=2), now=0)
    a, b = w.flush_all()
    assert (a.config_id, a.count, a.duration_mean_us) == ("block=128", 2, 11.0)
    assert (b.config_id, b.count, b.duration_mean_us) == ("block=256", 2, 6.0)
    assert b.config == {"block": 256}


def test_aggregate_values_hand_computed() -> None:
    # Two launches of 10 us ending 100 us apart -> gap of 90 us; one failure.
    w = Windower(NO_WAIT)
    w.add(batch([0.5, 0.5001, 0.6], duration_us=[10.0, 10.0, 0.0], ok=[1, 1, 0]), now=0.0)
    (a,) = w.flush_all()
    assert (a.count, a.failures, a.seq_min, a.seq_max) == (2, 1, 0, 2)
    assert a.duration_mean_us == 10.0 and a.duration_std_us == 0.0
    assert a.idle_gap_mean_us == pytest.approx(90.0, rel=1e-6)
    assert a.busy_fraction == pytest.approx(20e-6)
    assert a.achieved_gbs == pytest.approx(8e6 / 10e-6 / 1e9)  # 800 GB/s
    assert a.bw_fraction == pytest.approx(800.0 / 2039.0)
    assert a.arithmetic_intensity == pytest.approx(0.25)


def test_failures_only_window_has_zero_stats() -> None:
    w = Windower(NO_WAIT)
    w.add(batch([0.1, 0.2], duration_us=[0.0, 0.0], ok=[0, 0]), now=0.0)
    (a,) = w.flush_all()
    assert (a.count, a.failures, a.duration_mean_us, a.achieved_gbs) == (0, 2, 0.0, 0.0)


def _random_batches(seed: int) -> list[LaunchBatch]:
    rng = np.random.default_rng(seed)
    out = []
    seq = {("n1", 128): 0, ("n1", 256): 0, ("n2", 128): 0}
    t0 = 1.7e9 + rng.uniform(0, 100)
    for i in range(30):
        node, block = list(seq)[int(rng.integers(0, 3))]
        n = int(rng.integers(1, 200))
        t = t0 + i * 0.3 + np.sort(rng.uniform(0, 0.6, n)) - rng.exponential(0.05, n)
        d = rng.lognormal(3.0, 0.5, n)
        ok = (rng.random(n) > 0.05).astype(int)
        d[ok == 0] = 0.0
        out.append(
            batch(
                t.tolist(),
                d.tolist(),
                ok.tolist(),
                node=node,
                config={"block": block},
                seq_start=seq[(node, block)],
            )
        )
        seq[(node, block)] += n
    return out


def _close(a: WindowAggregate, b: WindowAggregate) -> None:
    da, db = a.model_dump(), b.model_dump()
    assert da.keys() == db.keys()
    for k, va in da.items():
        vb = db[k]
        if isinstance(va, float):
            assert math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-9), (k, va, vb)
        else:
            assert va == vb, (k, va, vb)


def _windows_of(w: Windower, batches: list[LaunchBatch]) -> list[WindowAggregate]:
    """Every window ``batches`` yield, added in order and polled after each, then flushed."""
    got: list[WindowAggregate] = []
    for b in batches:
        w.add(b, now=0.0)
        got += w.poll(0.0)
    return got + w.flush_all()


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_batched_equals_reference(seed: int) -> None:
    spec = WindowSpec(size_s=0.5, out_of_orderness_s=0.05, allowed_lateness_s=0.1)
    batches = _random_batches(seed)
    w = Windower(spec)
    got = _windows_of(w, batches)
    key = lambda a: (a.stream_key, a.window_start, a.config_id)  # noqa: E731
    got.sort(key=key)
    want = aggregate_reference(launch_rows(batches), spec)
    assert len(got) == len(want) > 5
    for g, r in zip(got, want, strict=True):
        _close(g, r)
    assert w.metrics.late_dropped_to_topic == sum(len(b.t_end) for b in batches) - sum(
        a.count + a.failures for a in want
    )


def test_snapshot_restore_mid_stream_gives_identical_output() -> None:
    spec = WindowSpec(size_s=0.5, out_of_orderness_s=0.05, allowed_lateness_s=0.1)
    batches = _random_batches(11)
    straight = Windower(spec)
    resumed = Windower(spec)
    out_a: list[Any] = []
    out_b: list[Any] = []
    for i, b in enumerate(batches):
        out_a.append((straight.add(b, now=float(i)), straight.poll(float(i))))
        if i == 15:
            resumed = Windower.restore(json.loads(json.dumps(resumed.snapshot())))
        out_b.append((resumed.add(b, now=float(i)), resumed.poll(float(i))))
    out_a.append(straight.poll(1e9))
    out_b.append(resumed.poll(1e9))
    assert out_a == out_b
    assert straight.snapshot() == resumed.snapshot()
    assert straight.metrics == resumed.metrics


def test_equal_end_times_break_ties_in_sequence_order() -> None:
    """Idle gaps depend on the order of launches that end together: sequence order."""
    batches = [
        batch([0.30, 0.10, 0.30], duration_us=[5.0, 1.0, 90.0], seq_start=0),
        batch([0.10, 0.30, 0.20, 0.30], duration_us=[7.0, 3.0, 2.0, 40.0], seq_start=3),
    ]
    got = _windows_of(Windower(NO_WAIT), batches)
    want = aggregate_reference(launch_rows(batches), NO_WAIT)
    assert len(got) == len(want) == 1
    _close(got[0], want[0])
    assert got[0].idle_gap_mean_us > 0


def test_version_1_snapshot_with_sequence_columns_restores() -> None:
    """Checkpoints written before 2026-11-22 stored every launch's sequence number."""
    w = Windower(NO_WAIT)
    w.add(batch([0.1, 0.2, 0.4], duration_us=[1.0, 2.0, 3.0], seq_start=10), now=0.0)
    snap = json.loads(json.dumps(w.snapshot()))
    old = json.loads(json.dumps(snap))
    old["version"] = 1
    for window in old["keys"]["n1:0/saxpy"]["windows"]:
        window["seq"] = list(range(10, 10 + len(window["t_end"])))
    restored = Windower.restore(old)
    assert restored.snapshot() == snap
    assert _drain(restored) == _drain(w)


def test_restore_rejects_unknown_version() -> None:
    with pytest.raises(SnapshotError, match="version"):
        Windower.restore({"version": 99})
    with pytest.raises(SnapshotError, match="malformed"):
        Windower.restore({"version": 1, "spec": {}})


def _in_order_batches(seed: int) -> list[LaunchBatch]:
    """Batches each in completion order (the nodes' normal case), several keys interleaved.

    Some batches span window boundaries, some overlap the previous batch of their key by
    less than the out-of-orderness (accepted late), one switches config mid-stream, and a
    few launches fail.
    """
    rng = np.random.default_rng(seed)
    streams = {("n1", "saxpy"): [0.0, 0], ("n1", "matmul"): [0.0, 0], ("n2", "saxpy"): [0.0, 0]}
    t0 = 1.7e9 + rng.uniform(0, 100)
    out = []
    for i in range(60):
        node, kernel = list(streams)[int(rng.integers(0, len(streams)))]
        last, seq = streams[(node, kernel)]
        n = int(rng.integers(1, 300))
        start = max(t0, last + rng.uniform(-0.09, 0.2))  # may start before last (late_ok)
        t = start + np.sort(rng.uniform(0.0, float(rng.choice([0.05, 0.4, 1.7])), n))
        d = rng.lognormal(3.0, 0.5, n)
        ok = (rng.random(n) > 0.03).astype(int)
        d[ok == 0] = 0.0
        block = 256 if (node, kernel) == ("n1", "saxpy") and i > 30 else 128
        out.append(
            batch(
                t.tolist(),
                d.tolist(),
                ok.tolist(),
                node=node,
                kernel=kernel,
                config={"block": block},
                seq_start=int(seq),
            )
        )
        streams[(node, kernel)] = [max(last, float(t[-1])), seq + n]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_in_order_fast_path_equals_reference(seed: int, monkeypatch: Any) -> None:
    """Batched hot path (add_columns, in-order branch) == per-record reference.

    Counts, failures, sequence ranges, late-accepted counts, window bounds and the
    meta fields are compared exactly; float statistics to 1e-12 relative (NumPy sums
    pairwise, the reference left to right: only the last bits may differ).
    """
    from kernelstream.schemas.columnar import LaunchColumns

    spec = WindowSpec(size_s=1.0, out_of_orderness_s=0.05, allowed_lateness_s=0.1)
    batches = _in_order_batches(seed)
    w = Windower(spec)

    def general_path(*a: Any) -> Any:
        raise AssertionError("an in-order batch left the fast path")

    monkeypatch.setattr(w, "_add_unordered", general_path)
    got: list[WindowAggregate] = []
    for b in batches:
        assert w.add_columns(LaunchColumns.from_batch(b), now=0.0) == []
        got += w.poll_key(b.stream_key)
    got += w.flush_all()
    got.sort(key=lambda a: (a.stream_key, a.window_start, a.config_id))
    want = aggregate_reference(launch_rows(batches), spec)
    assert len(got) == len(want) > 20
    assert sum(a.late_accepted for a in want) > 0, "the input must exercise accepted late rows"
    assert sum(a.failures for a in want) > 0
    assert len({a.config_id for a in want}) == 2
    for g, r in zip(got, want, strict=True):
        da, db = g.model_dump(), r.model_dump()
        for k, va in da.items():
            if isinstance(va, float):
                assert math.isclose(va, db[k], rel_tol=1e-12, abs_tol=1e-12), (k, va, db[k])
            else:
                assert va == db[k], (k, va, db[k])
    assert w.metrics.late_dropped_to_topic == 0
    assert w.metrics.launches_in == sum(a.count + a.failures for a in want)


def test_what_the_binary_decoder_knows_changes_no_window() -> None:
    """Columns decoded from the binary wire carry what the decoder found (order, every
    launch ran, the stream key); the windows are those of the same batches as records."""
    from kernelstream.schemas.binary import encode_launch_batch
    from kernelstream.schemas.columnar import LaunchColumns, decode_launch_columns_many

    rng = np.random.default_rng(5)
    batches, seq = [], 0
    for i in range(40):
        n = int(rng.integers(1, 300))
        t = 10.0 + i * 0.3 + np.sort(rng.random(n)) * 0.3
        ok = (rng.random(n) < (1.0 if i % 3 else 0.9)).astype(int).tolist()
        batches.append(batch(t.tolist(), (rng.random(n) * 50).tolist(), ok, seq_start=seq))
        seq += n
    # one header for all: from the second batch on, the poll reads it as a known one
    decoded = decode_launch_columns_many([encode_launch_batch(b) for b in batches])
    assert {c.known_all_ok for c in decoded if isinstance(c, LaunchColumns)} == {True, False}
    by_wire, by_record = Windower(NO_WAIT), Windower(NO_WAIT)
    for b, cols in zip(batches, decoded, strict=True):
        assert isinstance(cols, LaunchColumns)
        by_wire.add_columns(cols, now=0.0)
        by_record.add_columns(LaunchColumns.from_batch(b), now=0.0)
    assert _drain(by_wire) == _drain(by_record)


@pytest.mark.parametrize("size", [1.0, 0.1, 0.3, 0.05, 7.0 / 3.0])
def test_window_cuts_split_end_times_as_their_window_index_does(size: float) -> None:
    """The in-order path's edge search gives, for every split, the windows and slices
    ``floor(t / size)`` gives launch by launch, and declines exactly where a window's
    computed end is not above one of its times (float rounding at an edge)."""
    from kernelstream.agents.logic.windowing import _window_cuts

    rng = np.random.default_rng(round(size * 1000))
    # window edges of present-day times and of small ones, where rounding misplaces some
    edges = np.arange(1_780_000_000 // size, 1_780_000_000 // size + 6) * size
    small = np.arange(40.0, 140.0) * size
    # times on each edge, one and two ulps either side, and between: every rounding case
    near = np.concatenate([np.nextafter(edges, -np.inf), edges, np.nextafter(edges, np.inf)])
    near = np.concatenate([near, np.nextafter(near, -np.inf), np.nextafter(near, np.inf)])
    near_small = np.concatenate([np.nextafter(small, -np.inf), small])
    declined = 0
    for i in range(600):
        pool = (
            np.concatenate([rng.choice(near, 6), rng.uniform(edges[0], edges[-1], 6)])
            if i % 2
            else np.concatenate([rng.choice(near_small, 6), rng.uniform(small[0], small[-1], 6)])
        )
        t = np.sort(rng.choice(pool, int(rng.integers(2, 12))))
        idx = np.floor(t / size).astype(np.int64)
        first, last = int(idx[0]), int(idx[-1])
        if first == last:
            continue
        got = _window_cuts(t, first, last, size)
        if not bool(((idx + 1) * size > t).all()):
            assert got is None
            declined += 1
            continue
        cuts = [0, *(np.flatnonzero(np.diff(idx)) + 1).tolist(), t.size]
        want = [(int(idx[lo]), lo, hi) for lo, hi in itertools.pairwise(cuts)]
        assert got == want, (t.tolist(), size)
    if size != 1.0:
        assert declined, "the input must reach a rounding edge"
