"""Replay without a broker: range selection by time, the offline path, deterministic reports."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from kernelstream.agents.logic.windowing import (
    Windower,
    WindowSpec,
    aggregate_reference,
    launch_rows,
    make_example_batch,
)
from kernelstream.app.cli import main
from kernelstream.app.replay.analysis import (
    LaunchFilter,
    OfflineAnalysis,
    RecordedMessage,
    key_matches,
)
from kernelstream.app.replay.command import (
    RangeSpec,
    RecordingSource,
    _line,
    confirmed_broker_offset,
    offset_for_time,
    read_range,
    select_ranges,
)
from kernelstream.schemas import LaunchBatch, encode
from kernelstream.schemas.columnar import LaunchColumns

SPACE = {"block_x": 8, "block_y": 8, "items_per_thread": 1, "tile_k": 8, "use_shared": 0}
T0 = 1_790_000_000.0  # event times near the record timestamps (edge checks use them)


def batches(nodes: int = 2, seconds: int = 12, per_s: int = 4) -> list[LaunchBatch]:
    """A few series of matmul launches, a config change half way, in time order."""
    rng = random.Random(7)
    out = []
    for node in range(nodes):
        seq = 0
        for i in range(seconds * per_s):
            t = T0 + i / per_s
            unroll = 1 if i < seconds * per_s // 2 else 2
            n = 25
            ends = [t + k * 0.2 / n for k in range(n)]
            durs = [100.0 / unroll + rng.random() * 5 for _ in range(n)]
            out.append(
                make_example_batch(
                    ends,
                    durs,
                    node=f"n{node}",
                    kernel="matmul",
                    problem_size=[2048],
                    config={**SPACE, "unroll": unroll},
                    seq_start=seq,
                )
            )
            seq += n
    return out


def messages(bs: list[LaunchBatch], topic: str = "ks.launches") -> list[RecordedMessage]:
    """Batches as recorded messages, series spread over two partitions."""
    offsets = {0: 0, 1: 0}
    out = []
    for b in sorted(bs, key=lambda b: b.t_end[-1]):
        p = int(b.node[1:]) % 2
        ts = round(b.t_end[-1] * 1000) + 50
        out.append(RecordedMessage(topic, p, offsets[p], ts, b.stream_key.encode(), encode(b)))
        offsets[p] += 1
    return out


def write_recording(directory: Path, msgs: list[RecordedMessage]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    by_topic: dict[str, list[bytes]] = {}
    for m in msgs:
        by_topic.setdefault(m.topic, []).append(_line(m))
    for topic, lines in by_topic.items():
        (directory / f"{topic}.jsonl").write_bytes(b"\n".join(lines) + b"\n")


SPEC = WindowSpec(size_s=1.0, out_of_orderness_s=0.2, allowed_lateness_s=0.5)


def test_offline_windows_equal_the_reference() -> None:
    bs = batches()
    analysis = OfflineAnalysis(SPEC)
    for m in messages(bs):
        analysis.add_launch_message(m)
    res = analysis.finish()
    # Exactly what the window agent's calls produce (add_columns, poll_key per batch) ...
    live = Windower(SPEC)
    want = []
    for b in sorted(bs, key=lambda b: (int(b.node[1:]) % 2, b.t_end[-1])):
        live.add_columns(LaunchColumns.from_batch(b), 0.0)
        want += live.poll_key(b.stream_key)
    want += live.flush_all()
    assert res.windows == sorted(want, key=lambda a: (a.stream_key, a.window_start, a.config_id))
    # ... and the per-record reference up to float summation order.
    ref = aggregate_reference(launch_rows(bs), SPEC)
    assert [(w.stream_key, w.window_start, w.config_id, w.count) for w in res.windows] == [
        (w.stream_key, w.window_start, w.config_id, w.count) for w in ref
    ]
    for got, exp in zip(res.windows, ref, strict=True):
        assert got.duration_mean_us == pytest.approx(exp.duration_mean_us, rel=1e-12)
    assert len(res.findings) == len(res.windows)
    assert res.launches == sum(len(b.t_end) for b in bs)


def test_filters() -> None:
    flt = LaunchFilter(node="n1")
    assert key_matches(b"n1:0/matmul", flt) and not key_matches(b"n0:0/matmul", flt)
    assert LaunchFilter(device="A100-SXM4-80GB").keeps("n", 0, "A100-SXM4-80GB", "k")
    assert LaunchFilter(device="n:0").keeps("n", 0, "X", "k")
    assert not LaunchFilter(kernel="a").keeps("n", 0, "X", "b")
    analysis = OfflineAnalysis(SPEC, flt=flt)
    for m in messages(batches()):
        analysis.add_launch_message(m)
    res = analysis.finish()
    assert {w.node for w in res.windows} == {"n1"} and res.skipped_messages > 0


def _selected(msgs: list[RecordedMessage], spec: RangeSpec, tmp_path: Path) -> set[tuple]:
    write_recording(tmp_path, msgs)

    async def go() -> set[tuple]:
        src = RecordingSource(tmp_path)
        got = set()
        for r in await select_ranges(src, ["ks.launches"], spec):
            async for chunk in read_range(src, r, spec):
                got |= {(m.partition, m.offset) for m in chunk}
        return got

    return asyncio.run(go())


@pytest.mark.parametrize("jitter_ms", [0, 300])
def test_time_range_is_exact(tmp_path: Path, jitter_ms: int) -> None:
    rng = random.Random(3)
    msgs = [
        m._replace(timestamp_ms=m.timestamp_ms + rng.randint(-jitter_ms, jitter_ms))
        for m in messages(batches())
    ]
    since, until = round(T0 * 1000) + 3_000, round(T0 * 1000) + 7_500
    spec = RangeSpec(since_ms=since, until_ms=until, slack_ms=1_000)
    want = {(m.partition, m.offset) for m in msgs if since <= m.timestamp_ms < until}
    assert want and _selected(msgs, spec, tmp_path) == want


def test_offset_for_time_binary_search(tmp_path: Path) -> None:
    msgs = messages(batches(nodes=1))
    write_recording(tmp_path, msgs)
    src = RecordingSource(tmp_path)
    for probe in (msgs[0], msgs[17], msgs[-1]):
        off = asyncio.run(offset_for_time(src, "ks.launches", 0, probe.timestamp_ms, 0, len(msgs)))
        assert off == probe.offset
    after = asyncio.run(offset_for_time(src, "ks.launches", 0, 10**15, 0, len(msgs)))
    assert after == len(msgs)


class _AnsweringSource(RecordingSource):
    """A recording whose "broker" answers every time lookup with one fixed offset."""

    def __init__(self, directory: Path, answer: int | None) -> None:
        super().__init__(directory)
        self.answer = answer

    async def broker_offset_for_time(self, topic: str, partition: int, t_ms: int) -> int | None:
        return self.answer


@pytest.mark.parametrize("answer", [None, 0, 5, 16, 18, 10**6])  # all wrong but None
def test_only_a_confirmed_broker_offset_is_used(tmp_path: Path, answer: int | None) -> None:
    msgs = messages(batches(nodes=1))
    write_recording(tmp_path, msgs)
    src = _AnsweringSource(tmp_path, answer)
    t = msgs[17].timestamp_ms
    assert msgs[16].timestamp_ms < t
    confirmed = asyncio.run(confirmed_broker_offset(src, "ks.launches", 0, t, 0, len(msgs)))
    assert confirmed is None
    spec = RangeSpec(since_ms=t, slack_ms=0)
    (r,) = asyncio.run(select_ranges(src, ["ks.launches"], spec))
    assert (r.start, r.start_by) == (17, "search")
    src.answer = 17
    (r,) = asyncio.run(select_ranges(src, ["ks.launches"], spec))
    assert (r.start, r.start_by) == (17, "broker")


def test_offset_range(tmp_path: Path) -> None:
    msgs = messages(batches())
    spec = RangeSpec(start_offset=5, end_offset=20)
    want = {(m.partition, m.offset) for m in msgs if 5 <= m.offset < 20}
    assert _selected(msgs, spec, tmp_path) == want


def test_report_is_deterministic_and_self_contained(tmp_path: Path) -> None:
    write_recording(tmp_path / "rec", messages(batches()))
    outs = []
    for i in range(2):
        out = tmp_path / f"report{i}"
        result = CliRunner().invoke(
            main,
            ["replay", "--recording", str(tmp_path / "rec"), "--report", str(out)],
            env={"KERNELSTREAM_TUNING_SPACES_DIR": str(tmp_path / "none")},
        )
        assert result.exit_code == 0, result.output
        outs.append(out)
    for name in ("summary.json", "windows.jsonl", "findings.jsonl", "recommendations.jsonl"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    page = (outs[0] / "index.html").read_text()
    assert page.count("data:image/png;base64,") >= 3  # share, roofline, timeline
    assert "http://" not in page and "https://" not in page  # opens offline
    assert (outs[0] / "plots" / "gpu_share.png").stat().st_size > 1000


def test_replay_needs_one_output() -> None:
    result = CliRunner().invoke(main, ["replay", "--recording", "."])
    assert result.exit_code != 0 and "exactly one" in result.output


def test_resent_batches_count_once() -> None:
    bs = batches(nodes=1, seconds=4)
    msgs = messages(bs)
    resent = [*msgs[:5], msgs[2], msgs[3], *msgs[5:]]  # a node resending two batches
    resent = [m._replace(offset=i) for i, m in enumerate(resent)]
    once, twice = OfflineAnalysis(SPEC), OfflineAnalysis(SPEC)
    for m in msgs:
        once.add_launch_message(m)
    for m in resent:
        twice.add_launch_message(m)
    a, b = once.finish(), twice.finish()
    assert a.windows == b.windows and b.rejected["duplicate"] == 2
    assert b.duplicate_launches == 2 * len(bs[0].t_end)


def test_republish_filter_reads_binary_launch_batches_too() -> None:
    from kernelstream.agents.logic.windowing import make_example_batch
    from kernelstream.app.replay.command import record_fields
    from kernelstream.schemas import encode
    from kernelstream.schemas.binary import encode_launch_batch

    batch = make_example_batch([1.5, 2.5], node="n7", kernel="gemm")
    for value in (encode(batch), encode_launch_batch(batch)):
        d = record_fields(value)
        assert (d["node"], d["device_index"], d["device_model"], d["kernel"]) == (
            "n7",
            0,
            batch.device_model,
            "gemm",
        )


def _mixed_messages(seed: int, wire: str) -> list[RecordedMessage]:
    """One partition of several streams, mostly in line, with resent copies, overlaps,
    gaps, launches out of order and late, failures, and messages the edge refuses (a
    tombstone, bytes that are no batch, a key that is not the batch's)."""
    from kernelstream.schemas.binary import encode_launch_batch

    rng = random.Random(seed)
    seq = dict.fromkeys(range(5), 0)
    clock = dict.fromkeys(range(5), T0)
    out: list[RecordedMessage] = []
    for offset in range(300):
        i = rng.randrange(5)
        roll = rng.random()
        ts = round(max(clock.values()) * 1000) + 50
        if roll < 0.02:
            out.append(RecordedMessage("ks.launches", 0, offset, ts, b"n0:0/matmul", None))
            continue
        if roll < 0.04:
            out.append(RecordedMessage("ks.launches", 0, offset, ts, b"n0:0/matmul", b"KSLB!"))
            continue
        if roll < 0.08 and out and out[-1].value:
            out.append(out[rng.randrange(len(out))]._replace(offset=offset))  # resent
            continue
        n = rng.choice([1, 3, 25, 182])
        t = (clock[i] + np.cumsum([rng.expovariate(n / 0.4) for _ in range(n)])).tolist()
        if roll < 0.12:
            t = sorted(t, key=lambda _: rng.random())
        elif roll < 0.16:
            t = [x - rng.uniform(0.5, 2.0) for x in t]
        start = seq[i] + (rng.choice([-2, 5]) if roll > 0.97 else 0)
        b = make_example_batch(
            t,
            [rng.uniform(5.0, 500.0) for _ in range(n)],
            [0 if rng.random() < 0.03 else 1 for _ in range(n)],
            node=f"n{i}",
            kernel="matmul",
            problem_size=[2048],
            config={**SPACE, "unroll": 1 + i % 2},
            seq_start=max(0, start),
        )
        key = b"n9:0/matmul" if 0.16 <= roll < 0.18 else b.stream_key.encode()
        value = encode_launch_batch(b) if wire == "binary" else encode(b)
        out.append(RecordedMessage("ks.launches", 0, offset, ts, key, value))
        seq[i] = max(seq[i], max(0, start) + n)
        clock[i] = max(clock[i], max(t))
    return out


@pytest.mark.parametrize("wire", ["json", "binary"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chunks_window_as_the_window_agent_and_as_batch_by_batch(seed: int, wire: str) -> None:
    """Replay feeds a partition a chunk at a time on the window agent's path (runs of
    in-line batches); whatever the chunking, every result equals message by message's,
    and the windows equal a windower fed batch by batch (sequence rules, add_columns,
    poll_key) with the same messages."""
    from kernelstream.agents.context import LaunchLimits, launch_batch_problem
    from kernelstream.agents.logic.sequencing import SeqLimits, judge_sequence
    from kernelstream.schemas.columnar import decode_launch_columns

    msgs = _mixed_messages(seed, wire)
    results = []
    for size in (1, 7, 128, len(msgs)):
        analysis = OfflineAnalysis(SPEC)
        for at in range(0, len(msgs), size):
            analysis.add_launch_messages(msgs[at : at + size])
        results.append(analysis.finish())
    first = results[0]
    assert first.rejected["duplicate"] > 0 and first.late_launches > 0
    assert {"invalid_json", "bad_key"} <= set(first.rejected)
    for res in results[1:]:
        assert res.windows == first.windows
        assert res.findings == first.findings
        assert res.rejected == first.rejected
        assert (res.launches, res.launch_messages, res.late_launches) == (
            first.launches,
            first.launch_messages,
            first.late_launches,
        )
        assert res.duplicate_launches == first.duplicate_launches
    # the reference: the edge checks and the sequence rules, then batch by batch
    ref = Windower(SPEC)
    want = []
    for m in msgs:
        if m.value is None or m.key is None:
            continue
        try:
            cols = decode_launch_columns(m.value)
        except Exception:
            continue
        now = m.timestamp_ms / 1000.0
        limits = LaunchLimits()
        span = cols.t_range()
        back = cols.max_backstep()
        if launch_batch_problem(
            cols.meta, m.key.decode(), now, limits, None, span, backstep_s=back
        ):
            continue
        verdict = judge_sequence(ref, cols, now, SeqLimits())
        if verdict.action == "count":
            ref.add_columns(verdict.cols, now)
            want += ref.poll_key(cols.stream_key)
    want += ref.flush_all()
    assert first.windows == sorted(want, key=lambda a: (a.stream_key, a.window_start, a.config_id))


class _RunFails(Windower):
    """Every run's windowing fails before it counts anything (a defect of that path)."""

    def add_in_order(self, run: Any, now: float) -> Any:
        raise ZeroDivisionError("a defect in the run's window maths")


class _StreamFails(_RunFails):
    """And every batch of stream n1 fails alone too."""

    def add_columns(self, cols: LaunchColumns, now: float) -> Any:
        if cols.meta.node == "n1":
            raise ZeroDivisionError("a defect in the window maths")
        return super().add_columns(cols, now)


def _replayed(msgs: list[RecordedMessage], windower: Windower | None = None) -> Any:
    analysis = OfflineAnalysis(SPEC)
    if windower is not None:
        analysis.windower = windower
    for at in range(0, len(msgs), 16):
        analysis.add_launch_messages(msgs[at : at + 16])
    return analysis.finish()


def test_a_failing_run_goes_batch_by_batch_with_the_same_results() -> None:
    msgs = messages(batches())
    clean, failed = _replayed(msgs), _replayed(msgs, _RunFails(SPEC))
    assert failed.windows == clean.windows and failed.findings == clean.findings
    assert (failed.launches, failed.launch_messages) == (clean.launches, clean.launch_messages)
    assert not failed.rejected


def test_a_batch_the_windowing_fails_on_is_counted_and_the_replay_goes_on() -> None:
    msgs = messages(batches())
    clean, failed = _replayed(msgs), _replayed(msgs, _StreamFails(SPEC))
    n1 = [m for m in msgs if m.key and m.key.startswith(b"n1:")]
    assert failed.rejected == {"internal_error": len(n1)}
    assert failed.windows == [w for w in clean.windows if w.node != "n1"]
    assert failed.launch_messages == clean.launch_messages - len(n1)


def test_a_message_the_decoder_fails_on_is_counted_and_the_replay_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import kernelstream.app.replay.analysis as analysis_module

    msgs = messages(batches())
    clean = _replayed(msgs)
    poison = msgs[5].value
    real = analysis_module.decode_launch_columns_many

    def failing(values: list[bytes]) -> Any:
        if poison in values:
            raise ZeroDivisionError("a defect in the decoder")
        return real(values)

    monkeypatch.setattr(analysis_module, "decode_launch_columns_many", failing)
    failed = _replayed(msgs)
    assert failed.rejected == {"internal_error": 1}
    assert failed.launch_messages == clean.launch_messages - 1


def test_a_window_the_detector_fails_on_keeps_no_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelstream.agents.logic.detection import Detector

    msgs = messages(batches())
    clean = _replayed(msgs)
    victim = clean.windows[3]
    real = Detector.classify

    def classify(self: Detector, agg: Any) -> Any:
        if agg == victim:
            raise ZeroDivisionError("a defect in the detector")
        return real(self, agg)

    monkeypatch.setattr(Detector, "classify", classify)
    failed = _replayed(msgs)
    assert failed.rejected == {"detector.internal_error": 1}
    assert failed.windows == clean.windows
    assert len(failed.findings) == len(clean.findings) - 1
