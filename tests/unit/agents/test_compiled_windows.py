"""The compiled window engine (agents.logic.compiled_windows, native/src/engine.rs) gives
the window agent exactly what its Python path gives: the same windows, byte for byte,
the same late launches, dead letters and counts, and the same state to checkpoint, on
the same messages, whatever mix of steady and hostile input they are."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kernelstream.agents.context import WorkerContext
from kernelstream.agents.detector_agent import InlineDetector
from kernelstream.agents.logic import compiled_windows
from kernelstream.agents.logic.compiled_windows import HELD_BACK, TAKE_OVER, CompiledWindows
from kernelstream.agents.logic.snapshot_codec import pack
from kernelstream.agents.logic.windowing import Windower, make_example_batch
from kernelstream.agents.window_agent import WindowIngest, window_spec
from kernelstream.app.settings import Settings
from kernelstream.kernels import get_workload
from kernelstream.schemas import DeadLetter, Finding, LaunchBatch, decode, encode, native
from kernelstream.schemas.binary import encode_launch_batch

pytestmark = pytest.mark.skipif(native.core is None, reason=native.describe())

_KERNEL, _SIZE = "matmul", (2048,)


class _Topic:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None) -> None:
        self.sent.append(value)


def _configs() -> list[tuple[dict[str, Any], str]]:
    space = get_workload(_KERNEL, _SIZE).space
    configs = [dict(space.default), *[dict(c) for c in space.neighbors(space.default)[:2]]]
    return [(c, space.config_id(c)) for c in configs]


def _batch(
    node: str, t: list[float], seq: int, config: tuple[dict[str, Any], str], **kw: Any
) -> LaunchBatch:
    rng = random.Random(seq * 7919 + len(t))
    return make_example_batch(
        t,
        [rng.uniform(5.0, 500.0) for _ in t],
        kw.pop("ok", [1] * len(t)),
        node=node,
        kernel=_KERNEL,
        problem_size=list(_SIZE),
        config=config[0],
        config_id=config[1],
        seq_start=seq,
        **kw,
    )


def _messages(seed: int) -> list[SimpleNamespace]:
    """Several streams' messages, interleaved, mostly the next binary batch of their
    stream; mixed in: JSON batches, resent copies, overlaps and gaps, launches out of
    completion order, too late, on window edges, failures, configuration changes, device
    samples, host telemetry, a tombstone, bytes that are no batch and a value that is not
    a bytes object."""
    rng = random.Random(seed)
    configs = _configs()
    nodes = [f"n{i}" for i in range(5)]
    base = math.floor(time.time()) - 120.0
    seq = dict.fromkeys(nodes, 0)
    clock = dict.fromkeys(nodes, base)
    config = dict.fromkeys(nodes, configs[0])
    out: list[tuple[bytes | None, bytes | None]] = []
    sent: list[tuple[bytes | None, bytes | None]] = []
    for _ in range(500):
        node = rng.choice(nodes)
        n = rng.choice([1, 2, 40, 182, 700])
        gaps = [rng.expovariate(n / rng.choice([0.05, 0.3, 1.5])) for _ in range(n)]
        t = (clock[node] + np.cumsum(gaps)).tolist()
        roll = rng.random()
        kw: dict[str, Any] = {}
        if roll < 0.03 and sent:
            out.append(rng.choice(sent))  # a resent copy
            continue
        if roll < 0.04:
            out.append(rng.choice([(None, node.encode()), (b"KSLB\x01garbage", node.encode())]))
            continue
        if roll < 0.07:
            t = sorted(t, key=lambda _: rng.random())  # out of completion order
        elif roll < 0.10:
            t = [x - rng.uniform(0.5, 3.0) for x in t]  # late
        elif roll < 0.13:
            t[-1] = float(math.floor(t[-1]))  # a launch on a window edge
            t = sorted(t)
        elif roll < 0.16:
            config[node] = rng.choice(configs)  # the tuner moved it
        elif roll < 0.18:
            kw["samples"] = [{"t": t[0], "sm_clock_mhz": 1410.0, "mem_used_bytes": 1e9}]
        elif roll < 0.21:  # host telemetry: the host side's findings of its windows
            kw["schema"] = "ks.launch_batch/2"
            kw["host_gap_us"] = [rng.uniform(0.0, 3000.0) for _ in range(n)]
            kw["host_waited"] = [rng.choice([0, 1]) for _ in range(n)]
        ok = [0 if rng.random() < 0.03 else 1 for _ in range(n)]
        start = seq[node] + (rng.choice([-5, 7]) if roll > 0.97 else 0)
        batch = _batch(node, t, max(0, start), config[node], ok=ok, **kw)
        value: Any = encode(batch) if rng.random() < 0.08 else encode_launch_batch(batch)
        if rng.random() < 0.02:
            value = bytearray(value)  # a client that hands over another bytes-like type
        msg = (value, batch.stream_key.encode())
        out.append(msg)
        sent.append(msg)
        seq[node] = max(seq[node], max(0, start) + n)
        clock[node] = max(clock[node], max(t))
    return [
        SimpleNamespace(topic="ks.launches", partition=0, offset=i, key=k, value=v)
        for i, (v, k) in enumerate(out)
    ]


def _agent(compiled: bool) -> tuple[WindowIngest, dict[str, _Topic]]:
    topics = {role: _Topic() for role in ("deadletter", "late", "windows", "findings")}
    ctx = WorkerContext(Settings(), topics)
    ingest = WindowIngest(None, ctx, Windower(window_spec(ctx.settings)), InlineDetector(ctx))
    assert (ingest.compiled is not None) is True
    if not compiled:
        ingest.compiled = None
    return ingest, topics


def _state(ingest: WindowIngest, keys: set[str]) -> bytes:
    """The checkpoint's record of ``keys``, clock readings left out, in one order (the
    streams' and their windows' order in it means nothing)."""
    exported = (
        ingest.compiled.export_keys(keys)
        if ingest.compiled is not None
        else ingest.windower.export_keys(keys, arrays=True)
    )
    for st in exported.values():
        st["last_seen"] = None
        st["windows"].sort(key=lambda w: (w["window"], w["config_id"]))
    return pack(dict(sorted(exported.items())))


class _FailsOnce:
    """The engine, but its ``at``-th poll fails as nothing foresaw (before it starts)."""

    def __init__(self, engine: Any, at: int) -> None:
        self.engine, self.at, self.calls = engine, at, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def poll(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.at:
            raise TypeError("a defect in the engine")
        return self.engine.poll(*args)


def _run(
    msgs: list[Any], poll: int, compiled: bool, hand_back_at: int = -1, fail_at: int = 0
) -> dict[str, Any]:
    ingest, topics = _agent(compiled)
    if fail_at and ingest.compiled is not None:
        ingest.compiled.engine = _FailsOnce(ingest.compiled.engine, fail_at)
    keys: set[str] = set()
    states = []
    # the baselines the engine's writers formed and handed back to the detector
    taken: list[Any] = []
    detector = ingest.detector.detector if ingest.detector is not None else None
    if detector is not None:
        take = detector.take_baseline

        def counted(key: str, state: Any) -> None:
            taken.append((key, state))
            take(key, state)

        detector.take_baseline = counted  # type: ignore[method-assign]

    async def go() -> None:
        for at in range(0, len(msgs), poll):
            events = [
                SimpleNamespace(message=m, key=m.key, value=m.value) for m in msgs[at : at + poll]
            ]
            await ingest.ingest(events, keys)
            states.append(_state(ingest, keys))
            if ingest.compiled is not None and at <= hand_back_at < at + poll:
                ingest.compiled.release_all()  # every stream back to Python, then taken again

    asyncio.run(go())
    letters = sorted(
        (d.offset, d.reason_code)
        for d in (decode(v, DeadLetter) for v in topics["deadletter"].sent)
    )
    return {
        "windows": sorted(topics["windows"].sent),
        "findings": sorted(topics["findings"].sent),
        "late": sorted(topics["late"].sent),
        "dead_letters": letters,
        "launches": (ingest.stats.launches, ingest.ctx.counters["launches.in"]),
        "metrics": (ingest.windower.metrics.launches_in, ingest.windower.metrics.windows_emitted),
        "open": ingest.windower.open_windows(),
        "states": states,
        "compiled_batches": ingest.stats.compiled_batches,
        "stops": ingest.stats.compiled_stops,
        "batches": ingest.stats.batches,
        "engine_failed": ingest.ctx.counters["window.engine_failed"],
        "written": ingest.stats.written_windows,
        "baselines_formed": len(taken),
        # series the engine wrote from their first window (registered after the first poll)
        "from_start": ingest.compiled.from_start if ingest.compiled is not None else 0,
    }


@pytest.mark.parametrize("poll", [1, 16, 500])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_engine_publishes_what_the_python_path_publishes(seed: int, poll: int) -> None:
    msgs = _messages(seed)
    python = _run(msgs, poll, compiled=False)
    engine = _run(msgs, poll, compiled=True)
    assert engine.pop("compiled_batches") > engine["batches"] // 2  # the engine did most
    python.pop("compiled_batches")
    # the engine wrote windows and findings of the series the detector had judged (in
    # the polls after it judged them: none where one poll holds every message)
    assert (engine.pop("written") > 0) is (poll < len(msgs)) and python.pop("written") == 0
    # ... from the window after the first one of each series the detector judged: the
    # engine's writers formed baselines, which the detector took over
    assert (engine.pop("baselines_formed") > 0) is (poll < len(msgs))
    assert python.pop("baselines_formed") == 0
    # ... and, of series registered after a poll, from their first window (past the first
    # CHECK_FIRST of them, left to the detector, whose writers are checked)
    assert (engine.pop("from_start") > 0) is (poll < len(msgs)) and python.pop("from_start") == 0
    classes = {decode(v, Finding).classification for v in python["findings"]}
    assert classes & {"host_sync", "transfer_bound", "pageable_copies", "no_overlap"}
    stops = engine.pop("stops")
    python.pop("stops")
    assert set(stops) <= TAKE_OVER | HELD_BACK and stops["unregistered"] and stops["sequence"]
    assert python["windows"] and python["dead_letters"] and python["late"]
    for field in python:
        assert engine[field] == python[field], field


def test_streams_given_back_and_taken_again_change_nothing() -> None:
    msgs = _messages(3)
    python = _run(msgs, 16, compiled=False)
    engine = _run(msgs, 16, compiled=True, hand_back_at=200)
    for run in (engine, python):
        run.pop("compiled_batches")
        run.pop("stops")
        run.pop("from_start")
    assert engine.pop("written") > 0 and python.pop("written") == 0
    assert engine.pop("baselines_formed") > 0 and python.pop("baselines_formed") == 0
    assert engine == python


def test_an_engine_failure_hands_everything_to_python_and_loses_nothing() -> None:
    msgs = _messages(4)
    python = _run(msgs, 16, compiled=False)
    # (after the engine's writers formed baselines the Python path then judges from)
    engine = _run(msgs, 16, compiled=True, fail_at=25)
    assert engine.pop("engine_failed") == 1 and python.pop("engine_failed") == 0
    assert engine["baselines_formed"] > 0 and engine["written"] > 0
    for run in (engine, python):
        run.pop("compiled_batches")
        run.pop("stops")
        run.pop("baselines_formed")
        run.pop("written")
        run.pop("from_start")
    assert engine == python


def test_a_failure_learning_a_writer_hands_everything_to_python_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    msgs = _messages(5)
    python = _run(msgs, 16, compiled=False)

    def broken(*args: Any) -> Any:
        raise RuntimeError("a defect in the writer's constants")

    monkeypatch.setattr(compiled_windows, "series_writer", broken)
    engine = _run(msgs, 16, compiled=True)
    assert engine.pop("engine_failed") == 1 and python.pop("engine_failed") == 0
    for run in (engine, python):
        run.pop("compiled_batches")
        run.pop("stops")
        run.pop("baselines_formed")
        run.pop("from_start")
    assert engine == python


def test_idle_streams_are_given_back_for_the_idle_flush() -> None:
    ingest, _ = _agent(compiled=True)
    assert ingest.compiled is not None
    start = math.floor(time.time()) - 10.0  # both launches in one 1 s window, whatever the clock
    batch = _batch("n1", [start + 0.2, start + 0.3], 0, _configs()[0])
    msg = SimpleNamespace(
        topic="ks.launches",
        partition=0,
        offset=0,
        key=batch.stream_key.encode(),
        value=encode_launch_batch(batch),
    )
    asyncio.run(ingest.ingest([SimpleNamespace(message=msg, key=msg.key, value=msg.value)], set()))
    assert ingest.compiled.engine.holds(batch.stream_key) and ingest.windower.open_windows() == 1
    idle = ingest.windower.spec.idle_timeout_s
    ingest.compiled.release_idle(time.time() + idle / 2, None)  # not idle yet
    assert ingest.compiled.engine.holds(batch.stream_key)
    ingest.compiled.release_idle(
        time.time() + idle + 1.0, lambda key: time.time() + 0.5
    )  # not read up to date
    assert ingest.compiled.engine.holds(batch.stream_key)
    ingest.compiled.release_idle(time.time() + idle + 1.0, None)
    assert not ingest.compiled.engine.holds(batch.stream_key)
    [agg] = ingest.windower.flush_idle(time.time() + idle + 1.0)
    assert agg.count == 2 and agg.stream_key == batch.stream_key


def test_a_subclassed_windower_windows_in_python() -> None:
    class Mine(Windower):
        pass

    assert CompiledWindows.of(Mine()) is None
    assert CompiledWindows.of(Windower()) is not None


def test_a_poll_of_new_streams_is_decoded_at_once_and_dead_letters_come_in_order() -> None:
    """The first batches of many new streams in one poll: decoded together and given to
    the engine at the first of them (one stop, not one per stream); the refused ones
    dead-lettered in offset order, where the engine reaches each; the same output as the
    Python path's."""
    configs = _configs()
    base = math.floor(time.time()) - 60.0
    out: list[tuple[bytes | None, bytes | None]] = []
    for rnd in range(3):
        for i in range(40):
            node = f"fresh-{i}"
            t = [base + rnd + 0.1 * k + 0.001 * i for k in range(1, 6)]
            batch = _batch(node, t, rnd * 5, configs[0])
            value = encode_launch_batch(batch)
            if rnd == 0 and i % 9 == 4:
                # a first batch the edge refuses: its node's key does not match
                out.append((value, b"someone-else:0/matmul"))
                continue
            out.append((value, batch.stream_key.encode()))
    msgs = [
        SimpleNamespace(topic="ks.launches", partition=0, offset=i, key=k, value=v)
        for i, (v, k) in enumerate(out)
    ]
    engine = _run(msgs, len(msgs), compiled=True)
    python = _run(msgs, len(msgs), compiled=False)
    refused = [i for i in range(40) if i % 9 == 4]
    # the engine stops at the first new stream (every one given then) and at each message
    # refused, which it was not given
    assert engine["stops"] == {"unregistered": 1 + len(refused)}
    assert engine["compiled_batches"] == engine["batches"] == len(msgs) - len(refused)
    for field in ("windows", "findings", "late", "dead_letters", "launches", "states"):
        assert engine[field] == python[field], field
    # in the order of their offsets, as published
    ingest, topics = _agent(True)

    async def go() -> None:
        events = [SimpleNamespace(message=m, key=m.key, value=m.value) for m in msgs]
        await ingest.ingest(events, set())

    asyncio.run(go())
    offsets = [decode(v, DeadLetter).offset or 0 for v in topics["deadletter"].sent]
    assert offsets == sorted(offsets) == refused


