"""The ``kernelstream`` command line: demo, broker, worker, node, watch, replay, bench.

Every command builds the settings once (environment ``KERNELSTREAM_*``, optional
TOML file in ``KERNELSTREAM_CONFIG``, then the command's own options) and passes
them down. With no ``KAFKA_BOOTSTRAP`` the commands that need a broker start the
embedded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from kernelstream.app.cli.kernels_cmd import kernels
from kernelstream.app.errors import BrokerError
from kernelstream.app.settings import Settings, load_settings

__all__ = ["main"]


def _settings(**overrides: Any) -> Settings:
    try:
        return load_settings(**overrides)
    except Exception as exc:  # pydantic.ValidationError and TOML errors
        raise click.UsageError(f"invalid settings: {exc}") from exc


@contextlib.contextmanager
def _bootstrap(settings: Settings, log_dir: Path) -> Iterator[str]:
    """The configured cluster, or an embedded broker for the duration of the block."""
    if settings.bootstrap:
        yield settings.bootstrap
        return
    from kernelstream.app.kafka.embedded import EmbeddedBroker

    with EmbeddedBroker(log_dir) as broker:
        click.echo(f"embedded broker on {broker.bootstrap} (log: {broker.log_path})", err=True)
        yield broker.bootstrap


def _hosts(exc: BaseException) -> str:
    """``host:port,...`` from aiokafka's "Unable to bootstrap from [('h', 9092, ...)]"."""
    import re

    found = re.findall(r"\('([^']+)', (\d+)", str(exc))
    return ",".join(f"{h}:{p}" for h, p in found)


class _FrontDoor(click.Group):
    """Errors a user can fix end the command with one line naming what to fix (click
    prints ``Error: ...`` and exits 1); anything else keeps its traceback, as a bug."""

    def invoke(self, ctx: click.Context) -> Any:
        from kernelstream.schemas.errors import KernelstreamError

        try:
            return super().invoke(ctx)
        except KernelstreamError as exc:
            raise click.ClickException(str(exc)) from exc
        except Exception as exc:
            from aiokafka.errors import KafkaConnectionError

            from kernelstream.agents.retry_log import refusal

            # refused by the broker (what to fix), or unreachable; anything else is a bug
            hint = refusal(exc)
            if hint is None and not isinstance(exc, KafkaConnectionError):
                raise
            hosts = _hosts(exc)
            if hint is not None:
                where = f"Kafka at {hosts}" if hosts else "Kafka"
                raise click.ClickException(f"{where}: {hint}") from exc
            raise click.ClickException(
                f"cannot reach Kafka at {hosts or exc}; check KAFKA_BOOTSTRAP, or unset it to "
                "run on the embedded broker"
            ) from exc


