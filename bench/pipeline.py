"""``kernelstream bench pipeline``: worker throughput side by side with its ceiling and Faust.

One run, one broker it starts (embedded Tansu, or with ``--broker kafka`` one
Apache Kafka node), one pre-produced input (a synthetic fleet, see
:mod:`bench.pipeline_input`):

(a) ceiling   plain aiokafka consumer + ``orjson.loads`` of the same batched messages;
(b) naive     a per-record Faust agent updating a tumbling table (tutorial style),
              consuming the *same launches* one record per message (the first
              ``--naive-launches`` of them: a per-record producer's messages);
(c) worker    the real ``kernelstream worker`` process: launch records/s into windows;
(e) memory    worker RSS sampled during a sustained run at half of (c);
(f) ready     worker spawn -> first batch processed (input already waiting);
(d) latency   a live fleet at ``--latency-rate``: each launch's completion -> the node
              receiving the first recommendation its window led to, per hop, for
              each window setting in ``_LATENCY_CONFIGS``.

(a) and (c) alternate for ``--rounds`` rounds on the same topic (fresh consumer
groups) because the machine is shared; medians are reported with every round.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson

from kernelstream.agents.logic.detection import finding_id
from kernelstream.app.kafka.apache import KafkaCluster, kafka_version
from kernelstream.app.kafka.capabilities import probe
from kernelstream.app.kafka.embedded import EmbeddedBroker
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.bench.pipeline_input import (
    FleetSpec,
    LiveFleet,
    encoded,
    fleet_batches,
    per_record_messages,
    produce_messages,
    recent_t0,
)
from kernelstream.bench.pipeline_load import live_capacity, parse_loads
from kernelstream.bench.pipeline_procs import (
    WorkerProc,
    bench_settings,
    every_stage_done,
    every_stage_figures,
    pinned_cpus,
    running,
)
from kernelstream.bench.results import dated_stem
from kernelstream.schemas import Finding, Recommendation, WindowAggregate, decode

__all__ = ["command"]


async def _ceiling(
    bootstrap: str, topic: str, n_msgs: int, worker_zstd: bool = False
) -> dict[str, Any]:
    """aiokafka + orjson.loads of every message; ``worker_zstd``: with the worker's zstd
    decoder installed (:mod:`app.zstd_decode`) instead of aiokafka's own."""
    from aiokafka import AIOKafkaConsumer

    from kernelstream.app.kafka import zstd_decode

    if worker_zstd:
        zstd_decode.install()
    else:
        zstd_decode.uninstall()

    c = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=4 << 20,
        fetch_max_bytes=16 << 20,
    )
    await c.start()
    got = launches = 0
    t0 = t1 = 0.0
    try:
        while got < n_msgs:
            for msgs in (await c.getmany(timeout_ms=1000)).values():
                if not t0:
                    t0 = time.perf_counter()
                for m in msgs:
                    launches += len(orjson.loads(m.value)["t_end"])
                    got += 1
                t1 = time.perf_counter()
    finally:
        await c.stop()
        zstd_decode.uninstall()
    return {
        "messages": got,
        "launches": launches,
        "seconds": t1 - t0,
        "per_s": launches / (t1 - t0),
    }


def _worker_rate(st: dict[str, Any]) -> float:
    w = st["window"]
    return float(w["launches"] / (w["last_batch_at"] - w["first_batch_at"]))


async def _run_worker(
    settings: Any,
    log: Path,
    n: int,
    argv: list[str] | None = None,
    source: Path | None = None,
    every_stage: bool = False,
) -> dict:
    """One worker reads ``n`` launches; its window stage's rate and, with
    ``every_stage``, its rate per CPU second until its tuner and alert stages have taken
    every finding the window stage published (``every_stage_per_cpu_s``)."""
    w = WorkerProc(settings, log, argv, source)
    done: dict[str, float] = {}
    with running(w):
        # The rate comes from the worker's own first/last batch times, so polling its
        # stats page (which costs its event loop) need not be frequent.
        st = await w.wait_stats(
            lambda s: s["window"]["launches"] >= n, 600, "all launches", every_s=0.5
        )
        if every_stage:
            done = await every_stage_done(w, st["window"]["last_batch_at"])
        rss = w.rss_bytes()
    first = st["window"]["first_batch_at"]
    return {
        **every_stage_figures(st["window"], done),
        "launches": st["window"]["launches"],
        "seconds": st["window"]["last_batch_at"] - first,
        "per_s": _worker_rate(st),
        "ready_s": first - w.spawned_at,
        "assigned_s": (st["window"].get("assigned_at") or first) - w.spawned_at,
        "rss_bytes_end": rss,
        "load_avg": os.getloadavg(),
        "windows_per_s": st["window"].get("windows", 0) / (st["window"]["last_batch_at"] - first),
        "batches_per_s": st["window"].get("batches", 0) / (st["window"]["last_batch_at"] - first),
        "stage_ns_per_launch": {
            k: v / st["window"]["launches"] * 1e9
            for k, v in (st["window"].get("stage_s") or {}).items()
        },
        "stats": st,
    }


def _producer(settings: Any) -> Any:
    """The stand-in nodes' producer, compressing as nodes do (``compression_type``)."""
    from aiokafka import AIOKafkaProducer

    return AIOKafkaProducer(
        bootstrap_servers=str(settings.bootstrap),
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        compression_type=settings.producer_compression(),
    )


def _rss_of(pid: int | None) -> int | None:
    """Resident bytes of a process (psutil, as :meth:`WorkerProc.rss_bytes`), None if gone."""
    import psutil

    if pid is None:
        return None
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return None


