"""``kernelstream bench worker-path``: the worker's per-launch CPU cost, without Kafka.

The pipeline benchmark's (c)/(a) compares two processes on a shared broker; this
one isolates the worker's own code on the same kind of input so a change to it
can be measured in seconds and profiled. In one process, on the pipeline
benchmark's fleet batches (zstd-compressed as nodes send them, a frame per message, and
decompressed by the worker's own decoder, :mod:`app.kafka.zstd_decode`), it times:

* ``ceiling``: zstd decompression + ``orjson.loads`` of every message (what the
  pipeline benchmark's ceiling does per message, minus the broker);
* ``worker``: decompression, :func:`schemas.columnar.decode_launch_columns_many`
  (parse and validation, a poll of messages at a time), the agent's own control flow
  (:func:`agents.logic.ingest.window_partition`: the batches that continue their streams
  a run at a time, each other batch alone after the sequence rules, the streams' windows
  closed after them) and a
  checkpoint snapshot (:func:`agents.logic.snapshot_codec.pack`) about once a second of
  input, as the window agent does; beside it, in the same rounds, every batch windowed
  alone and its stream's windows closed after it (``batch by batch``), as the agent did
  before it windowed runs.

It prints ns per launch for both and their ratio; ``--profile`` adds the top of a
cProfile of the worker path. ``--agent`` also runs the window agent's own per-poll code
(:meth:`agents.window_agent.WindowIngest.ingest`: the edge checks of every message, the
windowing, and each closed window published with its findings by the inline detector)
over the same messages, the records it publishes counted instead of sent: the
window stage's CPU per message and per window by step (decode, window, close, emit), as
``bench pipeline-peers`` prints it from a live worker, but without a broker, a consumer or
the worker's other tasks sharing the loop, so a change to the stage's own code shows in
seconds and in the same figures. With ``--wire binary`` it also prints what bounds any worker
on that input: zstd decompression alone (the binary ceiling's own work, no parsing left)
and the exact window aggregates alone (count, mean and p95 per (stream, config, window):
each window's durations gathered from the batches that carry them, summed, and
partitioned at the ranks p95 interpolates between, as the worker does), with the parts
grouped before the clock starts. A worker that did nothing but those aggregates would reach
zstd / (zstd + aggregates) of the binary ceiling; everything else it does (decoding,
validation, the window bookkeeping, emitting) comes on top. ``--columnar`` also times a
window stage that windows each poll as columns (:mod:`bench.columnar_bound`: steady
state only, no records) over the same messages in the agent's polls, its windows checked
equal to the worker's. ``--config-every S`` makes the fleet a tuning one: each kernel moves
to another configuration of its space every S seconds of input, and each move starts a
series (a stream in a configuration); with ``--agent`` it also prints, after one more pass
under ``tracemalloc``, the Python memory the window agent holds after the input (what a
long-running worker keeps per series) and the series' per-batch fields the compiled
engine's index keeps.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import hashlib
import io
import math
import pstats
import statistics
import time
from typing import Any

import click
import numpy as np
import orjson
from aiokafka import TopicPartition, codec
from aiokafka.structs import ConsumerRecord

from kernelstream.agents.alert_agent import AlertStage, forecaster_from_settings
from kernelstream.agents.context import RecordEvent, WorkerContext
from kernelstream.agents.detector_agent import InlineDetector
from kernelstream.agents.findings_agent import POLL_RECORDS as FINDINGS_POLL
from kernelstream.agents.findings_agent import FindingsReader
from kernelstream.agents.logic.ingest import (
    MAX_POLL_RECORDS,
    Counted,
    poll_records,
    window_partition,
)
from kernelstream.agents.logic.sequencing import SeqLimits
from kernelstream.agents.logic.snapshot_codec import pack
from kernelstream.agents.logic.windowing import Windower, WindowSpec, percentiles
from kernelstream.agents.tuner_agent import TunerStage, tuner_from_settings
from kernelstream.agents.window_agent import WindowIngest, window_spec
from kernelstream.app.kafka.zstd_decode import zstd_decode
from kernelstream.app.settings import Settings
from kernelstream.bench.columnar_bound import Row, check_rows, columnar_pass
from kernelstream.bench.pipeline_input import FleetSpec, encoded, fleet_batches, recent_t0
from kernelstream.schemas import Finding, decode, native
from kernelstream.schemas.binary import encode_launch_batch, read_head
from kernelstream.schemas.columnar import LaunchColumns, decode_launch_columns_many
from kernelstream.schemas.errors import SchemaError

__all__ = [
    "agent_pass",
    "aggregates_pass",
    "command",
    "measure",
    "nonempty_windows",
    "window_parts",
]

_SEQ_LIMITS = SeqLimits()


def _now(_: object) -> float:
    return time.time()


def _worker_pass(messages: list[bytes], per_checkpoint: int, runs: bool = True) -> int:
    """The window agent's path over ``messages``; ``runs``: the agent's own control flow
    (:func:`agents.logic.ingest.window_partition`: the batches that continue their streams
    exactly a run at a time, any other after the sequence rules), else batch by batch
    (add_columns, then the stream's windows closed)."""
    windower = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05))
    windows = 0
    at, take, since_checkpoint = 0, MAX_POLL_RECORDS, 0
    while at < len(messages):
        # decoded a poll at a time, of the size the window agent takes from its consumer
        poll = [zstd_decode(raw) for raw in messages[at : at + take]]
        at += len(poll)
        decoded: list[LaunchColumns] = []
        for cols in decode_launch_columns_many(poll):
            if isinstance(cols, SchemaError):
                raise cols
            decoded.append(cols)
        if runs:  # the agent's own control flow
            steps = window_partition(windower, list(enumerate(decoded)), _SEQ_LIMITS, now=_now)
            for step in steps:
                if not isinstance(step, Counted):
                    raise RuntimeError(f"the fleet's batches are all counted: {step}")
                windows += len(step.closed)
        else:
            for cols in decoded:
                windower.add_columns(cols, time.time())
                windows += len(windower.poll_key(cols.stream_key))
        since_checkpoint += len(poll)
        if since_checkpoint >= per_checkpoint:
            pack(windower.snapshot(arrays=True))
            since_checkpoint = 0
        take = poll_records(sum(c.t_end.size for c in decoded), len(poll))
    return windows