@click.group(cls=_FrontDoor, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level.")
def main(verbose: bool) -> None:
    """kernelstream: a streaming pipeline that tunes GPU kernels while they run."""
    from kernelstream.agents.retry_log import quiet_aiokafka_connect_errors

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # A failed connect is reported once by the command (or the node's RetryLog), not
    # by aiokafka on every attempt.
    quiet_aiokafka_connect_errors()


@main.command()
@click.option(
    "--duration",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds the nodes run before the summary.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    help="Also write the summary as JSON to this file.",
)
@click.option(
    "--trace-file",
    type=click.Path(path_type=Path, exists=True),
    help="Kernel Tuner cache file for a trace node (default: first file found in "
    "the tuning-spaces directory).",
)
@click.option("--no-trace", is_flag=True, help="Run no trace node.")
@click.option(
    "--cupy",
    is_flag=True,
    help="Also run a cupy node on the real GPU --cupy-device (needs the 'gpu' extra).",
)
@click.option("--cupy-device", type=int, default=0, show_default=True, help="CUDA device index.")
@click.option("--no-live", is_flag=True, help="No live table; print progress lines instead.")
@click.option(
    "--run-dir",
    type=click.Path(path_type=Path),
    default=Path("var/demo"),
    show_default=True,
    help="Logs and worker state of this run.",
)
@click.option(
    "--scenario",
    type=click.Choice(["tuning", "drift", "transfers"]),
    default="tuning",
    show_default=True,
    help="tuning: the live loop above. drift: three hours of a kernel slowing down, "
    "written at once; shows the predictive alert and, later, the detector's regression. "
    "transfers: sim nodes whose copies, launch gaps and synchronizations hold the GPU "
    "back, and the findings about them.",
)
def demo(
    duration: float,
    json_path: Path | None,
    trace_file: Path | None,
    no_trace: bool,
    cupy: bool,
    cupy_device: int,
    no_live: bool,
    run_dir: Path,
    scenario: str,
) -> None:
    """Run the whole loop locally: embedded broker, one worker, sim and trace nodes
    (and a cupy node on a real GPU with --cupy).

    Shows a live table while kernels get tuned, then a summary per node, device
    and kernel of the default vs final configuration measured from window
    aggregates. Exits 0 when the run completed.
    """
    from kernelstream.app.cli.demo import DemoFailedError, DemoOptions, run_demo
    from kernelstream.kernels.errors import BackendUnavailableError

    settings = _settings()
    if scenario == "drift":
        from kernelstream.app.cli.demo_drift import run_drift_demo

        try:
            sys.exit(run_drift_demo(settings, run_dir))
        except DemoFailedError as exc:
            raise click.ClickException(str(exc)) from exc
    opts = DemoOptions(
        duration_s=duration,
        json_path=json_path,
        trace_file=trace_file,
        trace=not no_trace,
        live=not no_live and sys.stdout.isatty(),
        run_dir=run_dir,
        cupy=cupy,
        cupy_device_index=cupy_device,
        scenario=scenario,
    )
    try:
        code = run_demo(settings, opts)
    except (BackendUnavailableError, DemoFailedError) as exc:
        raise click.ClickException(str(exc)) from exc
    sys.exit(code)


@main.command()
@click.option(
    "--engine",
    type=click.Choice(["tansu", "kafka"]),
    default="tansu",
    show_default=True,
    help="tansu: embedded, memory only, no Java. "
    "kafka: Apache Kafka (KRaft), fetched with Maven once; needs Java 17 "
    "(JVM options beyond its 512 MiB heap: KAFKA_OPTS).",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Apache Kafka nodes (each broker and controller); --engine kafka only.",
)
@click.option(
    "--port", type=int, default=9092, show_default=True, help="Loopback port (first node)."
)
@click.option("--log-dir", type=click.Path(path_type=Path), default=Path("var"), show_default=True)
@click.option(
    "--create-topics/--no-create-topics",
    default=True,
    show_default=True,
    help="Create kernelstream's topics once the broker answers.",
)
def broker(engine: str, brokers: int, port: int, log_dir: Path, create_topics: bool) -> None:
    """Run a local broker until Ctrl-C: embedded Tansu, or Apache Kafka with --engine kafka."""
    from kernelstream.app.kafka.topics import ensure_topics

    if engine == "tansu" and brokers != 1:
        raise click.UsageError("--brokers needs --engine kafka (Tansu runs one node)")
    settings = _settings()
    with _local_broker(engine, brokers, port, log_dir) as b:
        if create_topics:
            asyncio.run(ensure_topics(settings, b.bootstrap))
        click.echo(f"broker ready: KAFKA_BOOTSTRAP={b.bootstrap} (log: {b.log_path})")
        _wait_for_stop_signal()


def _wait_for_stop_signal() -> None:
    """Return on SIGINT or SIGTERM. Python's handlers run on the main thread between
    bytecodes, so it waits in short steps: ``signal.sigwait`` once hung here after a
    Ctrl-C (a process-wide signal may be taken by another thread, which sigwait never
    sees)."""
    stopped = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopped.set()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stopped.wait(0.2):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _local_broker(engine: str, brokers: int, port: int, log_dir: Path) -> Iterator[Any]:
    """A started local broker of ``engine``; Kafka's storage lives for the block only."""
    if engine == "tansu":
        from kernelstream.app.kafka.embedded import EmbeddedBroker

        with EmbeddedBroker(log_dir, port=port) as tansu:
            yield tansu
        return
    import tempfile

    from kernelstream.app.kafka.apache import KafkaCluster

    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kafka-", dir=log_dir) as work:
        click.echo(f"starting Apache Kafka ({brokers} node(s)) in {work}", err=True)
        try:
            cluster = KafkaCluster(Path(work), brokers, first_port=port).start()
        except BrokerError as exc:
            raise click.ClickException(str(exc)) from exc
        try:
            yield cluster
        finally:
            cluster.stop()


@main.command()
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("keys"),
    show_default=True,
    help="Directory for recommender.key (private, mode 0600) and recommender.pub.",
)
@click.option(
    "--public-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also copy recommender.pub here (a volume the nodes mount without the private key).",
)
@click.option("--keep-existing", is_flag=True, help="Leave a pair already in --out-dir as it is.")
@click.option(
    "--k8s-secret",
    metavar="NAME",
    help="In a Kubernetes pod: store the pair as this Secret (kept if it exists); no files.",
)
def keygen(
    out_dir: Path, public_dir: Path | None, keep_existing: bool, k8s_secret: str | None
) -> None:
    """Generate the Ed25519 key pair that signs recommendations.

    The workers (tuner) get the private key (KERNELSTREAM_SIGNING_PRIVATE_KEY_FILE),
    every node the public key (KERNELSTREAM_SIGNING_PUBLIC_KEY_FILE).
    """
    from kernelstream.schemas.errors import SigningKeyError
    from kernelstream.schemas.signing import (
        PUBLIC_KEY_FILE,
        Verifier,
        generate_keypair,
        load_public_key,
        write_keypair,
    )

    if k8s_secret:
        from kernelstream.app.cli.keys import ensure_k8s_secret

        private, public = generate_keypair()
        try:
            created = ensure_k8s_secret(k8s_secret, private, public)
        except OSError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"Secret {k8s_secret}: {'created' if created else 'exists, kept'}")
        return
    try:
        priv, pub, new = write_keypair(out_dir, keep_existing=keep_existing)
        if public_dir is not None:
            public_dir.mkdir(parents=True, exist_ok=True)
            (public_dir / PUBLIC_KEY_FILE).write_bytes(pub.read_bytes())
    except (SigningKeyError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    key_id = Verifier(load_public_key(pub.read_bytes())).key_id
    click.echo(
        f"{'generated' if new else 'kept'} {key_id}\n"
        f"  workers: KERNELSTREAM_SIGNING_PRIVATE_KEY_FILE={priv}\n"
        f"  nodes:   KERNELSTREAM_SIGNING_PUBLIC_KEY_FILE={pub}"
    )


@main.command()
@click.option("--table", is_flag=True, help="Print the topic table (Markdown); no broker needed.")
@click.option(
    "--acls",
    type=click.Choice(["worker", "node"]),
    help="Print the kafka-acls.sh commands that allow a worker's or a node's principal "
    "what it does on these topics, and nothing more; no broker needed.",
)
@click.option(
    "--principal",
    default="User:kernelstream",
    show_default=True,
    help="The principal --acls allows.",
)
def topics(table: bool, acls: str | None, principal: str) -> None:
    """Create kernelstream's topics on KAFKA_BOOTSTRAP (missing ones; existing ones kept)."""
    from kernelstream.app.kafka.topics import ensure_topics, topics_markdown

    settings = _settings()
    if acls is not None:
        from kernelstream.app.kafka.acls import kafka_acls_commands, node_acls, worker_acls

        allowed = (worker_acls if acls == "worker" else node_acls)(settings)
        click.echo(kafka_acls_commands(principal, allowed), nl=False)
        return
    if table:
        click.echo(topics_markdown(settings), nl=False)
        return
    if not settings.bootstrap:
        raise click.UsageError("topics creates topics on a cluster: set KAFKA_BOOTSTRAP")
    created = asyncio.run(ensure_topics(settings, settings.bootstrap))
    click.echo(f"created: {', '.join(created) or 'none (all exist)'}")


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), help="RocksDB state directory.")
@click.option("--web-port", type=int, help="Port of the worker's web/metrics endpoint.")
@click.option("--app-id", help="Faust app id (the consumer group).")
@click.option(
    "--loglevel",
    type=click.Choice(["crit", "error", "warn", "info", "debug"]),
    default="warn",
    show_default=True,
)
def worker(data_dir: Path | None, web_port: int | None, app_id: str | None, loglevel: str) -> None:
    """Run a Faust worker: window (with the detector inline) and tuner agents."""
    from kernelstream.app.worker.start import run_worker

    settings = _settings(data_dir=data_dir, web_port=web_port, app_id=app_id)
    with _bootstrap(settings, Path("var")) as bootstrap:
        run_worker(settings, bootstrap, loglevel)