async def _sustain(
    settings: Any, log: Path, rate: float, seconds: float, broker_pid: int | None = None
) -> dict[str, Any]:
    """Worker RSS over time while a real-time fleet publishes ``rate`` launches/s.

    The input is :class:`~bench.pipeline_input.LiveFleet` (pre-encoded messages
    re-sent with new event times), so the generator costs ~3% of a core per
    million launches/s and the rate is held unless the machine is saturated.
    """
    fleet = LiveFleet(rate, close_at_s=_close_at(settings))
    samples: list[dict[str, Any]] = []
    w = WorkerProc(settings, log)
    with running(w):
        await w.wait_stats(lambda s: s["window"]["assigned_at"] is not None, 60, "assignment")
        producer = _producer(settings)
        await producer.start()
        t_start = time.time()
        start_second = int(t_start) + 1

        async def sample(i: int) -> None:
            st = await asyncio.to_thread(w.stats) or {}
            win = st.get("window", {})
            samples.append(
                {
                    "t": time.time() - t_start,
                    "rss": w.rss_bytes(),
                    "broker_rss": _rss_of(broker_pid),
                    "open_windows": int(st.get("open_windows", -1)),
                    "consumed": int(win.get("launches", -1)),
                    "produced": (i + 1) * fleet.rate,
                    "load1": os.getloadavg()[0],
                }
            )

        try:
            produced = await fleet.run(
                producer, settings.topic_launches, start_second, int(seconds), sample
            )
        finally:
            await producer.stop()
        t_end = time.time()
        st = await w.wait_stats(lambda s: s["window"]["launches"] >= produced, 300, "catch-up")
        caught_up = time.time()
    elapsed = t_end - (start_second + 1.0 / fleet.per_s)
    warm = [s for s in samples if s["t"] >= min(60.0, elapsed * 0.2)]
    slope = _slope([(s["t"], s["rss"]) for s in warm]) if len(warm) > 2 else None
    lag = [s["produced"] - s["consumed"] for s in samples if s["consumed"] >= 0]
    return {
        "target_launches_per_s": rate,
        "generator_launches_per_s": fleet.rate,
        "launches_per_message": fleet.launches_per_message,
        "produced_launches": produced,
        "seconds": elapsed,
        "achieved_launches_per_s": produced / elapsed,
        "consumed_launches_per_s": st["window"]["launches"] / (caught_up - start_second),
        "catch_up_after_input_s": caught_up - t_end,
        "consumer_lag_launches_max": max(lag) if lag else None,
        "consumer_lag_launches_final_sample": lag[-1] if lag else None,
        "rss_after_warmup_bytes": warm[0]["rss"] if warm else None,
        "rss_final_bytes": samples[-1]["rss"] if samples else None,
        "rss_peak_bytes": max(s["rss"] for s in samples) if samples else None,
        "worker_maxrss_kib": st.get("maxrss_kib"),
        "rss_slope_bytes_per_min_after_warmup": slope * 60 if slope is not None else None,
        "compression_type": settings.compression_type,
        "broker_rss_final_bytes": samples[-1]["broker_rss"] if samples else None,
        "open_windows_final": samples[-1]["open_windows"] if samples else None,
        "open_windows_max": max(s["open_windows"] for s in samples) if samples else None,
        "load1_mean": statistics.mean(s["load1"] for s in samples) if samples else None,
        "samples": samples,
        "worker_final": st["window"],
    }


# A fleet that sends a batch later than this after its schedule has fallen behind.
_GENERATOR_BEHIND_S = 0.1