def window_parts(
    batches: list[Any], size_s: float = 1.0
) -> dict[tuple[str, str, float], list[np.ndarray]]:
    """Each window's durations (launches that ran) as the slices of the batches carrying
    them, keyed (stream, config, window start): the grouping a worker has done by the time
    a window closes."""
    parts: dict[tuple[str, str, float], list[np.ndarray]] = {}
    for b in batches:
        t, d = np.asarray(b.t_end), np.asarray(b.duration_us)
        ok = np.asarray(b.ok, dtype=bool)
        win = np.floor(t / size_s).astype(np.int64)
        for w in np.unique(win):
            key = (b.stream_key, b.config_id, float(w * size_s))
            parts.setdefault(key, []).append(d[(win == w) & ok])
    return parts


def nonempty_windows(batches: list[Any], size_s: float = 1.0) -> list[list[np.ndarray]]:
    return [ps for ps in window_parts(batches, size_s).values() if sum(len(p) for p in ps)]


def aggregates_pass(windows: list[list[np.ndarray]]) -> float:
    """count, mean and p95 (linear, as ``np.percentile``) of every window, p95 taken as
    the worker takes it (:func:`agents.logic.windowing.percentiles`: single-rank
    partitions, about 6x faster than NumPy's partition at two ranks at once)."""
    acc = 0.0
    for ps in windows:
        d = np.concatenate(ps) if len(ps) > 1 else ps[0]
        acc += float(d.sum()) / len(d) + percentiles(d, (95.0,))[0]
    return acc


def _zstd_pass(messages: list[bytes]) -> int:
    return sum(len(zstd_decode(raw)) for raw in messages)