@main.command()
@click.option("--node-id", help="This node's id (recommendations are addressed to it).")
@click.option("--backend", type=click.Choice(["sim", "trace", "cupy"]), help="Device backend.")
@click.option("--model", "device_model", help="GPU model of a sim device, e.g. H100-SXM5-80GB.")
@click.option("--device-index", type=int)
@click.option(
    "--trace-file",
    type=click.Path(path_type=Path, exists=True),
    help="Kernel Tuner cache file of a trace device.",
)
@click.option("--workload", "workloads", multiple=True, help="Workloads to run (repeatable).")
@click.option("--seed", type=int)
@click.option("--duration", type=float, help="Seconds to run (default: until stopped).")
def node(
    node_id: str | None,
    backend: str | None,
    device_model: str | None,
    device_index: int | None,
    trace_file: Path | None,
    workloads: tuple[str, ...],
    seed: int | None,
    duration: float | None,
) -> None:
    """Run a GPU node: workloads on a device, telemetry out, reconfiguration agent.

    Serves /metrics, /healthz and /readyz on ``KERNELSTREAM_NODE_METRICS_PORT``.
    """
    from kernelstream.app.node.runtime import run_node
    from kernelstream.app.observability.health import serve_node_endpoints
    from kernelstream.app.observability.metrics import NodeMetrics

    settings = _settings(
        node_id=node_id,
        backend=backend,
        device_model=device_model,
        device_index=device_index,
        trace_file=trace_file,
        workloads=workloads or None,
        seed=seed,
    )
    if settings.backend == "sim":  # an unknown model fails before a broker starts
        from kernelstream.kernels.devices import device_spec_for_name

        device_spec_for_name(settings.device_model)
    if settings.backend == "cupy":  # fail before starting a broker, with the install hint
        from kernelstream.kernels.backends.cupy import import_cupy
        from kernelstream.kernels.errors import BackendUnavailableError

        try:
            import_cupy()
        except BackendUnavailableError as exc:
            raise click.ClickException(str(exc)) from exc

    async def _main(bootstrap: str) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        metrics = NodeMetrics()
        async with serve_node_endpoints(
            metrics, settings.node_metrics_bind, settings.node_metrics_port
        ):
            report = await run_node(
                settings, bootstrap, duration_s=duration, stop=stop, metrics=metrics
            )
        click.echo(
            f"node {report.node}: {report.launches} launches in {report.batches} batches; "
            f"outcomes {report.outcomes}",
            err=True,
        )

    with _bootstrap(settings, Path("var")) as bootstrap:
        asyncio.run(_main(bootstrap))