async def _latency(
    settings: Any, log: Path, rate: float, seconds: int, label: str, source: Path | None = None
) -> dict[str, Any]:
    """(d) launch completion -> the node receives the first resulting recommendation.

    A live fleet (every stream in completion order, batches sent when they close,
    as nodes send them, compressed before they are due) feeds a real worker; a
    consumer of the recommendations topic stands in for the nodes and notes when each
    recommendation arrives. For each (node, device, kernel) only the *first*
    recommendation counts: the tuner keeps one outstanding per kernel and the fleet
    never applies it, so later ones wait on expiries, not on the pipeline. That
    recommendation names its finding, whose id names the window it classified; every
    launch of that window has a latency ``received_at - t_end`` (same clock: the fleet
    and the consumer share the host).
    p50/p99 are over those launches; ``window_end_to_received`` is the pipeline
    delay after the window's last possible launch, one value per recommendation.

    Measured in steady state: a warm-up fleet (other node names) runs first until
    its own recommendations come back, so the Faust agents' group joins at worker
    start are not counted (start-up is (f)).
    """
    from aiokafka import AIOKafkaConsumer

    # The fetch wait of the consumer standing in for the nodes: the settings', else what
    # a node takes on this broker. The worker's own is left to the worker (a baseline
    # tree's worker keeps its default).
    node_wait = settings.for_broker(await probe(settings.bootstrap)).fetch_wait()

    load_start = os.getloadavg()
    fleet = LiveFleet(rate, close_at_s=_close_at(settings))
    w = WorkerProc(settings, log, source=source)
    received: dict[str, tuple[float, Any]] = {}
    published: dict[str, float] = {}  # window / "f:"finding / recommendation id -> create time
    with running(w):
        await w.wait_stats(lambda s: s["window"]["assigned_at"] is not None, 60, "assignment")
        consumer = AIOKafkaConsumer(
            settings.topic_recommendations,
            bootstrap_servers=settings.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=node_wait,  # as the node's inbox waits
        )
        await consumer.start()
        hops = AIOKafkaConsumer(
            settings.topic_windows,
            settings.topic_findings,
            bootstrap_servers=settings.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=node_wait,
        )
        await hops.start()
        producer = _producer(settings)
        await producer.start()

        async def listen() -> None:
            while True:
                for msgs in (await consumer.getmany(timeout_ms=50)).values():
                    at = time.time()
                    for m in msgs:
                        rec = decode(m.value, Recommendation)
                        k = f"{rec.node}:{rec.device_index}/{rec.kernel}"
                        if measuring and k.startswith("warmup"):
                            continue  # the warm-up fleet's, once measuring
                        if k not in received:
                            received[k] = (at, rec)
                            published[rec.id] = m.timestamp / 1000.0
                if len(received) >= len(fleet.streams):
                    all_in.set()

        async def follow() -> None:
            # When each window and finding was published (the records' create times,
            # stamped by the worker's producer): the hops between the stages.
            while True:
                for msgs in (await hops.getmany(timeout_ms=50)).values():
                    for m in msgs:
                        if m.topic == settings.topic_windows:
                            agg = decode(m.value, WindowAggregate)
                            published.setdefault(finding_id(agg), m.timestamp / 1000.0)
                        else:
                            f = decode(m.value, Finding)
                            published.setdefault("f:" + f.id, m.timestamp / 1000.0)

        all_in = asyncio.Event()
        measuring = False
        listener = asyncio.create_task(listen())
        follower = asyncio.create_task(follow())
        warm = LiveFleet(rate / 8, nodes=2, node_prefix="warmup", close_at_s=_close_at(settings))
        second = int(time.time()) + 1
        try:
            for _ in range(60):  # until the warm-up fleet's recommendations arrive
                await warm.run(producer, settings.topic_launches, second, 1)
                second += 1
                if any(k.startswith("warmup") for k in received):
                    break
            # The measured input is compressed before it is due (LiveFleet.prebuild): the
            # nodes compress on their machines, not on the cores of the worker measured.
            per_s = await fleet.build_time(producer, settings.topic_launches)
            start = int(time.time() + 1.3 * per_s * seconds) + 2
            plan = await fleet.prebuild(producer, settings.topic_launches, start, seconds)
            if time.time() > fleet.send_time(start, 0):
                raise RuntimeError("building the input took longer than planned")
            measuring = True
            received.clear()
            all_in.clear()
            # The clocks start at the first batch's send time, not before the wait for it.
            await asyncio.sleep(max(0.0, fleet.send_time(start, 0) - time.time()))
            cpu = _CpuShares(w)
            await fleet.replay(producer, settings.topic_launches, plan)
            del plan
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_in.wait(), 10)
            shares = cpu.cores()
            await asyncio.sleep(0.5)  # the hop follower catches up
        finally:
            listener.cancel()
            follower.cancel()
            await producer.stop()
            await consumer.stop()
            await hops.stop()
    per_launch: list[np.ndarray] = []
    after_end = []
    hop_names = ("node_batch", "to_window", "to_finding", "to_recommendation", "to_node")
    hop_values: dict[str, list[float]] = {h: [] for h in hop_names}
    slack = settings.out_of_orderness_s + settings.allowed_lateness_s
    for at, rec in received.values():
        fid = str(rec.evidence["finding_id"])
        ws = float(fid.rsplit("/", 1)[1])
        second = round(ws)
        per_launch.append(at - fleet.window_times(second))
        after_end.append(at - (second + settings.window_s))
        sent = fleet.sent_at.get(fleet.closing_batch(second, settings.window_s, slack))
        times = (
            second + settings.window_s,
            sent,
            published.get(fid),
            published.get("f:" + fid),
            published.get(rec.id),
            at,
        )
        for h, t0, t1 in zip(hop_names, times, times[1:], strict=False):
            if t0 is not None and t1 is not None:
                hop_values[h].append(t1 - t0)
    lat = np.concatenate(per_launch) if per_launch else np.empty(0)
    # How late the fleet sent its batches against their schedule: a generator that
    # falls behind (it shares the machine's cores with the broker and the worker) adds
    # its own delay to every launch, which is the machine's, not the worker's.
    behind = [at - fleet.send_time(*sj) for sj, at in fleet.sent_at.items()]
    return {
        "label": label,
        "generator_behind_s": {
            "p50": float(np.percentile(behind, 50)) if behind else None,
            "max": float(max(behind)) if behind else None,
        },
        "window_s": settings.window_s,
        "out_of_orderness_s": settings.out_of_orderness_s,
        "allowed_lateness_s": settings.allowed_lateness_s,
        "fetch_max_wait_ms": settings.fetch_max_wait_ms,  # None: the broker's
        "node_fetch_wait_ms": node_wait,
        "node_batch_delay_s": 1.0 / fleet.per_s,
        "node_batches_per_s": len(fleet.slices),
        "node_flush_at_close_s": _close_at(settings),
        "rate_launches_per_s": fleet.rate,
        "streams": len(fleet.streams),
        "recommendations": len(received),
        "launches_measured": int(lat.size),
        "p50_s": float(np.percentile(lat, 50)) if lat.size else None,
        "p99_s": float(np.percentile(lat, 99)) if lat.size else None,
        "max_s": float(lat.max()) if lat.size else None,
        "window_end_to_received_p50_s": float(np.percentile(after_end, 50)) if after_end else None,
        "window_end_to_received_p99_s": float(np.percentile(after_end, 99)) if after_end else None,
        "hops_s": {
            h: {
                "p50": float(np.percentile(v, 50)),
                "p99": float(np.percentile(v, 99)),
                "max": float(max(v)),
                "n": len(v),
            }
            for h, v in hop_values.items()
            if v
        },
        "hops_definition": (
            "per first recommendation: node_batch = window end -> the node sends the batch "
            "that closes it (batching delay + watermark slack); to_window = that send -> the "
            "window's record is published (broker, fetch wait, window agent); to_finding = "
            "window -> finding published (detector hop); to_recommendation = finding -> "
            "recommendation published (tuner hop); to_node = recommendation published -> "
            "received by the node's consumer (record create times, ms resolution)"
        ),
        "target_p99_s": settings.window_s + 1.0,
        "cores": shares,
        "load_avg_start": load_start,
        "load_avg_end": os.getloadavg(),
        "met": bool(lat.size and np.percentile(lat, 99) <= settings.window_s + 1.0),
    }


