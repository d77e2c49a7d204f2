"""``kernelstream bench replay``: replay N launch records from the embedded broker into a report.

Publishes ``--launches`` launch records (columnar batches of ``--batch`` launches,
the size a node sends) for 8 series (4 nodes x 2 kernels, two GPU models, a config
change every 10 s of event time) to a fresh topic on the embedded broker, then times
``kernelstream replay --report DIR`` end to end in this process: reading the range,
edge checks, windows, detector, offline tuner, summary, what-if, plots and page.
Records the machine's load average (other work shares the cores) with the figures.

Then, in the same run, the replay's windowing alone (edge checks, windows, detector; no
broker, no tuner) over the same messages spread on the topic's partitions as its
producer spread them: a chunk of a partition at a time, as replay reads them
(:meth:`OfflineAnalysis.add_launch_messages`: decoded together, the batches that continue
their streams windowed a run at a time), against one message at a time, alternating.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import platform
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson

from kernelstream.bench.results import dated_stem

__all__ = ["command", "run_benchmark"]

_SERIES = (
    ("bench-a100-0", "A100-SXM4-80GB", 2039.0, 19500.0),
    ("bench-a100-1", "A100-SXM4-80GB", 2039.0, 19500.0),
    ("bench-h100-0", "H100-SXM5-80GB", 3350.0, 67000.0),
    ("bench-h100-1", "H100-SXM5-80GB", 3350.0, 67000.0),
)
_KERNELS = (
    ("matmul", [2048], 3 * 2048 * 2048 * 4.0, 2 * 2048**3, "unroll", (1, 2, 4)),
    ("transpose", [4096, 4096], 2 * 4096 * 4096 * 4.0, 0.0, "pad", (0, 1)),
)


def _batches(total: int, per_batch: int, t0: float) -> list[tuple[bytes, bytes, int]]:
    """(key, value, timestamp ms) of every batch, in time order; seeded."""
    from kernelstream.kernels.resolve import SpaceResolver
    from kernelstream.schemas import LaunchBatch, encode

    rng = random.Random(42)
    resolver = SpaceResolver()
    streams = [(n, k) for n in _SERIES for k in _KERNELS]
    per_stream = total // len(streams)
    out = []
    for (node, model, peak_gbs, peak_gflops), (kernel, size, nbytes, flops, knob, vals) in streams:
        base = resolver.space_for(kernel, tuple(size)).start_config()
        mean_us = 150.0 if kernel == "matmul" else 60.0
        rate = 2_000.0 if kernel == "matmul" else 1_000.0  # launches per event second
        seq, t = 0, t0
        while seq < per_stream:
            n = min(per_batch, per_stream - seq)
            choice = vals[int((t - t0) // 10) % len(vals)]
            config = {**base, knob: choice}
            scale = 1.0 / (1 + vals.index(choice) * 0.3)
            durs = [mean_us * scale * (0.95 + 0.1 * rng.random()) for _ in range(n)]
            ends = [t + (i + 1) / rate for i in range(n)]
            b = LaunchBatch(
                node=node,
                device_index=0,
                device_model=model,
                backend="sim",
                kernel=kernel,
                workload=kernel,
                problem_size=size,
                config=config,
                config_id=",".join(f"{k}={v}" for k, v in config.items()),
                grid=[1024, 1, 1],
                block=[256, 1, 1],
                dynamic_smem_bytes=0,
                bytes_moved=nbytes,
                flops=flops,
                occupancy=0.75,
                waves=4.2,
                peak_gbs=peak_gbs,
                peak_gflops=peak_gflops,
                seq_start=seq,
                t_end=ends,
                duration_us=durs,
                ok=[1] * n,
            )
            out.append((b.stream_key.encode(), encode(b), round(ends[-1] * 1000)))
            seq += n
            t = ends[-1]
    out.sort(key=lambda m: m[2])
    return out


async def _publish(bootstrap: str, topic: str, msgs: list[tuple[bytes, bytes, int]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20, acks="all"
    )
    await producer.start()
    try:
        futs = [await producer.send(topic, v, key=k, timestamp_ms=ts) for k, v, ts in msgs]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


_CHUNK = 500  # messages of a partition handed over at once (what a fetch returns, about)


def windowing_alone(
    settings: Any, msgs: list[tuple[bytes, bytes, int]], rounds: int = 3
) -> dict[str, float]:
    """ns per launch of the replay's windowing over ``msgs`` a chunk of a partition at a
    time and one message at a time (best of ``rounds``, alternating)."""
    from kernelstream.agents.reconfig_agent import partition_for_key
    from kernelstream.agents.window_agent import window_spec
    from kernelstream.app.replay.analysis import OfflineAnalysis, RecordedMessage

    spec = window_spec(settings)  # as the replay command windows
    partitions = list(range(settings.partitions))
    parts: dict[int, list[RecordedMessage]] = {}
    for key, value, ts in msgs:
        p = partition_for_key(key, partitions)  # the producer's partitioner
        part = parts.setdefault(p, [])
        part.append(RecordedMessage(settings.topic_launches, p, len(part), ts, key, value))
    best = {"chunks": math.inf, "one_at_a_time": math.inf}
    outcome: dict[str, tuple[int, int, int]] = {}
    for _ in range(rounds):
        for mode in best:
            analysis = OfflineAnalysis(spec)
            t = time.perf_counter()
            for part in parts.values():
                if mode == "chunks":
                    for at in range(0, len(part), _CHUNK):
                        analysis.add_launch_messages(part[at : at + _CHUNK])
                else:
                    for m in part:
                        analysis.add_launch_message(m)
            best[mode] = min(best[mode], time.perf_counter() - t)
            res = analysis.result
            outcome[mode] = (res.launches, len(res.windows), sum(res.rejected.values()))
    if outcome["chunks"] != outcome["one_at_a_time"]:
        raise RuntimeError(f"the two ways windowed differently: {outcome}")
    launches = outcome["chunks"][0]
    return {f"{mode}_ns_per_launch": s / launches * 1e9 for mode, s in best.items()}


def run_benchmark(launches: int, per_batch: int, echo: Any = print) -> dict[str, Any]:
    """Publish, replay into a report, return the measured figures."""
    from kernelstream.app.kafka.embedded import EmbeddedBroker
    from kernelstream.app.kafka.topics import ensure_topics
    from kernelstream.app.replay.analysis import LaunchFilter
    from kernelstream.app.replay.command import RangeSpec, ReplayOptions, run_replay
    from kernelstream.app.settings import Settings

    tag = uuid.uuid4().hex[:6]
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(Path(tmp)) as broker:
        topics: dict[str, Any] = {
            f"topic_{r}": f"bench-{tag}.{r}"
            for r in ("launches", "windows", "findings", "recommendations", "reconfig")
        }
        settings = Settings(bootstrap=broker.bootstrap, **topics)
        asyncio.run(ensure_topics(settings, broker.bootstrap))
        t0 = time.time() - 3600.0
        msgs = _batches(launches, per_batch, t0)
        t = time.perf_counter()
        asyncio.run(_publish(broker.bootstrap, settings.topic_launches, msgs))
        echo(f"published {len(msgs)} messages in {time.perf_counter() - t:.1f} s")
        load_before = os.getloadavg()
        out = Path(tmp) / "report"
        t = time.perf_counter()
        cpu0 = time.process_time()
        done = asyncio.run(
            run_replay(
                settings,
                ReplayOptions(spec=RangeSpec(), flt=LaunchFilter(), report_dir=out, progress=False),
            )
        )
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu0
        load_after = os.getloadavg()
        phases = orjson.loads((out / "run.json").read_bytes())
        echo(f"replayed {done['launches']:,} launches into a report in {wall:.1f} s")
        alone = windowing_alone(settings, msgs)
        return {
            "date": dt.date.today().isoformat(),
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_before": load_before,
                "loadavg_after": load_after,
            },
            "input": {
                "launches": done["launches"],
                "messages": len(msgs),
                "launches_per_message": per_batch,
                "series": len(_SERIES) * len(_KERNELS),
            },
            "result": {
                "wall_s": wall,
                "process_cpu_s": cpu,
                "launches_per_s": done["launches"] / wall,
                "windows": done["windows"],
                "findings": done["findings"],
                "read_and_window_s": phases["read_and_window_s"],
                "analysis_s": phases["analysis_s"],
                "report_write_and_plots_s": phases["total_s"]
                - phases["read_and_window_s"]
                - phases["analysis_s"],
                "target_s": 60.0,
                "met": wall <= 60.0,
            },
            "windowing_alone": alone,
        }


@click.command("replay")
@click.option("--launches", type=int, default=1_000_000, show_default=True)
@click.option("--batch", "per_batch", type=int, default=100, show_default=True)
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("bench/results"),
    show_default=True,
)
def command(launches: int, per_batch: int, results_dir: Path) -> None:
    """Replay launch records from the embedded broker into a report; time it."""
    report = run_benchmark(launches, per_batch, echo=lambda m: click.echo(m, err=True))
    path = Path(f"{dated_stem(results_dir, 'replay', report['date'])}.json")
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    r, m, w = report["result"], report["machine"], report["windowing_alone"]
    text = (
        f"kernelstream bench replay --launches {launches} --batch {per_batch}\n"
        f"{report['input']['launches']:,} launches in {report['input']['messages']:,} messages, "
        f"{report['input']['series']} series -> {r['windows']} windows, {r['findings']} findings\n"
        f"wall {r['wall_s']:.1f} s (target {r['target_s']:.0f} s: "
        f"{'met' if r['met'] else 'NOT met'}), {r['launches_per_s']:,.0f} launches/s, "
        f"process CPU {r['process_cpu_s']:.1f} s\n"
        f"phases: read+window {r['read_and_window_s']:.1f} s, analysis "
        f"{r['analysis_s']:.1f} s, report+plots {r['report_write_and_plots_s']:.1f} s\n"
        f"windowing alone (edge checks, windows, detector; best of 3): a chunk of "
        f"{_CHUNK} messages of a partition at a time {w['chunks_ns_per_launch']:.0f} ns/launch, "
        f"one message at a time {w['one_at_a_time_ns_per_launch']:.0f}: "
        f"{w['one_at_a_time_ns_per_launch'] / w['chunks_ns_per_launch']:.2f}x\n"
        f"{m['cpus']} CPUs; load average before {m['loadavg_before']}, after "
        f"{m['loadavg_after']}\n"
    )
    path.with_suffix(".txt").write_text(text)
    click.echo(text)