def _ceiling_pass(messages: list[bytes]) -> int:
    return sum(len(orjson.loads(zstd_decode(raw))["t_end"]) for raw in messages)


class _Kept:
    """A topic whose records are counted and dropped (``WorkerContext`` sends to it when the
    context has no app): what the agent publishes, counted, without a producer. ``keep``:
    the (key, value) pairs kept too; ``fields``: the digest over those fields of each
    record only (records stamped with the time they were made)."""

    def __init__(self, keep: bool = False, fields: tuple[str, ...] = ()) -> None:
        self.records = 0
        self.digest = hashlib.blake2b(digest_size=16)
        self.kept: list[tuple[bytes, bytes]] | None = [] if keep else None
        self.fields = fields

    async def send(
        self, key: bytes | None = None, value: bytes = b"", partition: Any = None
    ) -> None:
        self.records += 1
        if self.fields:
            record = orjson.loads(value)
            self.digest.update(orjson.dumps([record.get(f) for f in self.fields]))
        else:
            self.digest.update(value)
        if self.kept is not None:
            self.kept.append((key or b"", value))


def _record(
    offset: int, key: bytes, value: bytes, topic: str = "ks.launches"
) -> ConsumerRecord[bytes, bytes]:
    """A fetched message, as aiokafka's consumer returns it."""
    return ConsumerRecord(topic, 0, offset, 0, 0, key, value, None, len(key), len(value), ())


def agent_pass(
    messages: list[bytes],
    keys: list[bytes],
    keep_findings: bool = False,
    hold: list[Any] | None = None,
) -> dict[str, Any]:
    """The window agent's per-poll code over ``messages`` (zstd-compressed; ``keys``: their
    message keys), decompressed before the clock starts (aiokafka's fetch does that),
    then a poll of the agent's size at a time through
    :meth:`agents.window_agent.WindowIngest.ingest` with the inline detector. Returns the
    seconds in all and by step, the windows and findings published and the dead letters
    (none for the fleet's batches); ``keep_findings``: the findings too (key, value), for
    :func:`findings_pass`."""
    sinks = {role: _Kept() for role in ("deadletter", "late", "windows")}
    sinks["findings"] = _Kept(keep=keep_findings)
    settings = Settings()
    ctx = WorkerContext(settings, sinks)
    ingest = WindowIngest(None, ctx, Windower(window_spec(settings)), InlineDetector(ctx))
    if hold is not None:
        hold.append(ingest)
    records = [
        _record(i, key, zstd_decode(raw))
        for i, (key, raw) in enumerate(zip(keys, messages, strict=True))
    ]

    async def run() -> float:
        at, take = 0, MAX_POLL_RECORDS
        t0 = time.perf_counter()
        while at < len(records):
            events = [RecordEvent(record) for record in records[at : at + take]]
            at += len(events)
            before = ingest.stats.launches
            await ingest.ingest(events, set())
            take = poll_records(ingest.stats.launches - before, len(events))
        return time.perf_counter() - t0

    # The benchmark's own data (the fleet's batches, these records) out of the garbage
    # collector's reach while the agent runs, as a worker's start-up objects are
    # (gc.freeze() in app.worker.start): else a full collection that the agent's objects
    # set off scans them too, ~0.7 s with a tuning fleet's 49k batches, which no worker
    # pays. The agent's own objects are collected as in a worker.
    gc.collect()
    gc.freeze()
    try:
        seconds = asyncio.run(run())
    finally:
        gc.unfreeze()
    compiled = ingest.compiled
    return {
        "seconds": seconds,
        "metas_kept": compiled.metas_kept() if compiled is not None else 0,
        "stage_s": dict(ingest.stats.stage_s),
        "windows": sinks["windows"].records,
        "windows_digest": sinks["windows"].digest.hexdigest(),
        "findings_digest": sinks["findings"].digest.hexdigest(),
        "findings": sinks["findings"].records,
        "dead_letters": sinks["deadletter"].records,
        "_findings": sinks["findings"].kept,
    }