def test_a_worker_of_more_streams_than_four_thousand_registers_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """5,000 streams on one worker (above the 4,096 headers the engine once kept): each
    stream's first batch is decoded and registered, and every later batch is windowed by
    the engine without another decode. With too small a bound the engine forgot the
    headers on the way and decoded every batch of every stream again."""
    configs = _configs()
    base = math.floor(time.time()) - 60.0
    streams = 5_000
    rounds = [
        [
            _batch(
                f"wide-{i // 4}",
                [base + r + 0.1, base + r + 0.2],
                2 * r,
                configs[0],
                device_index=i % 4,
            )
            for i in range(streams)
        ]
        for r in range(3)
    ]
    ingest, _ = _agent(True)
    decoded: list[int] = []
    verdicts = ingest.ctx.launch_verdicts

    def counted(events: list[Any]) -> Any:
        decoded.append(len(events))
        return verdicts(events)

    monkeypatch.setattr(ingest.ctx, "launch_verdicts", counted)
    offset = 0

    async def go() -> None:
        nonlocal offset
        for batches in rounds:
            msgs = []
            for b in batches:
                value = encode_launch_batch(b)
                msgs.append(SimpleNamespace(key=b.stream_key.encode(), value=value, offset=offset))
                offset += 1
            for at in range(0, len(msgs), 500):
                events = [
                    SimpleNamespace(message=m, key=m.key, value=m.value)
                    for m in msgs[at : at + 500]
                ]
                await ingest.ingest(events, set())
            if batches is rounds[0]:
                assert sum(decoded) == streams  # each first batch, once

    asyncio.run(go())
    assert sum(decoded) == streams  # none decoded again
    assert ingest.stats.compiled_batches == ingest.stats.batches == 3 * streams
    assert ingest.compiled is not None
    assert len({b.stream_key for b in rounds[0]}) == streams