class _CpuShares:
    """Cores (CPU seconds per second) the measured worker, this process (the fleet and
    the recommendation consumers) and everything else (the broker, mostly) used from
    now to :meth:`cores`, and the machine's cores: on a machine the three share, a
    worker given less than it needs falls behind whatever its own speed."""

    def __init__(self, w: WorkerProc) -> None:
        import psutil

        self._psutil = psutil
        self._worker = psutil.Process(w.proc.pid) if w.proc is not None else None
        self._me = psutil.Process()
        self._at = time.monotonic(), self._cpu()

    def _cpu(self) -> tuple[float, float, float]:
        t = self._psutil.cpu_times()
        busy = t.user + t.system + t.nice + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        worker = sum(self._worker.cpu_times()[:2]) if self._worker is not None else 0.0
        return busy, worker, sum(self._me.cpu_times()[:2])

    def cores(self) -> dict[str, float]:
        t0, (busy0, worker0, me0) = self._at
        busy, worker, me = self._cpu()
        dt = time.monotonic() - t0
        return {
            "worker": (worker - worker0) / dt,
            "fleet": (me - me0) / dt,
            "other": max(0.0, (busy - busy0) - (worker - worker0) - (me - me0)) / dt,
            "machine": float(self._psutil.cpu_count() or 1),
        }


def _close_at(settings: Any) -> float | None:
    """Where in each second the nodes send their open batches (a worker window closes)."""
    if settings.window_s != 1.0:
        return None
    return float(settings.out_of_orderness_s + settings.allowed_lateness_s) % 1.0


def _slope(points: list[tuple[float, int]]) -> float:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points) or 1.0
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den


def _run_on(engine: str, opts: dict[str, Any]) -> dict[str, Any]:
    """One whole run on a fresh broker of ``engine``."""
    with (
        pinned_cpus(bool(opts.get("pin_worker"))) as pinned,
        tempfile.TemporaryDirectory(prefix="ks-bench-") as tmp,
        _broker(engine, Path(tmp)) as broker,
    ):
        result = asyncio.run(_bench(opts, Path(tmp), broker))
    result["options"] = opts
    result["cpus"] = pinned
    result["broker"] = engine if engine == "tansu" else f"kafka {kafka_version()}"
    return result


_HEADLINES = (
    ("(a) ceiling, launches/s", ("ceiling_a", "median_per_s"), ",.0f"),
    ("(b) naive Faust, launches/s", ("naive_b", "per_s"), ",.0f"),
    ("(c) worker, launches/s", ("worker_c", "median_per_s"), ",.0f"),
    ("(c)/(a)", ("ratios", "c_over_a"), ".2f"),
    ("(f) ready, s", ("ready_f", "median_s"), ".2f"),
    ("(e) worker RSS peak, MiB", ("memory_e", "rss_peak_bytes"), "mib"),
)


