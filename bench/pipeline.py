"""``kernelstream bench pipeline``: worker throughput side by side with its ceiling and Faust.

One run, one embedded broker, one pre-produced input (a synthetic fleet, see
:mod:`bench.pipeline_input`):

(a) ceiling   plain aiokafka consumer + ``orjson.loads`` of the same batched messages;
(b) naive     a per-record Faust agent updating a tumbling table (tutorial style),
              consuming the *same launches* one record per message (the first
              ``--naive-launches`` of them: a per-record producer's messages);
(c) worker    the real ``kernelstream worker`` process: launch records/s into windows;
(e) memory    worker RSS sampled during a sustained run at half of (c);
(f) ready     worker spawn -> first batch processed (input already waiting).
(d) end-to-end latency is not measured by this version (reported as null).

(a) and (c) alternate for ``--rounds`` rounds on the same topic (fresh consumer
groups) because the machine is shared; medians are reported with every round.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import orjson

from app.broker import EmbeddedBroker
from app.topics import ensure_topics
from bench.pipeline_input import (
    FleetSpec,
    encoded,
    fleet_batches,
    per_record_messages,
    produce_messages,
)
from bench.pipeline_procs import WorkerProc, bench_settings, running

__all__ = ["command"]


async def _ceiling(bootstrap: str, topic: str, n_msgs: int) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer

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
    return {
        "messages": got,
        "launches": launches,
        "seconds": t1 - t0,
        "per_s": launches / (t1 - t0),
    }


def _worker_rate(st: dict[str, Any]) -> float:
    w = st["window"]
    return float(w["launches"] / (w["last_batch_at"] - w["first_batch_at"]))


async def _run_worker(settings: Any, log: Path, n: int, argv: list[str] | None = None) -> dict:
    w = WorkerProc(settings, log, argv)
    with running(w):
        st = await w.wait_stats(lambda s: s["window"]["launches"] >= n, 600, "all launches")
        rss = w.rss_bytes()
    first = st["window"]["first_batch_at"]
    return {
        "launches": st["window"]["launches"],
        "seconds": st["window"]["last_batch_at"] - first,
        "per_s": _worker_rate(st),
        "ready_s": first - w.spawned_at,
        "assigned_s": (st["window"].get("assigned_at") or first) - w.spawned_at,
        "rss_bytes_end": rss,
        "stats": st,
    }


async def _sustain(settings: Any, log: Path, rate: float, seconds: float, fleet: FleetSpec):
    """Worker RSS over time while a real-time fleet publishes ``rate`` launches/s."""
    from aiokafka import AIOKafkaProducer

    per_kernel = rate / (fleet.nodes * 4)
    spec = FleetSpec(
        nodes=fleet.nodes,
        launches_per_s_per_kernel=per_kernel,
        seconds=seconds,
        max_launches=fleet.max_launches,
        max_delay_s=fleet.max_delay_s,
        t0=time.time() + 6.0,
    )
    samples: list[tuple[float, int, int]] = []
    w = WorkerProc(settings, log)
    produced = 0
    with running(w):
        await w.wait_stats(lambda s: s["window"]["assigned_at"] is not None, 60, "assignment")
        producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap, linger_ms=5, max_request_size=8 << 20
        )
        await producer.start()
        t_start = time.time()
        next_sample = t_start
        try:
            for b in fleet_batches(spec):
                wait = b.t_end[-1] - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                k, v = encoded([b])[0]
                await producer.send(settings.topic_launches, v, key=k)
                produced += len(b.t_end)
                if time.time() >= next_sample:
                    st = await asyncio.to_thread(w.stats) or {}
                    samples.append(
                        (time.time() - t_start, w.rss_bytes(), int(st.get("open_windows", -1)))
                    )
                    next_sample += 1.0
        finally:
            await producer.stop()
        st = await w.wait_stats(lambda s: s["window"]["launches"] >= produced, 120, "catch-up")
    elapsed = samples[-1][0] if samples else 0.0
    warm = [s for s in samples if s[0] >= min(60.0, elapsed * 0.2)]
    slope = _slope([(s[0], s[1]) for s in warm]) if len(warm) > 2 else None
    return {
        "target_launches_per_s": rate,
        "produced_launches": produced,
        "seconds": elapsed,
        "achieved_launches_per_s": produced / elapsed if elapsed else None,
        "rss_after_warmup_bytes": warm[0][1] if warm else None,
        "rss_final_bytes": samples[-1][1] if samples else None,
        "rss_peak_bytes": max(s[1] for s in samples) if samples else None,
        "rss_slope_bytes_per_min_after_warmup": slope * 60 if slope is not None else None,
        "open_windows_final": samples[-1][2] if samples else None,
        "samples_t_rss_openwindows": samples,
        "worker_final": st["window"],
    }


def _slope(points: list[tuple[float, int]]) -> float:
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    den = sum((p[0] - mx) ** 2 for p in points) or 1.0
    return sum((p[0] - mx) * (p[1] - my) for p in points) / den


async def _bench(opts: dict[str, Any], run_dir: Path, broker: EmbeddedBroker) -> dict[str, Any]:
    fleet = FleetSpec(seconds=opts["input_s"], max_launches=opts["batch"])
    out: dict[str, Any] = {"date": dt.date.today().isoformat(), "load_avg_start": os.getloadavg()}
    if broker.running:
        bs = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
        await ensure_topics(bs, broker.bootstrap)
        batches = list(fleet_batches(fleet))
        items = encoded(batches)
        n = sum(len(b.t_end) for b in batches)
        await produce_messages(broker.bootstrap, bs.topic_launches, items)
        out["input"] = {
            "fleet": fleet.__dict__,
            "messages": len(items),
            "launches": n,
            "bytes": sum(len(v) for _, v in items),
            "launches_per_message_mean": n / len(items),
        }
        ceil, work = [], []
        for r in range(opts["rounds"]):
            ceil.append(await _ceiling(broker.bootstrap, bs.topic_launches, len(items)))
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
        await produce_messages(broker.bootstrap, ns.topic_launches, recs)
        naive = await _run_worker(
            ns, run_dir / "naive.log", naive_n, [sys.executable, "-m", "bench.pipeline_naive"]
        )
        out["ceiling_a"] = {
            "median_per_s": statistics.median(c["per_s"] for c in ceil),
            "rounds": ceil,
            "consumes": "the batched input messages (all of them), aiokafka + orjson.loads",
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
            "definition": "worker process spawn -> first launch batch processed (input waiting)",
        }
        c, a, b = out["worker_c"]["median_per_s"], out["ceiling_a"]["median_per_s"], naive["per_s"]
        out["ratios"] = {"c_over_a": c / a, "c_over_b": c / b}
        if opts["sustain_s"] > 0:
            ss = bench_settings(broker.bootstrap, run_dir / "state", window_s=1.0)
            await ensure_topics(ss, broker.bootstrap)
            out["memory_e"] = await _sustain(
                ss, run_dir / "sustain.log", c / 2, opts["sustain_s"], fleet
            )
        out["latency_d"] = None
        out["notes"] = [
            "(d) end-to-end latency is not measured by this version of the benchmark.",
        ]
    out["load_avg_end"] = os.getloadavg()
    return out


def _port() -> int:
    from app.broker import free_port

    return free_port()


def _table(r: dict[str, Any]) -> str:
    lines = [
        f"kernelstream bench pipeline  {r['date']}  load avg start {r['load_avg_start']}",
        f"input: {r['input']['messages']} messages, {r['input']['launches']:,} launches "
        f"({r['input']['launches_per_message_mean']:.0f} per message)",
        f"(a) ceiling  aiokafka+orjson  {r['ceiling_a']['median_per_s']:>14,.0f} launches/s",
        f"(b) naive    Faust per-record {r['naive_b']['per_s']:>14,.0f} launches/s",
        f"(c) worker   kernelstream     {r['worker_c']['median_per_s']:>14,.0f} launches/s",
        f"(c)/(a) = {r['ratios']['c_over_a']:.2f}   (c)/(b) = {r['ratios']['c_over_b']:.0f}x",
        f"(f) ready    {r['ready_f']['median_s']:.2f} s",
    ]
    m = r.get("memory_e")
    if m:
        lines.append(
            f"(e) sustained {m['seconds']:.0f} s at {m['achieved_launches_per_s']:,.0f}/s: "
            f"RSS after warmup {m['rss_after_warmup_bytes'] / 2**20:.0f} MiB, final "
            f"{m['rss_final_bytes'] / 2**20:.0f} MiB, slope "
            f"{(m['rss_slope_bytes_per_min_after_warmup'] or 0) / 2**20:.2f} MiB/min"
        )
    lines.append("(d) latency  not measured by this version")
    return "\n".join(lines)


@click.command(name="pipeline")
@click.option("--json", "json_path", type=click.Path(path_type=Path), required=True)
@click.option(
    "--input-s",
    type=float,
    default=4.0,
    show_default=True,
    help="Event-time seconds of fleet telemetry to pre-produce (16 nodes x 4 kernels).",
)
@click.option(
    "--batch", type=int, default=2000, show_default=True, help="Node max launches per batch."
)
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--naive-launches", type=int, default=40_000, show_default=True)
@click.option("--sustain-s", type=float, default=600.0, show_default=True)
@click.option("--results-dir", type=click.Path(path_type=Path), default=Path("bench/results"))
def command(
    json_path: Path,
    input_s: float,
    batch: int,
    rounds: int,
    naive_launches: int,
    sustain_s: float,
    results_dir: Path,
) -> None:
    """Worker throughput vs its ceiling and a naive Faust agent; memory; start-to-ready."""
    opts = {
        "input_s": input_s,
        "batch": batch,
        "rounds": rounds,
        "naive_launches": naive_launches,
        "sustain_s": sustain_s,
    }
    with (
        tempfile.TemporaryDirectory(prefix="ks-bench-") as tmp,
        EmbeddedBroker(Path(tmp)) as broker,
    ):
        result = asyncio.run(_bench(opts, Path(tmp), broker))
    result["options"] = opts
    table = _table(result)
    click.echo(table)
    text = json.dumps(result, indent=1, default=str)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(text)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / f"pipeline-{result['date']}.json").write_text(text)
    (results_dir / f"pipeline-{result['date']}.txt").write_text(table + "\n")