class _Timed:
    """A findings stage whose ``on_findings`` is timed (seconds, summed)."""

    def __init__(self, stage: Any) -> None:
        self.stage, self.seconds = stage, 0.0

    async def on_findings(self, burst: list[tuple[Any, Any]]) -> None:
        t0 = time.perf_counter()
        await self.stage.on_findings(burst)
        self.seconds += time.perf_counter() - t0


def findings_pass(findings: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    """The findings reader's per-poll code (:meth:`agents.findings_agent.FindingsReader.take`:
    each finding checked and decoded at the edge, then the poll's findings to the tuner
    stage and the alert stage) over ``findings`` (key, value), a poll of the reader's size
    at a time, with fresh stages; what they publish counted instead of sent. Returns the
    seconds in all and by stage, and what was published (the recommendations' digest over
    their node, kernel, config and reason: they carry the time they were made)."""
    sinks = {
        "deadletter": _Kept(),
        "alerts": _Kept(),
        "recommendations": _Kept(fields=("node", "kernel", "config", "reason")),
    }
    ctx = WorkerContext(Settings(), sinks)
    tuner, alerts = _Timed(TunerStage(ctx)), _Timed(AlertStage(ctx))
    reader = FindingsReader(None, ctx, [tuner, alerts], None)
    topic = str(ctx.settings.topic_findings)
    records = [_record(i, k, v, topic) for i, (k, v) in enumerate(findings)]
    tp = TopicPartition(topic, 0)

    async def run() -> float:
        t0 = time.perf_counter()
        for at in range(0, len(records), FINDINGS_POLL):
            await reader.take({tp: records[at : at + FINDINGS_POLL]})
        return time.perf_counter() - t0

    seconds = asyncio.run(run())
    return {
        "seconds": seconds,
        "stage_s": {
            "decode": seconds - tuner.seconds - alerts.seconds,
            "tuner": tuner.seconds,
            "alerts": alerts.seconds,
        },
        "calls_s": _stage_calls(ctx.settings, [v for _, v in findings]),
        "findings": len(records),
        "recommendations": sinks["recommendations"].records,
        "recommendations_digest": sinks["recommendations"].digest.hexdigest(),
        "alerts": sinks["alerts"].records,
        "dead_letters": sinks["deadletter"].records,
    }


def held_memory(messages: list[bytes], keys: list[bytes]) -> int:
    """Bytes of Python memory the window agent holds once it has taken ``messages``
    (:func:`agent_pass`, the agent kept alive), measured with ``tracemalloc`` (garbage
    collected before and after): what a long-running worker keeps of the input."""
    import tracemalloc

    held: list[Any] = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        agent_pass(messages, keys, hold=held)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        held.clear()


def _stage_calls(settings: Settings, values: list[bytes], passes: int = 3) -> dict[str, float]:
    """Seconds the tuner's and the forecaster's bookkeeping of every finding take, each
    call alone, from fresh state, the fastest of ``passes`` (no hand-over, no edge check,
    no proposal: what each finding costs the two stages whatever they decide)."""
    found = [decode(v, Finding) for v in values]
    best = {"Tuner.observe_finding": math.inf, "Forecaster.observe": math.inf}
    for _ in range(passes):
        tuner, forecaster = tuner_from_settings(settings), forecaster_from_settings(settings)
        t0 = time.perf_counter()
        for finding in found:
            tuner.observe_finding(finding)
        t1 = time.perf_counter()
        for finding in found:
            forecaster.observe(finding)
        t2 = time.perf_counter()
        best["Tuner.observe_finding"] = min(best["Tuner.observe_finding"], t1 - t0)
        best["Forecaster.observe"] = min(best["Forecaster.observe"], t2 - t1)
    return best


def _poll_sizes(values: list[bytes]) -> list[int]:
    """The sizes of the window agent's polls over ``values`` (:func:`poll_records`)."""
    sizes, at, take = [], 0, MAX_POLL_RECORDS
    while at < len(values):
        poll = values[at : at + take]
        sizes.append(len(poll))
        at += len(poll)
        launches = sum(read_head(v)[2] for v in poll)
        take = poll_records(launches, len(poll))
    return sizes


def measure(
    seconds: float = 4.0,
    batch: int = 2000,
    rounds: int = 3,
    *,
    nodes: int = 16,
    rate_per_kernel: float = 20_000.0,
    wire: str = "json",
    agent: bool = False,
    columnar: bool = False,
    findings: bool = False,
    config_every_s: float | None = None,
) -> dict[str, Any]:
    """Best-of-``rounds`` ns per launch of the worker path and of the ceiling path.

    ``wire="binary"`` feeds the worker path the binary layout (:mod:`schemas.binary`);
    the ceiling stays zstd + ``orjson.loads`` of the same batches as JSON. ``agent``: also
    the window agent's own per-poll code (:func:`agent_pass`), the fastest of the rounds.
    ``columnar`` (binary only): also the columnar window stage of
    :mod:`bench.columnar_bound` over the same messages in the agent's poll sizes, its
    windows compared with the worker's. ``findings`` (with ``agent``): also the findings
    stages (:func:`findings_pass`) over the findings the agent published, every round.
    ``config_every_s``: each kernel moves to another configuration that often
    (:attr:`FleetSpec.config_every_s`); with ``agent``, the memory the agent holds after
    the input is measured too (:func:`held_memory`, one more pass).
    """
    fleet = FleetSpec(
        nodes=nodes,
        launches_per_s_per_kernel=rate_per_kernel,
        seconds=seconds,
        max_launches=batch,
        t0=recent_t0(seconds),
        config_every_s=config_every_s,
    )
    batches = list(fleet_batches(fleet))
    series = len({(b.stream_key, b.config_id) for b in batches})
    pairs = list(encoded(batches))
    json_messages = [codec.zstd_encode(value) for _, value in pairs]
    messages = (
        [codec.zstd_encode(encode_launch_batch(b)) for b in batches]
        if wire == "binary"
        else json_messages
    )
    keys = [key for key, _ in pairs]
    launches = _ceiling_pass(json_messages)
    per_checkpoint = max(1, round(len(messages) / seconds))  # ~one per second of input
    parts = nonempty_windows(batches) if wire == "binary" else []
    worker, by_batch, ceiling, zstd, aggregates = [], [], [], [], []
    agent_runs: list[dict[str, Any]] = []
    values = [zstd_decode(raw) for raw in messages] if columnar and parts else []
    sizes = _poll_sizes(values)
    columnar_s: list[float] = []
    rows: list[Row] = []
    core = native.core
    numpy_runs: list[dict[str, Any]] = []
    findings_runs: list[dict[str, Any]] = []
    for _ in range(rounds):
        if agent:
            agent_runs.append(agent_pass(messages, keys, keep_findings=findings))
            if findings:
                findings_runs.append(findings_pass(agent_runs[-1]["_findings"]))
            agent_runs[-1]["_findings"] = None
            if core is not None:  # the same code with the NumPy passes, in the same round
                native.core = None
                try:
                    numpy_runs.append(agent_pass(messages, keys))
                finally:
                    native.core = core
        if values:
            took, rows = columnar_pass(values, window_spec(Settings()), sizes)
            columnar_s.append(took)
        t0 = time.perf_counter()
        windows = _worker_pass(messages, per_checkpoint, runs=False)
        t1 = time.perf_counter()
        by_batch.append((t1 - t0) / launches * 1e9)
        t0 = time.perf_counter()
        if _worker_pass(messages, per_checkpoint) != windows:
            raise RuntimeError("the two paths closed different numbers of windows")
        t1 = time.perf_counter()
        _ceiling_pass(json_messages)
        t2 = time.perf_counter()
        worker.append((t1 - t0) / launches * 1e9)
        ceiling.append((t2 - t1) / launches * 1e9)
        if parts:
            t0 = time.perf_counter()
            _zstd_pass(messages)
            t1 = time.perf_counter()
            aggregates_pass(parts)
            t2 = time.perf_counter()
            zstd.append((t1 - t0) / launches * 1e9)
            aggregates.append((t2 - t1) / launches * 1e9)
    bound: dict[str, Any] = {}
    if parts:
        bound = {
            "zstd_ns_per_launch": min(zstd),
            "aggregates_ns_per_launch": min(aggregates),
            "aggregate_windows": len(parts),
            "bound_vs_binary_ceiling": min(zstd) / (min(zstd) + min(aggregates)),
            "worker_vs_binary_ceiling": min(zstd) / min(worker),
        }
    if agent_runs:
        best = min(agent_runs, key=lambda r: r["seconds"])
        bound["agent"] = {
            **best,
            "ns_per_launch": best["seconds"] / launches * 1e9,
            "us_per_message": best["seconds"] / len(messages) * 1e6,
            "rounds_s": [r["seconds"] for r in agent_runs],
        }
        if config_every_s is not None:
            bound["agent"]["held_bytes"] = held_memory(messages, keys)
    if findings_runs:
        best = min(findings_runs, key=lambda r: r["seconds"])
        bound["findings"] = {
            **best,
            "rounds_s": [r["seconds"] for r in findings_runs],
            "same_output": len({(r["recommendations_digest"], r["alerts"]) for r in findings_runs})
            == 1,
        }
    if numpy_runs:
        best = min(numpy_runs, key=lambda r: r["seconds"])
        bound["agent_numpy"] = {
            **best,
            "us_per_message": best["seconds"] / len(messages) * 1e6,
            "rounds_s": [r["seconds"] for r in numpy_runs],
            "same_windows": all(
                (r["windows_digest"], r["findings_digest"])
                == (agent_runs[0]["windows_digest"], agent_runs[0]["findings_digest"])
                for r in [*agent_runs, *numpy_runs]
            ),
        }
    if columnar_s:
        equal, reference = check_rows(rows, values, window_spec(Settings()))
        best_s = min(columnar_s)
        bound["columnar"] = {
            "ns_per_launch": best_s / launches * 1e9,
            "us_per_message": best_s / len(messages) * 1e6,
            "rounds_s": columnar_s,
            "windows": len(rows),
            "windows_equal": equal,
            "worker_windows": reference,
            "vs_binary_ceiling": min(zstd) / (min(zstd) + best_s / launches * 1e9),
        }
    return {
        **bound,
        "launches": launches,
        "messages": len(messages),
        "series": series,
        "windows": windows,
        "worker_ns_per_launch": min(worker),
        "batch_by_batch_ns_per_launch": min(by_batch),
        "ceiling_ns_per_launch": min(ceiling),
        "ratio": min(ceiling) / min(worker),
        "rounds": {
            "worker": worker,
            "batch_by_batch": by_batch,
            "ceiling": ceiling,
            "zstd": zstd,
            "aggregates": aggregates,
        },
        "_messages": messages,
        "_per_checkpoint": per_checkpoint,
    }


@click.command("worker-path")
@click.option("--seconds", type=float, default=4.0, show_default=True, help="Fleet input.")
@click.option("--batch", type=int, default=2000, show_default=True, help="Launches per batch.")
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--nodes", type=int, default=16, show_default=True)
@click.option("--rate-per-kernel", type=float, default=20_000.0, show_default=True)
@click.option("--wire", type=click.Choice(["json", "binary"]), default="json", show_default=True)
@click.option("--profile", is_flag=True, help="Also print the top of a cProfile of the path.")
@click.option(
    "--agent",
    is_flag=True,
    help="Also the window agent's own per-poll code (edge checks, windowing, publishing "
    "with findings; no broker), by step.",
)
@click.option(
    "--columnar",
    is_flag=True,
    help="With --wire binary: also a window stage that windows each poll as columns "
    "(bench/columnar_bound.py; steady state, no records), its windows checked against "
    "the worker's.",
)
@click.option(
    "--findings",
    is_flag=True,
    help="With --agent: also the findings reader's stages (edge checks, the tuner, the "
    "alerts; no broker) over the findings the window agent published, by stage.",
)
@click.option(
    "--config-every",
    type=float,
    default=None,
    help="Seconds of input between each kernel's moves to another configuration (a "
    "tuning fleet: each move starts a series); with --agent, also the memory the window "
    "agent holds after the input.",
)
def command(
    seconds: float,
    batch: int,
    rounds: int,
    nodes: int,
    rate_per_kernel: float,
    wire: str,
    profile: bool,
    agent: bool,
    columnar: bool,
    findings: bool,
    config_every: float | None,
) -> None:
    """Worker CPU per launch (decode, window, checkpoint) vs zstd + orjson alone."""
    if findings and not agent:
        raise click.UsageError("--findings reads what the window agent publishes: add --agent")
    r = measure(
        seconds,
        batch,
        rounds,
        nodes=nodes,
        rate_per_kernel=rate_per_kernel,
        wire=wire,
        agent=agent,
        columnar=columnar,
        findings=findings,
        config_every_s=config_every,
    )
    click.echo(
        f"{r['launches']:,} launches in {r['messages']:,} messages "
        f"({wire}; {r['series']:,} series) -> {r['windows']} windows\n"
        f"worker path   {r['worker_ns_per_launch']:6.0f} ns/launch "
        f"({1e3 / r['worker_ns_per_launch']:.2f}M launches/s on one core)\n"
        f"  batch by batch {r['batch_by_batch_ns_per_launch']:6.0f} ns/launch (each batch "
        "windowed alone, its stream's windows closed after it): "
        f"{r['batch_by_batch_ns_per_launch'] / r['worker_ns_per_launch']:.2f}x the path's\n"
        f"zstd + orjson {r['ceiling_ns_per_launch']:6.0f} ns/launch\n"
        f"ratio (ceiling / worker) = {r['ratio']:.2f}"
    )
    if "zstd_ns_per_launch" in r:
        click.echo(
            f"zstd alone    {r['zstd_ns_per_launch']:6.1f} ns/launch (the binary ceiling's "
            "own work)\n"
            f"exact aggregates {r['aggregates_ns_per_launch']:6.1f} ns/launch (count, mean, "
            f"p95 of {r['aggregate_windows']:,} windows, grouped beforehand)\n"
            f"worker path / binary ceiling (zstd / worker) = {r['worker_vs_binary_ceiling']:.2f}; "
            "a worker doing nothing but the aggregates: "
            f"{r['bound_vs_binary_ceiling']:.2f}"
        )
    if agent:
        click.echo(agent_lines(r["agent"], r["messages"]))
        if "held_bytes" in r["agent"]:
            held = r["agent"]["held_bytes"]
            click.echo(
                f"  held after the input: {held / 2**20:.1f} MiB of Python memory, "
                f"{held / r['series']:,.0f} bytes a series; the compiled engine's index "
                f"keeps the per-batch fields of {r['agent']['metas_kept']:,} series"
            )
        if "agent_numpy" in r:
            click.echo(numpy_lines(r["agent"], r["agent_numpy"], r["messages"]))
        else:
            click.echo(f"  ({native.describe()})")
        if "findings" in r:
            click.echo(findings_lines(r["agent"], r["findings"], r["messages"]))
    if "columnar" in r:
        click.echo(columnar_lines(r))
    if profile:
        prof = cProfile.Profile()
        prof.runcall(_worker_pass, r["_messages"], r["_per_checkpoint"])
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        click.echo(out.getvalue())


def agent_lines(a: dict[str, Any], messages: int) -> str:
    """What :func:`agent_pass` measured, as ``bench pipeline-peers`` prints a live worker's
    window stage: microseconds per message by step, and per window for closing and
    publishing."""
    steps = ("decode", "window", "close", "emit")
    per_msg = ", ".join(f"{k} {a['stage_s'][k] / messages * 1e6:.1f}" for k in steps)
    windows = max(1, a["windows"])
    return (
        f"window agent  {a['ns_per_launch']:6.1f} ns/launch, {a['us_per_message']:.1f} us per "
        f"message ({a['windows']:,} windows, {a['findings']:,} findings published, "
        f"{a['dead_letters']} dead letters)\n"
        f"  by step, us per message: {per_msg} (per window: close "
        f"{a['stage_s']['close'] / windows * 1e6:.0f}, emit "
        f"{a['stage_s']['emit'] / windows * 1e6:.0f}); the rest of the total: the agent's "
        "bookkeeping between the steps"
    )


def findings_lines(a: dict[str, Any], f: dict[str, Any], messages: int) -> str:
    """What :func:`findings_pass` measured: microseconds per finding by stage, and the
    window agent and the findings stages together per message (the worker's every stage
    in one process, no broker)."""
    n = max(1, f["findings"])
    per = ", ".join(f"{k} {v / n * 1e6:.1f}" for k, v in f["stage_s"].items())
    both = (a["seconds"] + f["seconds"]) / messages * 1e6
    return (
        f"findings      {f['seconds'] / n * 1e6:.1f} us per finding over {f['findings']:,} "
        f"findings ({f['recommendations']:,} recommendations, {f['alerts']:,} alerts, "
        f"{f['dead_letters']} dead letters; the same in every round: "
        f"{'yes' if f['same_output'] else 'NO'}; "
        f"recommendations {f['recommendations_digest'][:12]})\n"
        f"  by stage, us per finding: {per} (decode: the reader's edge checks and the rest "
        "of its poll; tuner: its thread's work and the hand-over)\n"
        f"  every stage in one process: {both:.1f} us per message, the findings stages "
        f"{f['seconds'] / (a['seconds'] + f['seconds']):.0%} of it\n"
        f"  each finding's bookkeeping alone, us per finding (fresh state, no hand-over, "
        f"best of three): " + ", ".join(f"{k} {v / n * 1e6:.1f}" for k, v in f["calls_s"].items())
    )


def numpy_lines(a: dict[str, Any], n: dict[str, Any], messages: int) -> str:
    """The window agent with the compiled module (``a``: its steady streams windowed by the
    compiled engine, the rest with the compiled passes) beside the same agent without it
    (``n``, ``KERNELSTREAM_NATIVE=0``: the Python path with the NumPy passes), in the same
    rounds."""
    steps = ("decode", "close")
    per_msg = ", ".join(
        f"{k} {n['stage_s'][k] / messages * 1e6:.1f} -> {a['stage_s'][k] / messages * 1e6:.1f}"
        for k in steps
    )
    ratios = sorted(x / y for x, y in zip(n["rounds_s"], a["rounds_s"], strict=True))
    return (
        f"  without the compiled module (KERNELSTREAM_NATIVE=0: the Python path, NumPy "
        f"passes): {n['us_per_message']:.1f} us per "
        f"message; NumPy / compiled, round by round: median {statistics.median(ratios):.2f}x "
        f"({ratios[0]:.2f}-{ratios[-1]:.2f}); us per message, NumPy -> compiled: {per_msg}; "
        f"windows and findings published byte for byte the same: "
        f"{'yes' if n['same_windows'] else 'NO'}"
    )


def columnar_lines(r: dict[str, Any]) -> str:
    """What the columnar window stage measured, beside the window agent's decode, window
    and close steps when ``--agent`` ran too."""
    c = r["columnar"]
    text = (
        f"columnar      {c['ns_per_launch']:6.1f} ns/launch, {c['us_per_message']:.1f} us per "
        f"message (decode, checks, windows, aggregates of {c['windows']:,} windows, no "
        f"records); windows equal to the worker's: {c['windows_equal']:,} of "
        f"{c['worker_windows']:,}\n"
        f"  zstd / (zstd + columnar) = {c['vs_binary_ceiling']:.2f}"
    )
    if "agent" in r:
        a = r["agent"]
        steps = sum(a["stage_s"][k] for k in ("decode", "window", "close"))
        per_msg = steps / r["messages"] * 1e6
        text += (
            f"; the window agent's decode + window + close {per_msg:.1f} us per message: "
            f"{per_msg / c['us_per_message']:.2f}x the columnar stage's"
        )
    return text