def _side_by_side(results: dict[str, dict[str, Any]]) -> str:
    """The headline figures of each broker's run in one table (Markdown)."""
    names = list(results)
    lines = [
        "| figure | " + " | ".join(results[n]["broker"] for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for label, (section, key), fmt in _HEADLINES:
        cells = []
        for n in names:
            value = results[n].get(section, {}).get(key)
            if value is None:
                cells.append("-")
            elif fmt == "mib":
                cells.append(f"{value / 2**20:,.0f}")
            else:
                cells.append(format(value, fmt))
        if any(c != "-" for c in cells):
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    # (d): p50 / p99 of each latency phase, by its label (setting and load)
    phases = {n: {d["label"]: d for d in results[n].get("latency_d") or []} for n in names}
    for label in dict.fromkeys(k for n in names for k in phases[n]):
        cells = [
            f"{d['p50_s']:.2f} / {d['p99_s']:.2f}" if (d := phases[n].get(label)) else "-"
            for n in names
        ]
        lines.append(f"| latency p50 / p99 s, {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _broker(engine: str, run_dir: Path) -> EmbeddedBroker | KafkaCluster:
    """The run's own broker: embedded Tansu, or one Apache Kafka node (1 GiB heap)."""
    if engine == "tansu":
        return EmbeddedBroker(run_dir)
    return KafkaCluster(run_dir, nodes=1, heap="-Xmx1g")


async def _bench(
    opts: dict[str, Any], run_dir: Path, broker: EmbeddedBroker | KafkaCluster
) -> dict[str, Any]:
    fleet = FleetSpec(
        nodes=opts.get("nodes", 16),
        launches_per_s_per_kernel=opts.get("rate_per_kernel", 20_000.0),
        seconds=opts["input_s"],
        max_launches=opts["batch"],
        t0=recent_t0(opts["input_s"]),
    )
    out: dict[str, Any] = {"date": dt.date.today().isoformat(), "load_avg_start": os.getloadavg()}
    if broker.running and opts["latency_only"]:
        out["latency_d"] = await _latency_phases(opts, run_dir, broker)
    elif broker.running:
        bs = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
        await ensure_topics(bs, broker.bootstrap)
        batches = list(fleet_batches(fleet))
        items = encoded(batches)
        n = sum(len(b.t_end) for b in batches)
        await produce_messages(
            broker.bootstrap, bs.topic_launches, items, compression_type=bs.producer_compression()
        )
        out["input"] = {
            "fleet": fleet.__dict__,
            "messages": len(items),
            "launches": n,
            "bytes": sum(len(v) for _, v in items),
            "launches_per_message_mean": n / len(items),
            "compression_type": bs.compression_type,
        }
        ceil, ceil_fast, work = [], [], []
        for r in range(opts["rounds"]):
            ceil.append(await _ceiling(broker.bootstrap, bs.topic_launches, len(items)))
            ceil_fast.append(
                await _ceiling(broker.bootstrap, bs.topic_launches, len(items), worker_zstd=True)
            )
            s = bs.model_copy(update={"app_id": f"{bs.app_id}-r{r}", "web_port": _port()})
            work.append(await _run_worker(s, run_dir / f"worker-{r}.log", n))
            click.echo(
                f"round {r}: ceiling {ceil[-1]['per_s']:,.0f}/s worker {work[-1]['per_s']:,.0f}/s",
                err=True,
            )
        # (b) the same launches, one per message, from the start of the input.
        naive_n = min(opts["naive_launches"], n)
        ns = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
        await ensure_topics(ns, broker.bootstrap)
        recs: list[tuple[bytes, bytes]] = []
        for b in batches:
            key = b.stream_key.encode()
            recs.extend((key, v) for v in per_record_messages(b))
            if len(recs) >= naive_n:
                break
        recs = recs[:naive_n]
        await produce_messages(
            broker.bootstrap, ns.topic_launches, recs, compression_type=ns.producer_compression()
        )
        naive = await _run_worker(
            ns,
            run_dir / "naive.log",
            naive_n,
            [sys.executable, "-m", "kernelstream.bench.pipeline_naive"],
        )
        out["ceiling_a"] = {
            "median_per_s": statistics.median(c["per_s"] for c in ceil),
            "rounds": ceil,
            "consumes": "the batched input messages (all of them), aiokafka + orjson.loads",
        }
        out["ceiling_a_worker_zstd"] = {
            "median_per_s": statistics.median(c["per_s"] for c in ceil_fast),
            "rounds": ceil_fast,
            "consumes": "as (a), with the worker's zstd decoder (app/kafka/) in aiokafka",
        }
        out["worker_c"] = {
            "median_per_s": statistics.median(w["per_s"] for w in work),
            "rounds": [{k: v for k, v in w.items() if k != "stats"} for w in work],
            "last_stats": work[-1]["stats"],
            "consumes": "the batched input messages (all of them): the real kernelstream worker",
        }
        out["naive_b"] = {
            "per_s": naive["per_s"],
            "launches": naive_n,
            "seconds": naive["seconds"],
            "consumes": "the first launches of the same input, one launch per message",
        }
        out["ready_f"] = {
            "median_s": statistics.median(w["ready_s"] for w in work),
            "rounds_s": [w["ready_s"] for w in work],
            "load1_rounds": [w["load_avg"][0] for w in work],
            "definition": "worker process spawn -> first launch batch processed (input waiting)",
        }
        c, a, b = out["worker_c"]["median_per_s"], out["ceiling_a"]["median_per_s"], naive["per_s"]
        a2 = out["ceiling_a_worker_zstd"]["median_per_s"]
        out["ratios"] = {"c_over_a": c / a, "c_over_b": c / b, "c_over_a_worker_zstd": c / a2}
        if opts["latency_s"] > 0:
            out["latency_d"] = await _latency_phases(opts, run_dir, broker)
        if opts["sustain_s"] > 0:
            ss = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
            await ensure_topics(ss, broker.bootstrap)
            rate = opts["sustain_rate"] or c / 2
            out["memory_e"] = await _sustain(
                ss, run_dir / "sustain.log", rate, opts["sustain_s"], broker.pid
            )
    out["load_avg_end"] = os.getloadavg()
    return out


# (label, out_of_orderness_s, allowed_lateness_s, fetch_max_wait_ms): the defaults
# (None: from Settings), the watermark settings before 2026-11-22 with the old fetch
# waits' stand-in (500 ms; Faust's own consumer now also follows the setting), and no
# watermark slack at all (streams each node sends in completion order).
_LATENCY_CONFIGS: tuple[tuple[str, float | None, float | None, int | None], ...] = (
    ("defaults", None, None, None),
    ("old-window", 0.2, 0.5, None),
    ("in-order", 0.0, 0.0, None),
)


async def _latency_phases(
    opts: dict[str, Any], run_dir: Path, broker: EmbeddedBroker | KafkaCluster
) -> list[dict[str, Any]]:
    """The latency phases (d): per window setting, at ``--latency-rate`` or, with
    ``--latency-load``, at those fractions of the capacity measured first (same run)."""
    loads = parse_loads(opts.get("latency_load"))
    baseline = opts.get("baseline_source")
    rates: list[tuple[float, float | None]] = [(opts["latency_rate"], None)]
    capacity = None
    if loads:
        cs = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
        await ensure_topics(cs, broker.bootstrap)
        capacity = await live_capacity(
            cs, run_dir, _run_worker, opts["capacity_s"], opts["capacity_rounds"], baseline
        )
        click.echo(
            f"capacity {capacity['median_per_s']:,.0f} launches/s (rounds "
            + ", ".join(f"{x:,.0f}" for x in capacity["rounds_per_s"])
            + ")",
            err=True,
        )
        rates = [(f * capacity["median_per_s"], f) for f in loads]
    out = []
    for label, ooo, lateness, wait_ms in _LATENCY_CONFIGS:
        sources = [baseline, None] if baseline else [None]
        for (rate, load), source in itertools.product(rates, sources):
            config = (ooo, lateness, wait_ms)
            r = await _latency_phase(opts, run_dir, broker, label, config, rate, source)
            if not r:
                continue
            if load is not None and capacity is not None:
                r["label"] = f"{label}@{load:.0%}" + (" baseline" if source else "")
                r["worker_source"] = str(source) if source else None
                r["load_fraction"] = load
                r["capacity"] = capacity
            click.echo(
                f"latency {r['label']}: p50 {r['p50_s']} p99 {r['p99_s']} "
                f"({r['recommendations']} recs); {_hops_text(r.get('hops_s') or {})}",
                err=True,
            )
            out.append(r)
    return out


async def _latency_phase(
    opts: dict[str, Any],
    run_dir: Path,
    broker: EmbeddedBroker | KafkaCluster,
    label: str,
    config: tuple[float | None, float | None, int | None],
    rate: float,
    source: Path | None = None,
) -> dict[str, Any]:
    """One latency phase of window setting ``label`` at ``rate`` ({} if not selected);
    ``source``: the worker of that source tree instead of this one."""
    if opts.get("latency_configs") and label not in opts["latency_configs"]:
        return {}
    ooo, lateness, wait_ms = config
    given = {
        "out_of_orderness_s": ooo,
        "allowed_lateness_s": lateness,
        "fetch_max_wait_ms": wait_ms,
    }
    ls = bench_settings(
        broker.bootstrap,
        run_dir / "state",
        window_s=1.0,
        **{k: v for k, v in given.items() if v is not None},
    )
    await ensure_topics(ls, broker.bootstrap)
    log = run_dir / f"latency-{label}-{rate:.0f}{'-base' if source else ''}.log"
    return await _latency(ls, log, rate, opts["latency_s"], label, source)


def _wait_text(d: dict[str, Any]) -> str:
    """A phase's fetch wait as its line says it: the settings', or the broker's."""
    given = d.get("fetch_max_wait_ms")
    if given is not None:
        return f"{given} ms"
    node = d.get("node_fetch_wait_ms")
    return "the broker's" + (f", {node} ms at the nodes" if node is not None else "")


def _port() -> int:
    from kernelstream.app.kafka.embedded import free_port

    return free_port()


def _table(r: dict[str, Any]) -> str:
    lines = [
        f"kernelstream bench pipeline  {r['date']}  broker {r.get('broker', 'tansu')}  "
        f"load avg start {r['load_avg_start']}"
    ]
    if r.get("cpus"):
        lines.append(
            f"worker processes pinned to CPU {r['cpus']['worker']}, the broker and the fleet "
            f"to CPU {r['cpus']['others']}"
        )
    if "input" in r:
        lines += _throughput_lines(r)
    m = r.get("memory_e")
    if m:
        lines.append(
            f"(e) sustained {m['seconds']:.0f} s at {m['achieved_launches_per_s']:,.0f}/s "
            f"(target {m['target_launches_per_s']:,.0f}/s, worker consumed "
            f"{m['consumed_launches_per_s']:,.0f}/s, mean load1 {m['load1_mean']:.1f}): "
            f"RSS after warmup {m['rss_after_warmup_bytes'] / 2**20:.0f} MiB, peak "
            f"{m['rss_peak_bytes'] / 2**20:.0f} MiB, final {m['rss_final_bytes'] / 2**20:.0f} MiB, "
            f"slope {(m['rss_slope_bytes_per_min_after_warmup'] or 0) / 2**20:.2f} MiB/min, "
            f"open windows max {m['open_windows_max']}; broker ({m.get('compression_type')} "
            f"batches) {(m.get('broker_rss_final_bytes') or 0) / 2**30:.1f} GiB at the end"
        )
    for d in r.get("latency_d") or []:
        p50, p99 = d["p50_s"], d["p99_s"]
        if "capacity" in d and d is next(x for x in r["latency_d"] if "capacity" in x):
            lines.append(_capacity_text(d["capacity"]))
        lines.append(
            f"(d) latency {d['label']:<11} (ooo {d['out_of_orderness_s']} s, lateness "
            f"{d['allowed_lateness_s']} s, fetch wait {_wait_text(d)}): "
            "launch -> recommendation p50 "
            f"{p50 if p50 is None else f'{p50:.3f}'} s, p99 "
            f"{p99 if p99 is None else f'{p99:.3f}'} s at {d['rate_launches_per_s']:,.0f}/s"
            + (f" ({d['load_fraction']:.0%} of capacity)" if "load_fraction" in d else "")
            + f" over {d['launches_measured']:,} launches "
            f"of {d['recommendations']} first recommendations; target p99 <= "
            f"{d['target_p99_s']} s: {'met' if d['met'] else 'NOT met'}"
            + (
                f" (load1 {d['load_avg_start'][0]:.1f} -> {d['load_avg_end'][0]:.1f})"
                if "load_avg_end" in d
                else ""
            )
        )
        if d.get("hops_s"):
            lines.append("    after window end, p50/p99 s: " + _hops_text(d["hops_s"]))
        c = d.get("cores")
        if c:
            lines.append(
                f"    cores used while measured: worker {c['worker']:.2f}, fleet "
                f"{c['fleet']:.2f}, the rest (broker) {c['other']:.2f}, of {c['machine']:.0f}"
            )
        behind = d.get("generator_behind_s", {})
        if behind.get("max") is not None:
            lines.append(
                f"    the fleet sent its batches {behind['p50']:.3f} s (p50), "
                f"{behind['max']:.3f} s (max) after their schedule"
                + (
                    ": it fell behind, so this phase's latency includes the machine's "
                    "shared cores, not only the worker"
                    if behind["max"] > _GENERATOR_BEHIND_S
                    else ""
                )
            )
    lines.append(f"load avg end {r['load_avg_end']}")
    return "\n".join(lines)


def _capacity_text(c: dict[str, Any]) -> str:
    text = (
        f"(d) capacity  {c['median_per_s']:,.0f} launches per CPU second through every stage, "
        "median of "
        + ", ".join(f"{x:,.0f}" for x in c["rounds_per_s"])
        + f" (load1 {', '.join(f'{x:.1f}' for x in c['load1_rounds'])}; {c['messages']:,} "
        f"messages of {c['launches_per_message']} launches from {c['streams']} streams, read "
        "as a backlog); the latency phases below run at fractions of it"
    )
    if "window_stage_median_per_s" in c:
        text += (
            f"\n    the window stage alone to its last batch: "
            f"{c['window_stage_median_per_s']:,.0f} launches/s (median of "
            + ", ".join(f"{x:,.0f}" for x in c["window_stage_rounds_per_s"])
            + ")"
        )
    b = c.get("baseline")
    if b:
        text += (
            f"\n    baseline worker ({b['source']}), alternating rounds: "
            f"{b['median_per_s']:,.0f} launches per CPU second through every stage, median of "
            + ", ".join(f"{x:,.0f}" for x in b["rounds_per_s"])
            + f"; this worker / baseline = {c['median_per_s'] / b['median_per_s']:.2f}"
        )
    return text


def _hops_text(hops: dict[str, dict[str, float]]) -> str:
    return ", ".join(f"{h} {v['p50']:.3f}/{v['p99']:.3f}" for h, v in hops.items())


def _per_stream_text(r: dict[str, Any]) -> str:
    rounds = r["worker_c"]["rounds"]
    if not rounds or "windows_per_s" not in rounds[0]:
        return ""
    w = statistics.median(x["windows_per_s"] for x in rounds)
    b = statistics.median(x["batches_per_s"] for x in rounds)
    return f" ({w:,.0f} windows/s, {b:,.0f} batches/s)"


def _stage_lines(r: dict[str, Any]) -> list[str]:
    """ns per launch of the ceiling and of each stage of the worker's loop, per round."""
    out = []
    for i, (a, c) in enumerate(zip(r["ceiling_a"]["rounds"], r["worker_c"]["rounds"], strict=True)):
        stages = c.get("stage_ns_per_launch") or {}
        out.append(
            f"    round {i}: (a) {1e9 / a['per_s']:.0f} ns/launch, (c) {1e9 / c['per_s']:.0f}"
            " = " + " + ".join(f"{k} {v:.0f}" for k, v in stages.items())
        )
    return out


def _worker_zstd_lines(r: dict[str, Any]) -> list[str]:
    """(a) again with the worker's zstd decoder in aiokafka, and (c) against that."""
    a2 = r.get("ceiling_a_worker_zstd")
    if not a2:
        return []
    return [
        f"(a') ceiling with the worker's zstd decoder {a2['median_per_s']:,.0f} launches/s: "
        f"(c)/(a') = {r['ratios']['c_over_a_worker_zstd']:.2f}"
    ]


def _throughput_lines(r: dict[str, Any]) -> list[str]:
    return [
        f"input: {r['input']['messages']} messages, {r['input']['launches']:,} launches "
        f"from {r['input']['fleet']['nodes']} nodes x 4 kernels at "
        f"{r['input']['fleet']['launches_per_s_per_kernel']:,.0f} launches/s each "
        f"({r['input']['launches_per_message_mean']:.0f} per message, "
        f"{r['input'].get('compression_type', 'none')}-compressed batches)",
        f"(a) ceiling  aiokafka+orjson  {r['ceiling_a']['median_per_s']:>14,.0f} launches/s",
        f"(b) naive    Faust per-record {r['naive_b']['per_s']:>14,.0f} launches/s",
        f"(c) worker   kernelstream     {r['worker_c']['median_per_s']:>14,.0f} launches/s"
        + _per_stream_text(r),
        f"(c)/(a) = {r['ratios']['c_over_a']:.2f}   (c)/(b) = {r['ratios']['c_over_b']:.0f}x",
        *_worker_zstd_lines(r),
        *_stage_lines(r),
        f"(f) ready    {r['ready_f']['median_s']:.2f} s (rounds "
        + ", ".join(f"{x:.2f}" for x in r["ready_f"]["rounds_s"])
        + "; load1 "
        + ", ".join(f"{x:.1f}" for x in r["ready_f"].get("load1_rounds", []))
        + ")",
    ]


def _pin_option(value: bool) -> bool:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    if value and cpus < 2:
        raise click.BadParameter(
            f"needs at least 2 CPUs this process may run on; it may run on {cpus}"
        )
    return value


def _loads_option(value: str | None) -> str | None:
    try:
        parse_loads(value)
    except ValueError as ex:
        raise click.BadParameter(str(ex)) from None
    return value


@click.command(name="pipeline")
@click.option("--json", "json_path", type=click.Path(path_type=Path), required=True)
@click.option(
    "--input-s",
    type=float,
    default=12.0,
    show_default=True,
    help="Event-time seconds of fleet telemetry to pre-produce (16 nodes x 4 kernels; "
    "12 s is 15.4M launches, ~5 s of the worker at full speed).",
)
@click.option(
    "--batch", type=int, default=2000, show_default=True, help="Node max launches per batch."
)
@click.option(
    "--nodes",
    type=int,
    default=16,
    show_default=True,
    help="Nodes of the pre-produced fleet (4 kernels each: 4 x nodes streams).",
)
@click.option(
    "--rate-per-kernel",
    type=float,
    default=20_000.0,
    show_default=True,
    help="Launches/s of each kernel of each node in the pre-produced fleet (batches close at "
    "--batch launches or 0.1 s: 1,000/s gives 100-launch batches and 1,000-launch windows, "
    "which measures the worker's per-batch and per-window costs).",
)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--naive-launches", type=int, default=40_000, show_default=True)
@click.option("--sustain-s", type=float, default=600.0, show_default=True)
@click.option(
    "--sustain-rate",
    type=float,
    default=None,
    help="Launches/s of the sustained run (default: half the measured worker throughput).",
)
@click.option("--latency-s", type=int, default=12, show_default=True, help="Live input per config.")
@click.option("--latency-rate", type=float, default=128_000.0, show_default=True)
@click.option(
    "--latency-load",
    default=None,
    callback=lambda _ctx, _p, v: _loads_option(v),
    help="Fractions of capacity, e.g. 0.1,0.5,0.9: measure the worker's capacity (launches "
    "per CPU second through every stage) on the live fleet's messages first, then run each "
    "latency phase at those fractions of it (instead of --latency-rate).",
)
@click.option(
    "--capacity-s",
    type=int,
    default=2,
    show_default=True,
    help="Event-time seconds of the capacity round's input (6.4M launches each).",
)
@click.option("--capacity-rounds", type=int, default=3, show_default=True)
@click.option(
    "--baseline-source",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="With --latency-load: also run the worker of this source tree (a checkout), "
    "round by round and phase by phase beside this one, at the same rates.",
)
@click.option("--latency-only", is_flag=True, help="Only the latency phases (d).")
@click.option(
    "--pin-worker",
    is_flag=True,
    callback=lambda _ctx, _p, v: _pin_option(v),
    help="Run the worker processes on the machine's last CPU alone and the broker and the "
    "fleet on the others, as a worker deployed with a core of its own runs.",
)
@click.option(
    "--latency-config",
    "latency_configs",
    multiple=True,
    type=click.Choice([c[0] for c in _LATENCY_CONFIGS]),
    help="Latency phases to run (repeatable; default all).",
)
@click.option("--results-dir", type=click.Path(path_type=Path), default=Path("bench/results"))
@click.option(
    "--broker",
    "engine",
    type=click.Choice(["tansu", "kafka", "both"]),
    default="tansu",
    show_default=True,
    help="The broker the run starts: embedded Tansu, single-node Apache Kafka (needs Java), "
    "or both one after the other (one results file, side by side).",
)
def command(
    json_path: Path,
    input_s: float,
    batch: int,
    nodes: int,
    rate_per_kernel: float,
    rounds: int,
    naive_launches: int,
    sustain_s: float,
    sustain_rate: float | None,
    latency_s: int,
    latency_rate: float,
    latency_load: str | None,
    capacity_s: int,
    capacity_rounds: int,
    baseline_source: Path | None,
    latency_only: bool,
    pin_worker: bool,
    latency_configs: tuple[str, ...],
    results_dir: Path,
    engine: str,
) -> None:
    """Worker throughput vs its ceiling and a naive Faust agent; memory; start-to-ready."""
    opts = {
        "input_s": input_s,
        "batch": batch,
        "nodes": nodes,
        "rate_per_kernel": rate_per_kernel,
        "rounds": rounds,
        "naive_launches": naive_launches,
        "sustain_s": sustain_s,
        "sustain_rate": sustain_rate,
        "latency_s": latency_s,
        "latency_rate": latency_rate,
        "latency_load": latency_load,
        "capacity_s": capacity_s,
        "capacity_rounds": capacity_rounds,
        "baseline_source": baseline_source,
        "latency_only": latency_only,
        "pin_worker": pin_worker,
        "latency_configs": list(latency_configs),
    }
    engines = ["tansu", "kafka"] if engine == "both" else [engine]
    results = {e: _run_on(e, opts) for e in engines}
    if engine == "both":
        result = {"date": results["tansu"]["date"], "brokers": results, "options": opts}
        table = _side_by_side(results) + "\n\n" + "\n\n".join(map(_table, results.values()))
    else:
        result = results[engine]
        table = _table(result)
    click.echo(table)
    text = json.dumps(result, indent=1, default=str)
    name = "pipeline-latency" if latency_only else "pipeline"
    name += {"tansu": "", "kafka": "-kafka", "both": "-brokers"}[engine]
    stem = write_results(results_dir, name, result["date"], text, table, json_path)
    click.echo(f"wrote {stem}.json and {stem}.txt", err=True)


def write_results(
    results_dir: Path, name: str, date: str, text: str, table: str, json_path: Path
) -> Path:
    """The run's JSON ``text`` and ``table`` as the next dated copy of ``name`` under
    ``results_dir``, and the JSON at ``json_path``; returns the copy's stem.

    The dated copy is chosen first, so a ``json_path`` that names it (the docs suggest
    ``bench/results/pipeline-<date>.json``) is that copy, not a second one numbered after it.
    """
    stem = dated_stem(results_dir, name, date)
    Path(f"{stem}.json").write_text(text)
    Path(f"{stem}.txt").write_text(table + "\n")
    if json_path.resolve() != Path(f"{stem}.json").resolve():
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text)
    return stem
