"""``kernelstream demo``: the whole loop on one machine, no Kafka and no GPU needed.

Starts the embedded broker, creates the topics, starts one worker and the nodes
as child processes (two ``sim`` nodes of different GPU models, when a tuning
space file is found one ``trace`` node, and with ``cupy=True`` one ``cupy`` node
on a real GPU), follows the windows, findings and
outcomes topics to show a live table, and ends with a summary computed from the
measured window aggregates: for every node, device model and kernel, the mean
duration of its default configuration against that of its final configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kernelstream.app.kafka.embedded import EmbeddedBroker, die_with_parent, free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import Finding, ReconfigOutcome, SchemaError, WindowAggregate, decode_any

__all__ = ["DemoOptions", "SummaryBuilder", "run_demo"]

SIM_NODES = (("sim-a100", "A100-SXM4-80GB"), ("sim-h100", "H100-SXM5-80GB"))
_TAIL_WINDOWS = 3


@dataclass(frozen=True)
class DemoOptions:
    duration_s: float = 60.0
    json_path: Path | None = None
    trace_file: Path | None = None
    trace: bool = True
    live: bool = True
    run_dir: Path = Path("var/demo")
    cupy: bool = False
    cupy_device_index: int = 0


@dataclass
class _Series:
    """Everything measured for one (node, device model, kernel)."""

    windows: list[WindowAggregate] = field(default_factory=list)
    classification: str = "-"
    applied: int = 0
    kept: int = 0
    rolled_back: int = 0
    rejected: int = 0


class SummaryBuilder:
    """Folds windows, findings and outcomes into the live table and the final summary.

    The default configuration of a series is the configuration of its first
    window; the final one that of its last window. Both means are count-weighted
    over measured windows: all windows of the default configuration, and the last
    ``_TAIL_WINDOWS`` windows of the final configuration.
    """

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], _Series] = defaultdict(_Series)

    def add(self, record: Any) -> None:
        if isinstance(record, WindowAggregate):
            s = self.series[(record.node, record.device_model, record.kernel)]
            if record.count > 0:
                s.windows.append(record)
        elif isinstance(record, Finding):
            self.series[
                (record.node, record.device_model, record.kernel)
            ].classification = record.classification
        elif isinstance(record, ReconfigOutcome):
            s = self.series[(record.node, record.device_model, record.kernel)]
            setattr(s, record.status, getattr(s, record.status) + 1)

    @staticmethod
    def _mean(windows: list[WindowAggregate]) -> float | None:
        n = sum(w.count for w in windows)
        return sum(w.duration_mean_us * w.count for w in windows) / n if n else None

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for (node, model, kernel), s in sorted(self.series.items()):
            if not s.windows:
                continue
            ws = sorted(s.windows, key=lambda w: (w.window_start, w.config_id))
            first, last = ws[0], ws[-1]
            default_mean = self._mean([w for w in ws if w.config_id == first.config_id])
            tail = [w for w in ws if w.config_id == last.config_id][-_TAIL_WINDOWS:]
            final_mean = self._mean(tail)
            speedup = default_mean / final_mean if default_mean and final_mean else None
            out.append(
                {
                    "node": node,
                    "device_model": model,
                    "kernel": kernel,
                    "default_config": first.config,
                    "default_config_id": first.config_id,
                    "default_mean_us": default_mean,
                    "final_config": last.config,
                    "final_config_id": last.config_id,
                    "final_mean_us": final_mean,
                    "speedup": speedup,
                    "classification": s.classification,
                    "recommendations_applied": s.applied,
                    "kept": s.kept,
                    "rolled_back": s.rolled_back,
                    "rejected": s.rejected,
                    "windows": len(ws),
                }
            )
        return out


def _render(rows: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "node",
        "device",
        "kernel",
        "config",
        "mean us",
        "default us",
        "speedup",
        "class",
        "applied",
        "rolled back",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["node"],
            r["device_model"],
            r["kernel"],
            r["final_config_id"],
            f"{r['final_mean_us']:.1f}" if r["final_mean_us"] else "-",
            f"{r['default_mean_us']:.1f}" if r["default_mean_us"] else "-",
            f"{r['speedup']:.2f}x" if r["speedup"] else "-",
            r["classification"],
            str(r["recommendations_applied"]),
            str(r["rolled_back"]),
        )
    return table


def _find_trace_file(settings: Settings, explicit: Path | None) -> Path | None:
    if explicit:
        return explicit
    from kernelstream.kernels import default_tuning_spaces_dir
    from kernelstream.kernels.backends.trace import cache_files_in, load_cache
    from kernelstream.kernels.errors import TraceFileError

    # The first file that reads as a Kernel Tuner cache: a T4 results file or other JSON
    # beside the caches is passed over (with a warning) rather than crashing the trace node.
    for path in cache_files_in(settings.tuning_spaces_dir or default_tuning_spaces_dir()):
        try:
            load_cache(path)
        except TraceFileError as ex:
            print(f"passing over {path.name} for the trace node: {ex}", flush=True)
            continue
        return path
    return None


class _Children:
    """Child processes of the demo; stopped in reverse order, never orphaned."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(self, name: str, args: list[str], **env: str) -> None:
        log = (self.run_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelstream.app.cli", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.env, **env},
            preexec_fn=die_with_parent,
        )
        self.procs.append((name, proc))

    def stop(self, names: list[str] | None = None, timeout_s: float = 15.0) -> None:
        chosen = [(n, p) for n, p in self.procs if names is None or n in names]
        for _, p in reversed(chosen):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for _, p in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
            if p.poll() is None:
                p.kill()
                p.wait()

    def failed(self) -> list[str]:
        return [n for n, p in self.procs if p.poll() not in (None, 0, -signal.SIGTERM)]