class _Series:
    """One stream's batches of one configuration, a window each (20 launches of one
    duration), and the polls that bring them."""

    def __init__(self) -> None:
        self.config = _configs()[0]
        self.base = math.floor(time.time()) - 120.0
        self.seq = 0

    def batch(self, window: int, duration: float, **fields: Any) -> SimpleNamespace:
        n = 20
        t = [self.base + window + (i + 0.5) / n for i in range(n)]
        b = make_example_batch(
            t,
            [duration] * n,
            [1] * n,
            node="n0",
            kernel=_KERNEL,
            problem_size=list(_SIZE),
            config=self.config[0],
            config_id=self.config[1],
            seq_start=self.seq,
            **fields,
        )
        self.seq += n
        return SimpleNamespace(
            message=None, key=b.stream_key.encode(), value=encode_launch_batch(b)
        )

    @staticmethod
    def run(polls: list[list[SimpleNamespace]], compiled: bool) -> tuple[Any, Any, int]:
        ingest, topics = _agent(compiled)
        keys: set[str] = set()

        async def go() -> None:
            for events in polls:
                for i, e in enumerate(events):
                    e.message = SimpleNamespace(
                        topic="ks.launches", partition=0, offset=i, key=e.key, value=e.value
                    )
                await ingest.ingest(events, keys)

        asyncio.run(go())
        return topics["windows"].sent, topics["findings"].sent, ingest.stats.written_windows


