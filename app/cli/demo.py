"""``kernelstream demo``: the whole loop on one machine, no Kafka and no GPU needed.

Starts the embedded broker, creates the topics, starts one worker and the nodes
as child processes (two ``sim`` nodes of different GPU models, when a tuning
space file is found one ``trace`` node, and with ``cupy=True`` one ``cupy`` node
on a real GPU), follows the windows, findings, outcomes and dead-letter topics to show
a live table, and ends with a summary computed from the measured window aggregates (for
every node, device model and kernel, the mean durations of its default, best kept and
current configurations) and what the stages refused, by reason.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from kernelstream.app.cli.demo_transfers import TRANSFER_NODES, HostFindingTally, host_changes
from kernelstream.app.kafka.embedded import (
    EmbeddedBroker,
    cli_command,
    die_with_parent,
    free_port,
)
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.replay.series import series_summary
from kernelstream.app.settings import Settings
from kernelstream.schemas import (
    DeadLetter,
    Finding,
    ReconfigOutcome,
    SchemaError,
    WindowAggregate,
    decode_any,
)
from kernelstream.schemas.signing import write_keypair

__all__ = ["ChildProcesses", "DemoFailedError", "DemoOptions", "SummaryBuilder", "run_demo"]

SIM_NODES = (("sim-a100", "A100-SXM4-80GB"), ("sim-h100", "H100-SXM5-80GB"))


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
    scenario: str = "tuning"  # or "transfers" (app.cli.demo_transfers)


class SummaryBuilder:
    """Folds windows, findings and outcomes into the live table and the final summary.

    The rows come from :func:`kernelstream.app.replay.series.series_summary`, the
    function the replay report uses: per node and kernel the default, the best kept
    and the current configuration, each scored by all its windows.
    """

    def __init__(self) -> None:
        self.windows: list[WindowAggregate] = []
        self.outcomes: list[ReconfigOutcome] = []
        self.classification: dict[tuple[str, int, str], str] = {}
        self.host = HostFindingTally()
        self.dead_letters = DeadLetterTally()

    def add(self, record: Any) -> None:
        if isinstance(record, WindowAggregate):
            self.windows.append(record)
        elif isinstance(record, DeadLetter):
            self.dead_letters.add(record)
        elif isinstance(record, Finding) and self.host.add(record):
            return
        elif isinstance(record, Finding):
            key = (record.node, record.device_index, record.kernel)
            self.classification[key] = record.classification
        elif isinstance(record, ReconfigOutcome):
            self.outcomes.append(record)

    def rows(self) -> list[dict[str, Any]]:
        rows = series_summary(self.windows, self.outcomes)
        for r in rows:
            key = (r["node"], r["device_index"], r["kernel"])
            r["classification"] = self.classification.get(key, "-")
        return rows


@dataclass
class _Refused:
    count: int
    first_reason: str
    keys: dict[str, int]  # original message key -> its dead letters


class DeadLetterTally:
    """The run's dead letters by (stage, reason code): how many, the first one's reason
    and the message keys they came from (a node's stream key names the node), so the
    summary says why a node announced at the start has no row."""

    def __init__(self) -> None:
        self.by_reason: dict[tuple[str, str], _Refused] = {}

    def __len__(self) -> int:
        return sum(r.count for r in self.by_reason.values())

    def add(self, letter: DeadLetter) -> None:
        reason = (letter.stage, letter.reason_code or "-")
        if reason not in self.by_reason:
            self.by_reason[reason] = _Refused(0, letter.reason, {})
        got = self.by_reason[reason]
        key = _key_text(letter.key_b64)
        got.count += 1
        got.keys[key] = got.keys.get(key, 0) + 1

    def lines(self) -> list[str]:
        out = []
        for (stage, code), r in sorted(self.by_reason.items(), key=lambda kv: -kv[1].count):
            keys = sorted(r.keys, key=lambda k: -r.keys[k])
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            out.append(
                f"{r.count:7d}  {stage}/{code} from {', '.join(keys[:3])}{more}: "
                f"{r.first_reason[:300]}"
            )
        return out

    def as_dict(self) -> list[dict[str, Any]]:
        return [
            {
                "stage": stage,
                "reason_code": code,
                "count": r.count,
                "first_reason": r.first_reason,
                "keys": r.keys,
            }
            for (stage, code), r in self.by_reason.items()
        ]


def _key_text(key_b64: str | None) -> str:
    if key_b64 is None:
        return "(no key)"
    try:
        return base64.b64decode(key_b64, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return f"(key {key_b64[:24]})"


def _us(x: float | None) -> str:
    return f"{x:.1f}" if x else "-"


def _render(rows: list[dict[str, Any]], title: str) -> Any:
    from rich.table import Table

    table = Table(title=title)
    for col in (
        "node",
        "device",
        "kernel",
        "default us",
        "best kept us",
        "speedup",
        "current us",
        "current config",
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
            _us(r["default_mean_us"]),
            _us(r["best_kept_mean_us"]),
            f"{r['speedup']:.2f}x" if r["speedup"] else "-",
            _us(r["current_mean_us"]),
            r["current_config_id"] + ("" if r["current_is_kept"] else " (trial)"),
            r["classification"],
            str(r["applied"]),
            str(r["rolled_back"]),
        )
    return table


def _find_trace_file(settings: Settings, explicit: Path | None) -> Path | None:
    """The cache file of the trace node: ``explicit`` (read now, so a damaged file is a
    one-line error before any process starts), else the first cache that reads."""
    from kernelstream.kernels import default_tuning_spaces_dir
    from kernelstream.kernels.backends.trace import cache_files_in, load_cache
    from kernelstream.kernels.errors import TraceFileError

    if explicit:
        load_cache(explicit)
        return explicit

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


def _trace_node_file(settings: Settings, opts: DemoOptions) -> Path | None:
    """The trace node's cache file, or None with a line saying why there is none."""
    if not opts.trace:
        return None
    trace = _find_trace_file(settings, opts.trace_file)
    if trace is None:
        from kernelstream.kernels import default_tuning_spaces_dir

        where = settings.tuning_spaces_dir or default_tuning_spaces_dir()
        print(
            f"no trace node: no Kernel Tuner cache file in {where} (set "
            "KERNELSTREAM_TUNING_SPACES_DIR or give --trace-file; --no-trace hides this)",
            flush=True,
        )
    return trace


class ChildProcesses:
    """Child processes of the demo; stopped in reverse order, never orphaned."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []

    def spawn(self, name: str, args: list[str], **env: str) -> None:
        log = (self.run_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            cli_command(*args),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**self.env, **env},
            preexec_fn=die_with_parent,
            # A session of its own: Ctrl-C in the terminal reaches the demo only, which
            # then stops its children in order (nodes, then worker) and keeps the run.
            start_new_session=True,
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

    def terminate(self, names: list[str]) -> None:
        """Ask these children to stop (SIGTERM) without waiting: :meth:`stop` waits later."""
        for name, p in self.procs:
            if name in names and p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def failed(self) -> list[str]:
        return [n for n, p in self.procs if p.poll() not in (None, 0, -signal.SIGTERM)]

    def failure_message(self) -> str:
        """One line: which child failed and the last line of its log."""
        name = self.failed()[0]
        log = self.run_dir / f"{name}.log"
        lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
        last = lines[-1] if lines else "no output"
        return f"{name} exited: {last} (log: {log})"


async def _follow(
    settings: Settings, bootstrap: str, builder: SummaryBuilder, stop: asyncio.Event
) -> None:
    from aiokafka import AIOKafkaConsumer

    from kernelstream.agents.first_offset import assign_from_first

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **settings.kafka_client_kwargs(),
    )
    await consumer.start()
    try:
        # From offset 0: the embedded broker's "beginning" can be one too high.
        await assign_from_first(
            consumer,
            (
                settings.topic_windows,
                settings.topic_findings,
                settings.topic_reconfig,
                settings.topic_deadletter,
            ),
        )
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for msg in msgs:
                    with contextlib.suppress(SchemaError):
                        builder.add(decode_any(msg.value))
    finally:
        await consumer.stop()


class DemoFailedError(Exception):
    """A child process of the demo failed; the message names it and its last log line."""


async def _wait_run(
    opts: DemoOptions, builder: SummaryBuilder, children: ChildProcesses, live: Any
) -> bool:
    """Show progress until the duration is over or Ctrl-C; True when interrupted."""
    interrupted = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted.set)
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < opts.duration_s:
            if children.failed():
                raise DemoFailedError(children.failure_message())
            title = f"kernelstream demo: {elapsed:.0f}/{opts.duration_s:.0f} s"
            if refused := len(builder.dead_letters):
                title += f", {refused} dead letters"
            if live is not None:
                live.update(_render(builder.rows(), title))
            elif int(elapsed) % 10 == 0:
                print(f"{title}: {len(builder.rows())} series", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(interrupted.wait(), 1.0)
            if interrupted.is_set():
                print("interrupted: stopping the nodes and keeping the run", flush=True)
                return True
        return False
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _monitor(
    settings: Settings,
    bootstrap: str,
    opts: DemoOptions,
    builder: SummaryBuilder,
    children: ChildProcesses,
) -> bool:
    """Follow the run to its end; True when it was interrupted (Ctrl-C or SIGTERM)."""
    stop = asyncio.Event()
    follower = asyncio.create_task(_follow(settings, bootstrap, builder, stop))
    live: Any = None
    if opts.live:
        from rich.live import Live

        live = Live(_render([], "kernelstream demo"), refresh_per_second=2)
        live.start()
    try:
        interrupted = await _wait_run(opts, builder, children, live)
        nodes = [n for n, _ in children.procs if n != "worker"]
        # Interrupted: a short stop and a short drain, so the user gets the prompt back
        # within seconds; the windows still open are the ones the summary leaves out.
        await asyncio.to_thread(children.stop, nodes, 1.0 if interrupted else 15.0)
        if interrupted:
            # The worker too, now: with the nodes gone no window closes in the short drain,
            # and its shutdown (handing its state over) overlaps the recording.
            children.terminate(["worker"])
        await asyncio.sleep(0.5 if interrupted else opts_drain_s(settings))
    finally:
        stop.set()
        await follower
        if live is not None:
            live.update(_render(builder.rows(), "kernelstream demo: final"))
            live.stop()
    return interrupted


async def _record(settings: Settings, bootstrap: str, directory: Path) -> None:
    """Keep the run's topics: the embedded broker forgets them when it stops."""
    from kernelstream.app.replay.command import KafkaSource, record_topics

    names = [
        settings.topic_launches,
        settings.topic_windows,
        settings.topic_findings,
        settings.topic_recommendations,
        settings.topic_reconfig,
        settings.topic_deadletter,
    ]

    async def one(topic: str) -> dict[str, int]:
        async with KafkaSource(bootstrap, settings.kafka_client_kwargs()) as source:
            return await record_topics(source, [topic], directory)

    # A source reads one partition at a time, a few round trips each: the topics at once.
    counts: dict[str, int] = {}
    for part in await asyncio.gather(*(one(name) for name in names)):
        counts.update(part)
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


def _demo_keys(settings: Settings, run_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """Recommendations are signed in the demo too: a key pair of the run's own, unless
    the user configured keys. Nodes get the public key (in ``env``); the returned
    environment, the private key, is the worker's alone."""
    configured = (
        settings.signing_private_key,
        settings.signing_private_key_file,
        settings.signing_public_key,
        settings.signing_public_key_file,
    )
    if any(v is not None for v in configured):
        return {}
    private, public, _ = write_keypair(run_dir / "keys")
    env["KERNELSTREAM_SIGNING_PUBLIC_KEY_FILE"] = str(public)
    return {"KERNELSTREAM_SIGNING_PRIVATE_KEY_FILE": str(private)}


def run_demo(settings: Settings, opts: DemoOptions) -> int:
    """Run the demo; return the process exit code."""
    gpu_name = check_gpu(opts.cupy_device_index) if opts.cupy else None
    trace = _trace_node_file(settings, opts)
    run_dir = opts.run_dir
    shutil.rmtree(run_dir, ignore_errors=True)  # the embedded broker starts empty: so does state
    run_dir.mkdir(parents=True)
    broker: EmbeddedBroker | None = None
    children: ChildProcesses | None = None
    builder = SummaryBuilder()
    interrupted = False
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
        worker_keys = _demo_keys(settings, run_dir, env)
        children = ChildProcesses(run_dir, env)
        children.spawn(
            "worker",
            ["worker"],
            **worker_keys,
            KERNELSTREAM_DATA_DIR=str(run_dir / "worker"),
            KERNELSTREAM_WEB_PORT=str(free_port()),
            KERNELSTREAM_APP_ID=f"kernelstream-demo-{os.getpid()}",
        )
        if opts.scenario == "transfers":
            _spawn_transfer_nodes(children)
        for node_id, model in SIM_NODES if opts.scenario == "tuning" else ():
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
        if trace is not None and opts.scenario == "tuning":
            children.spawn(
                "trace-node",
                ["node", "--node-id", "trace-1", "--backend", "trace", "--trace-file", str(trace)],
                KERNELSTREAM_NODE_METRICS_PORT=str(free_port()),
            )
            print(f"trace node replays measured durations from {trace}", flush=True)
        interrupted = asyncio.run(_monitor(settings, bootstrap, opts, builder, children))
        asyncio.run(_record(settings, bootstrap, run_dir / "recording"))
    except KeyboardInterrupt:  # while starting, or a second Ctrl-C while recording
        print("interrupted: this run is not kept", flush=True)
        return 130
    finally:
        if children is not None:
            children.stop(timeout_s=1.0)  # its state lives in run_dir, rebuilt on each run
        if broker is not None:
            broker.stop(timeout_s=1.0)
    rows = builder.rows()
    _print_summary(rows)
    _print_dead_letters(builder.dead_letters)
    changes = host_changes(builder.outcomes)
    if opts.scenario == "transfers":
        _print_host_findings(builder.host)
        print("\nhost-side changes (applied, measured by the whole step, kept or rolled back):")
        for change in changes:
            print(f"  {change.line()}")
        if not changes:
            print("  none")
    if opts.json_path:
        opts.json_path.parent.mkdir(parents=True, exist_ok=True)
        opts.json_path.write_bytes(
            orjson.dumps(
                {
                    "duration_s": opts.duration_s,
                    "interrupted": interrupted,
                    "series": rows,
                    "dead_letters": builder.dead_letters.as_dict(),
                    "host_findings": builder.host.as_dict(),
                    "host_changes": {c.key(): c.status for c in changes},
                },
                option=orjson.OPT_INDENT_2,
            )
        )
    return 130 if interrupted else 0


def _spawn_transfer_nodes(children: ChildProcesses) -> None:
    for n in TRANSFER_NODES:
        args = ["node", "--node-id", n.node_id, "--backend", "sim", "--model", n.model]
        children.spawn(n.node_id, args, KERNELSTREAM_NODE_METRICS_PORT=str(free_port()), **n.env())


def _print_host_findings(tally: HostFindingTally) -> None:
    print("\nhost-side findings (copies, host gaps, synchronizations):")
    for line in tally.lines() or ["  none"]:
        print(f"  {line}")
    missing = tally.missing()
    if missing:
        print(f"  not seen in this run: {', '.join(missing)} (a longer --duration shows them)")


def _print_dead_letters(tally: DeadLetterTally) -> None:
    """What the stages refused, by stage and reason code, with where it came from."""
    if not len(tally):
        print("\nDead letters: none (every message was accepted)")
        return
    print(f"\nDead letters: {len(tally)} messages refused (topic ks.deadletter, recorded too):")
    for line in tally.lines():
        print(line)


def _print_summary(rows: list[dict[str, Any]]) -> None:
    """Per series: default, best kept and current configuration with their window means."""
    print(
        "\nSummary (mean duration over each configuration's windows; "
        "speedup = default / best kept):"
    )
    print(
        f"{'node':10} {'device':16} {'kernel':18} {'default us':>11} {'best kept us':>13} "
        f"{'speedup':>8} {'current us':>11} {'applied':>8} {'rolled back':>12}"
    )
    for r in rows:
        s = r["speedup"]
        print(
            f"{r['node']:10} {r['device_model']:16} {r['kernel']:18} "
            f"{_us(r['default_mean_us']):>11} {_us(r['best_kept_mean_us']):>13} "
            f"{(s or float('nan')):7.2f}x {_us(r['current_mean_us']):>11} "
            f"{r['applied']:8d} {r['rolled_back']:12d}"
        )
        trial = "" if r["current_is_kept"] else " (on trial when the run ended)"
        print(
            f"{'':10}   default   {r['default_config_id']}\n"
            f"{'':10}   best kept {r['best_kept_config_id']}\n"
            f"{'':10}   current   {r['current_config_id']}{trial}"
        )