async def _follow(
    settings: Settings, bootstrap: str, builder: SummaryBuilder, stop: asyncio.Event
) -> None:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        settings.topic_windows,
        settings.topic_findings,
        settings.topic_reconfig,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **settings.kafka_client_kwargs(),
    )
    await consumer.start()
    try:
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for msg in msgs:
                    with contextlib.suppress(SchemaError):
                        builder.add(decode_any(msg.value))
    finally:
        await consumer.stop()


async def _monitor(
    settings: Settings,
    bootstrap: str,
    opts: DemoOptions,
    builder: SummaryBuilder,
    children: _Children,
) -> None:
    stop = asyncio.Event()
    follower = asyncio.create_task(_follow(settings, bootstrap, builder, stop))
    start = time.monotonic()
    live: Any = None
    if opts.live:
        from rich.live import Live

        live = Live(_render([], "kernelstream demo"), refresh_per_second=2)
        live.start()
    try:
        while (elapsed := time.monotonic() - start) < opts.duration_s:
            if children.failed():
                raise RuntimeError(
                    f"child process failed: {children.failed()}; see logs in {opts.run_dir}"
                )
            title = f"kernelstream demo: {elapsed:.0f}/{opts.duration_s:.0f} s"
            if live is not None:
                live.update(_render(builder.rows(), title))
            elif int(elapsed) % 10 == 0:
                print(f"{title}: {len(builder.rows())} series", flush=True)
            await asyncio.sleep(1.0)
        children.stop([n for n, _ in children.procs if n != "worker"])
        await asyncio.sleep(opts_drain_s(settings))
    finally:
        stop.set()
        await follower
        if live is not None:
            live.update(_render(builder.rows(), "kernelstream demo: final"))
            live.stop()


async def _record(settings: Settings, bootstrap: str, directory: Path) -> None:
    """Keep the run's topics: the embedded broker forgets them when it stops."""
    from kernelstream.app.replay.command import KafkaSource, record_topics

    names = [
        settings.topic_launches,
        settings.topic_windows,
        settings.topic_findings,
        settings.topic_recommendations,
        settings.topic_reconfig,
    ]
    async with KafkaSource(bootstrap, settings.kafka_client_kwargs()) as source:
        counts = await record_topics(source, names, directory)
    print(
        f"recorded {sum(counts.values())} messages in {directory}: "
        f"kernelstream replay --recording {directory} --report REPORT_DIR",
        flush=True,
    )


def opts_drain_s(settings: Settings) -> float:
    """Time for the last windows to close after the nodes stop (idle flush + margin)."""
    return settings.idle_timeout_s + settings.window_s + 2.0