def test_a_window_left_to_python_while_the_baseline_forms_changes_nothing() -> None:
    """A window the writer cannot promise the Python path's bytes for (durations so small
    that the bandwidth it implies is past the largest float) comes back to the detector,
    which feeds the series' baseline with it; a later window of the series closed in the
    same poll is judged from that baseline too, not from the writer's."""
    s = _Series()
    polls = [
        [s.batch(0, 40.0), s.batch(5, 41.0)],  # closes window 0: judged in Python, learnt
        [s.batch(6, 5e-324)],  # closes window 5: written, the baseline's second
        [s.batch(7, 90.0), s.batch(20, 42.0)],  # closes 6 (left to Python: the third) and 7
        [s.batch(40, 43.0)],
    ]
    python, engine = _Series.run(polls, compiled=False), _Series.run(polls, compiled=True)
    assert engine[2] > 0 and python[2] == 0  # the engine wrote some of them
    assert engine[:2] == python[:2]
    judged = [decode(v, Finding) for v in python[1]]
    assert [f.window_start - s.base for f in judged] == [0.0, 5.0, 6.0, 7.0, 20.0]
    assert "regression_ratio" in judged[3].evidence  # window 7: the baseline of 0, 5, 6


def test_a_stream_alternating_headers_forms_one_baseline() -> None:
    """The detector keeps one baseline per stream and configuration, whatever else the
    batches' headers say (here the waves a launch fills); the engine has a writer per
    header, so a stream whose headers alternate while its baseline forms keeps one writer
    of the configuration at a time: each window judged from the one baseline (in Python
    while they alternate, then written again)."""
    s = _Series()
    polls = [[s.batch(w, 40.0 + w, waves=6.1 + (w % 2 if w < 6 else 0))] for w in range(12)]
    python, engine = _Series.run(polls, compiled=False), _Series.run(polls, compiled=True)
    assert engine[2] > 0 and python[2] == 0
    assert engine[:2] == python[:2]
    judged = [decode(v, Finding) for v in python[1]]
    assert [f.evidence.get("baseline_windows") for f in judged[:5]] == [None, None, None, 3, 3]