@main.command()
@click.argument(
    "what",
    type=click.Choice(
        ["recommendations", "findings", "windows", "reconfig", "alerts", "late", "deadletter"]
    ),
    default="recommendations",
)
@click.option("--node", "node_filter", help="Only records of this node.")
@click.option("--kernel", "kernel_filter", help="Only records of this kernel.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@click.option("--from-beginning", is_flag=True, help="Start at the oldest record.")
@click.option("--limit", type=int, help="Stop after this many records.")
def watch(
    what: str,
    node_filter: str | None,
    kernel_filter: str | None,
    as_json: bool,
    from_beginning: bool,
    limit: int | None,
) -> None:
    """Follow a topic from the command line (needs KAFKA_BOOTSTRAP)."""
    from kernelstream.app.cli.watch import watch_topic

    settings = _settings()
    if not settings.bootstrap:
        raise click.UsageError("watch follows an existing cluster: set KAFKA_BOOTSTRAP")
    topic = getattr(settings, f"topic_{what}")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
            watch_topic(
                settings,
                topic,
                node=node_filter,
                kernel=kernel_filter,
                as_json=as_json,
                from_beginning=from_beginning,
                limit=limit,
            )
        )


def _parse_time(value: str | None, option: str) -> int | None:
    """Unix seconds, or an ISO 8601 date-time (UTC unless it names a zone), to ms."""
    if value is None:
        return None
    from datetime import UTC, datetime

    try:
        return round(float(value) * 1000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(
            f"{value!r} is neither Unix seconds nor ISO 8601 (e.g. 2026-11-24T17:00:00)",
            param_hint=option,
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return round(dt.timestamp() * 1000)


def _range_spec(
    start_offset: int | None,
    end_offset: int | None,
    since: str | None,
    until: str | None,
    time_slack: float,
) -> Any:
    """The replay range; an empty one (start after end) is a usage error, not an empty report."""
    from kernelstream.app.replay.command import RangeSpec

    since_ms, until_ms = _parse_time(since, "--since"), _parse_time(until, "--until")
    if since_ms is not None and until_ms is not None and since_ms >= until_ms:
        raise click.BadParameter(
            f"--since {since} is not before --until {until}", param_hint="--since/--until"
        )
    if start_offset is not None and end_offset is not None and start_offset >= end_offset:
        raise click.BadParameter(
            f"--start-offset {start_offset} is not below --end-offset {end_offset}",
            param_hint="--start-offset/--end-offset",
        )
    return RangeSpec(
        start_offset=start_offset,
        end_offset=end_offset,
        since_ms=since_ms,
        until_ms=until_ms,
        slack_ms=round(time_slack * 1000),
    )


@main.command()
@click.option(
    "--recording",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    help="Read a recording directory (from `kernelstream demo`), not KAFKA_BOOTSTRAP.",
)
@click.option("--report", "report_dir", type=click.Path(path_type=Path), help="Report directory.")
@click.option("--to-topic", help="Republish the selected records to this topic instead.")
@click.option(
    "--topic",
    "source_role",
    type=click.Choice(["launches", "windows", "findings", "recommendations", "reconfig"]),
    default="launches",
    show_default=True,
    help="With --to-topic: which topic to republish (a report always reads launches, "
    "recommendations and reconfig).",
)
@click.option("--start-offset", type=int, help="First offset of every partition.")
@click.option("--end-offset", type=int, help="Offset to stop before, in every partition.")
@click.option("--since", help="Records stamped at or after this (Unix s or ISO 8601, UTC).")
@click.option("--until", help="Records stamped before this (Unix s or ISO 8601, UTC).")
@click.option(
    "--time-slack",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds record timestamps may be out of order within a partition.",
)
@click.option("--node", "node_filter", help="Only this node.")
@click.option("--device", "device_filter", help="Only this device model or node:index.")
@click.option("--kernel", "kernel_filter", help="Only this kernel.")
@click.option(
    "--speed",
    type=float,
    default=0.0,
    show_default=True,
    help="With --to-topic: 0 as fast as possible, N > 0 the recorded pace x N.",
)
@click.option(
    "--trace-file",
    "trace_files",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Kernel Tuner cache file for the what-if section (repeatable; default: the "
    "tuning-spaces directory).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def replay(
    recording: Path | None,
    report_dir: Path | None,
    to_topic: str | None,
    source_role: str,
    start_offset: int | None,
    end_offset: int | None,
    since: str | None,
    until: str | None,
    time_slack: float,
    node_filter: str | None,
    device_filter: str | None,
    kernel_filter: str | None,
    speed: float,
    trace_files: tuple[Path, ...],
    no_progress: bool,
) -> None:
    """Replay recorded topics: a report of what happened, or a new topic to run again.

    The report runs the workers' own window, detector and tuner code over the
    recorded launches; the same range gives byte-identical results. Ranges by
    offsets or by record time (found by reading record timestamps, never by the
    broker's offset-for-time answer).
    """
    from kernelstream.app.replay.analysis import LaunchFilter
    from kernelstream.app.replay.command import ReplayOptions, run_replay

    if (report_dir is None) == (to_topic is None):
        raise click.UsageError("give exactly one of --report DIR or --to-topic NAME")
    settings = _settings()
    if recording is None and not settings.bootstrap:
        raise click.UsageError(
            "replay reads an existing cluster (set KAFKA_BOOTSTRAP) or --recording"
        )
    if to_topic is not None and not settings.bootstrap:
        raise click.UsageError("--to-topic writes to a cluster: set KAFKA_BOOTSTRAP")
    if speed < 0:
        raise click.BadParameter("--speed must be >= 0")
    opts = ReplayOptions(
        spec=_range_spec(start_offset, end_offset, since, until, time_slack),
        flt=LaunchFilter(node_filter, device_filter, kernel_filter),
        recording=recording,
        report_dir=report_dir,
        to_topic=to_topic,
        source_role=source_role,
        speed=speed,
        trace_files=trace_files,
        progress=not no_progress and sys.stderr.isatty(),
    )
    try:
        done = asyncio.run(run_replay(settings, opts))
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    if "report" in done:
        click.echo(
            f"{done['launches']:,} launches -> {done['windows']} windows, "
            f"{done['findings']} findings in {done['seconds']:.1f} s; report: {done['report']}"
        )
    else:
        click.echo(f"{done['messages']:,} messages -> {done['topic']}")


def _progress_bar(enabled: bool) -> Any:
    """A rich progress bar (or a no-op stand-in when ``enabled`` is False)."""
    if not enabled:
        return contextlib.nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=False,
    )


@main.command()
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    help="Workload to sweep (repeatable; default: every workload of the device).",
)
@click.option(
    "--backend",
    type=click.Choice(["cupy", "sim", "trace"]),
    default="cupy",
    show_default=True,
    help="Device backend: cupy (a real GPU), sim (the model), trace (a cache file).",
)
@click.option("--model", "device_model", help="GPU model of a sim device, e.g. H200-SXM-141GB.")
@click.option("--device-index", type=int, default=0, show_default=True)
@click.option(
    "--trace-file", type=click.Path(path_type=Path, exists=True), help="Cache file (trace)."
)
@click.option(
    "--iterations", type=int, default=32, show_default=True, help="Timed launches per config."
)
@click.option(
    "--problem-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Scale every workload's total work (cupy, sim).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    show_default=True,
    help="Output directory (files sweep-<workload>-<device>-<date>.json.gz), or one file "
    "(.json or .json.gz) when sweeping one workload.",
)
@click.option(
    "--compile-workers",
    type=int,
    default=8,
    show_default=True,
    help="Threads compiling configurations ahead of the sweep (cupy).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def sweep(
    workloads: tuple[str, ...],
    backend: str,
    device_model: str | None,
    device_index: int,
    trace_file: Path | None,
    iterations: int,
    problem_scale: float,
    out: Path,
    compile_workers: int,
    no_progress: bool,
) -> None:
    """Brute-force a workload's search space and write a Kernel Tuner cache file.

    Every valid configuration runs one warm-up launch and --iterations timed
    launches. The file has the format of ../shared/data/tuning-spaces/ and loads
    as a trace device: kernelstream node --backend trace --trace-file FILE.
    """
    from kernelstream.kernels import KernelsError, open_device
    from kernelstream.kernels.sweep import cache_document, default_sweep_path, sweep, write_cache

    if iterations < 1:
        raise click.BadParameter("--iterations must be >= 1")
    try:
        device = open_device(
            backend,
            model=device_model,
            device_index=device_index,
            trace_file=trace_file,
            problem_scale=problem_scale,
        )
    except KernelsError as exc:
        raise click.ClickException(str(exc)) from exc
    stopping: list[int] = []
    # SIGTERM (e.g. `timeout`) ends the sweep early but still writes what was measured.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    try:
        available = {w.name: w for w in device.workloads()}
        chosen = list(workloads) or list(available)
        unknown = [n for n in chosen if n not in available]
        if unknown:
            raise click.UsageError(
                f"unknown workload(s) {unknown} on this device; choose from {sorted(available)}"
            )
        single_file = out.name.endswith((".json", ".json.gz"))
        if single_file and len(chosen) != 1:
            raise click.UsageError("--out names one file: sweep exactly one --workload")
        show = not no_progress and sys.stderr.isatty()
        with _progress_bar(show) as bar:
            for name in chosen:
                w = available[name]
                task = bar.add_task(name, total=w.space.size()) if bar is not None else None

                def tick(done: int, total: int, task: Any = task) -> None:
                    if bar is not None:
                        bar.update(task, completed=done, total=total)

                if stopping:
                    click.echo(f"{name}: not swept (stopped)", err=True)
                    continue
                result = sweep(
                    device,
                    w,
                    iterations=iterations,
                    progress=tick,
                    compile_workers=compile_workers,
                    stop=lambda: bool(stopping),
                )
                path = out if single_file else default_sweep_path(out, result.device_name, name)
                write_cache(cache_document(result), path)
                best = result.best
                best_text = f"best {best[0]} at {best[1]:.4f} ms" if best else "nothing ran"
                partial = "" if result.complete else f" PARTIAL ({result.total} asked)"
                click.echo(
                    f"{name} {tuple(w.problem_size)} on {result.device_name} ({backend}): "
                    f"{len(result.times_ms)} configs ran, {len(result.failed)} failed{partial}, "
                    f"{result.seconds:.1f} s; {best_text} -> {path}"
                )
    finally:
        signal.signal(signal.SIGTERM, previous)
        device.close()
    if stopping:
        sys.exit(143)


@main.command()
@click.option(
    "--sweep",
    "sweeps",
    multiple=True,
    required=True,
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="Sweep file of a built-in workload (repeatable).",
)
@click.option("--model", help="Sim model to compare (default: the sweep's device_name).")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write JSON here.")
def calibrate(sweeps: tuple[Path, ...], model: str | None, json_path: Path | None) -> None:
    """Compare the sim model of a GPU with a sweep measured on it.

    Per sweep: median and 90th percentile relative error of the predicted
    duration, median predicted/measured, Spearman rank correlation, and the true
    rank (and slowdown) of the model's best configuration.
    """
    from datetime import UTC, datetime

    import orjson

    from kernelstream.kernels.calibration import calibrate_file, format_table
    from kernelstream.kernels.errors import CalibrationError

    try:
        results = [calibrate_file(p, model=model) for p in sweeps]
    except CalibrationError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(format_table(results))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "results": [r.as_dict() for r in results],
        }
        json_path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        click.echo(f"wrote {json_path}")


class _LazyBenchGroup(click.Group):
    """``kernelstream bench NAME``: each benchmark is ``bench/<name>.py``'s ``command``.

    Modules are imported only when their benchmark runs, so the CLI stays fast and
    a benchmark's extra dependencies are needed only by that benchmark.
    """

    names = (
        "pipeline",
        "pipeline-peers",
        "wire-formats",
        "replay",
        "tuning",
        "telemetry-overhead",
        "telemetry-timing",
        "worker-path",
        "api-overhead",
        "alerts",
        "loop-speed",
    )

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.names)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.names:
            return None
        import importlib

        module = importlib.import_module(f"kernelstream.bench.{cmd_name.replace('-', '_')}")
        command = module.command
        assert isinstance(command, click.Command)
        return command


@main.group(cls=_LazyBenchGroup)
def bench() -> None:
    """Benchmarks: figures measured side by side in one run, kept under bench/results/."""


main.add_command(kernels)

if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