def check_gpu(device_index: int) -> str:
    """The name of CUDA device ``device_index``; raises BackendUnavailableError (naming
    the ``gpu`` extra) when CuPy is missing or the device is not there."""
    from kernelstream.kernels.backends.cupy import import_cupy
    from kernelstream.kernels.errors import BackendUnavailableError

    cp = import_cupy()
    try:
        count = int(cp.cuda.runtime.getDeviceCount())
    except Exception as ex:  # no driver: CUDARuntimeError
        raise BackendUnavailableError(f"no usable CUDA device for a cupy node: {ex}") from ex
    if device_index >= count:
        raise BackendUnavailableError(
            f"a cupy node needs CUDA device {device_index}; {count} visible"
        )
    raw = cp.cuda.runtime.getDeviceProperties(device_index)["name"]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def run_demo(settings: Settings, opts: DemoOptions) -> int:
    """Run the demo; return the process exit code."""
    gpu_name = check_gpu(opts.cupy_device_index) if opts.cupy else None
    run_dir = opts.run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # the embedded broker starts empty: so does state
    run_dir.mkdir(parents=True)
    broker: EmbeddedBroker | None = None
    children: _Children | None = None
    builder = SummaryBuilder()
    try:
        if settings.bootstrap:
            bootstrap = settings.bootstrap
        else:
            broker = EmbeddedBroker(run_dir).start()
            bootstrap = broker.bootstrap
        print(f"broker: {bootstrap}; logs and state in {run_dir}", flush=True)
        asyncio.run(ensure_topics(settings, bootstrap))
        env = {
            **os.environ,
            "KAFKA_BOOTSTRAP": bootstrap,
            "PYTHONUNBUFFERED": "1",
            # Node outboxes and sequence numbers live with this run: the broker starts empty.
            "KERNELSTREAM_NODE_STATE_DIR": str(run_dir / "nodes"),
        }
        children = _Children(run_dir, env)
        children.spawn(
            "worker",
            ["worker"],
            KERNELSTREAM_DATA_DIR=str(run_dir / "worker"),
            KERNELSTREAM_WEB_PORT=str(free_port()),
            KERNELSTREAM_APP_ID=f"kernelstream-demo-{os.getpid()}",
        )
        for node_id, model in SIM_NODES:
            children.spawn(
                node_id,
                [
                    "node",
                    "--node-id",
                    node_id,
                    "--backend",
                    "sim",
                    "--model",
                    model,
                    "--seed",
                    str(len(node_id)),
                ],
                # Each node serves /metrics on a port of its own (they share a host).
                KERNELSTREAM_NODE_METRICS_PORT=str(free_port()),
            )
        if gpu_name is not None:
            children.spawn(
                "cupy-node",
                [
                    "node",
                    "--node-id",
                    f"cupy-{opts.cupy_device_index}",
                    "--backend",
                    "cupy",
                    "--device-index",
                    str(opts.cupy_device_index),
                ],
                KERNELSTREAM_NODE_METRICS_PORT=str(free_port()),
            )
            print(f"cupy node runs the workloads on {gpu_name}", flush=True)
        trace = _find_trace_file(settings, opts.trace_file) if opts.trace else None
        if trace is not None:
            children.spawn(
                "trace-node",
                ["node", "--node-id", "trace-1", "--backend", "trace", "--trace-file", str(trace)],
                KERNELSTREAM_NODE_METRICS_PORT=str(free_port()),
            )
            print(f"trace node replays measured durations from {trace}", flush=True)
        asyncio.run(_monitor(settings, bootstrap, opts, builder, children))
        asyncio.run(_record(settings, bootstrap, run_dir / "recording"))
    except KeyboardInterrupt:
        print("interrupted: stopping cleanly", flush=True)
        return 130
    finally:
        if children is not None:
            children.stop()
        if broker is not None:
            broker.stop()
    rows = builder.rows()
    _print_summary(rows)
    if opts.json_path:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_bytes(
            orjson.dumps(
                {"duration_s": opts.duration_s, "series": rows}, option=orjson.OPT_INDENT_2
            )
        )
    return 0


def _print_summary(rows: list[dict[str, Any]]) -> None:
    print("\nSummary (mean durations measured from window aggregates):")
    print(
        f"{'node':10} {'device':16} {'kernel':14} {'default us':>11} {'final us':>10} "
        f"{'speedup':>8} {'applied':>8} {'rolled back':>12}"
    )
    for r in rows:
        d, f, s = r["default_mean_us"], r["final_mean_us"], r["speedup"]
        print(
            f"{r['node']:10} {r['device_model']:16} {r['kernel']:14} "
            f"{d if d is not None else float('nan'):11.1f} "
            f"{f if f is not None else float('nan'):10.1f} "
            f"{(s or float('nan')):7.2f}x {r['recommendations_applied']:8d} "
            f"{r['rolled_back']:12d}"
        )
        print(
            f"{'':10}   default {r['default_config_id']}\n{'':10}   final   {r['final_config_id']}"
        )