def test_a_window_of_another_header_left_to_python_drops_the_configurations_writer() -> None:
    """A window of the configuration under another header (no writer for it yet) is
    judged in Python and may feed the one baseline; a window of the first header closed
    after it in the same poll is judged from that baseline too."""
    s = _Series()
    polls = [
        [s.batch(0, 40.0)],
        [s.batch(1, 41.0)],  # closes window 0: judged in Python, a writer learnt
        [s.batch(2, 42.0, waves=7.5)],  # closes 1: written, the baseline's second
        [s.batch(3, 90.0), s.batch(4, 43.0)],  # closes 2 (another header: Python) and 3
        [s.batch(9, 44.0)],
    ]
    python, engine = _Series.run(polls, compiled=False), _Series.run(polls, compiled=True)
    assert engine[2] > 0 and python[2] == 0
    assert engine[:2] == python[:2]
    judged = [decode(v, Finding) for v in python[1]]
    assert [f.window_start - s.base for f in judged] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert "regression_ratio" in judged[3].evidence  # window 3: the baseline of 0, 1, 2


def test_a_tuning_fleet_s_series_are_forgotten_once_nothing_uses_them() -> None:
    """Every configuration a stream moves to is a series whose per-batch fields the
    engine's index keeps; kept for good, a tuning fleet's worker grew by ~12 KB a series.
    Past MAX_METAS series (here 20,000: 40 streams, 500 configurations each, one window
    each), those with no window open are forgotten with their headers, and a stream that
    comes back to a configuration it left (the last round) is decoded and registered
    again. Windows and findings stay byte for byte the Python path's."""
    space = get_workload(_KERNEL, _SIZE).space
    configs = [(c, space.config_id(c)) for c in itertools.islice(space, 500)]
    base = math.floor(time.time()) - 600.0
    streams = 40
    steps = [*range(len(configs)), 0]  # back to the first configuration at the end
    polls: list[list[SimpleNamespace]] = []
    for r, c in enumerate(steps):
        poll = []
        for i in range(streams):
            b = _batch(f"tune-{i}", [base + r + 0.25, base + r + 0.5], 2 * r, configs[c])
            poll.append(SimpleNamespace(key=b.stream_key.encode(), value=encode_launch_batch(b)))
        polls.append(poll)
    assert streams * len(configs) > compiled_windows.MAX_METAS

    def run(compiled: bool) -> tuple[list[bytes], list[bytes], WindowIngest]:
        ingest, topics = _agent(compiled)
        keys: set[str] = set()
        offset = 0

        async def go() -> None:
            nonlocal offset
            for poll in polls:
                events = []
                for e in poll:
                    msg = SimpleNamespace(
                        topic="ks.launches", partition=0, offset=offset, key=e.key, value=e.value
                    )
                    offset += 1
                    events.append(SimpleNamespace(message=msg, key=e.key, value=e.value))
                await ingest.ingest(events, keys)
                if ingest.compiled is not None:
                    assert ingest.compiled.metas_kept() <= compiled_windows.MAX_METAS

        asyncio.run(go())
        return sorted(topics["windows"].sent), sorted(topics["findings"].sent), ingest

    python, engine = run(False), run(True)
    ingest = engine[2]
    assert ingest.compiled is not None and ingest.ctx.counters["window.engine_failed"] == 0
    assert ingest.ctx.counters["window.series_forgotten"] >= streams * len(configs) // 2
    assert ingest.stats.compiled_batches == ingest.stats.batches  # every batch in the engine
    assert len(engine[0]) >= streams * len(configs) and engine[:2] == python[:2]
