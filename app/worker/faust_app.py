"""The Faust app factory: one app per worker process, built from the settings.

No module-global app: ``create_app`` is called by the CLI (``kernelstream worker``)
and by tests. The agents themselves live in ``agents/`` and are registered here.
State that must survive restarts is kept in a RocksDB store (Faust's ``rocksdb://``
store backed by rocksdict).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import faust

from kernelstream.app.kafka.capabilities import BrokerCapabilities
from kernelstream.app.kafka.group_member import faust_member_id, keep_member, member_file
from kernelstream.app.kafka.partitioner import CachedKeyPartitioner
from kernelstream.app.kafka.topics import ensure_state_partitions, topic_specs
from kernelstream.app.settings import Settings

__all__ = ["CONSUMER_STOP_S", "create_app", "faust_broker_kwargs", "stop_within", "transport"]

log = logging.getLogger("kernelstream.worker")

# How long the worker waits for Faust's consumer to stop (a stop takes about 0.1 s): well
# inside the 30 s a container runtime gives a process between SIGTERM and SIGKILL.
CONSUMER_STOP_S = 5.0


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """Faust settings for the broker connection, group timing and security.

    The group timings matter: with Faust's defaults a worker waits ~30 s to join
    its group on the embedded broker (it holds each JoinGroup for half the session
    timeout). Six seconds and a one-second heartbeat join in ~3 s.
    """
    kw: dict[str, Any] = {
        "broker_session_timeout": settings.session_timeout_s,
        "broker_heartbeat_interval": settings.heartbeat_interval_s,
        "broker_rebalance_timeout": settings.session_timeout_s,
        "broker_request_timeout": max(30.0, settings.session_timeout_s * 2),
    }
    if settings.security_protocol != "PLAINTEXT":
        kw["broker_credentials"] = _credentials(settings)
    return kw


def _credentials(settings: Settings) -> Any:
    from faust.auth import SASLCredentials, SSLCredentials

    ssl_context = settings.ssl_context()
    if settings.security_protocol.startswith("SASL_"):
        return SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password.get_secret_value() if settings.sasl_password else None,
            ssl_context=ssl_context,
            mechanism=settings.sasl_mechanism,
        )
    return SSLCredentials(ssl_context)


async def stop_within(stopping: Awaitable[None], seconds: float) -> bool:
    """Await Faust's consumer stopping, giving up after ``seconds``; True if it stopped.

    aiokafka's ``stop()`` first lets a group join in progress finish (JoinGroup,
    SyncGroup, the new assignment and its callbacks) and watches nothing else meanwhile:
    a worker asked to stop during such a join could wait on it for good (seen on Apache
    Kafka under load: Faust's 30 s child timeout passed, and the process never exited,
    where a stop takes about 0.1 s). What giving up skips is leaving the group, which the
    coordinator then notices at the session timeout: Faust has committed its offsets
    before this point, and the window agent has handed its partitions over already.
    """
    started = time.monotonic()
    try:
        await asyncio.wait_for(stopping, seconds)
    except TimeoutError:
        log.warning(
            "Faust's consumer did not stop within %.0f s (a group join in progress); "
            "the worker stops without leaving its group",
            time.monotonic() - started,
        )
        return False
    return True


def transport(settings: Settings, app: faust.App, idempotent: bool = False) -> Any:
    """Faust's aiokafka transport with the worker consumer's fetch wait from the settings.

    faust-streaming 0.15 creates its worker consumer with ``fetch_max_wait_ms=1500``
    hardcoded (``AIOKafkaConsumerThread._create_worker_consumer``; no setting reaches
    it). Tansu answers a waiting fetch only when that wait runs out, so every Faust hop
    (windows -> detector, findings -> tuner) cost up to 1.5 s of latency, and a Faust
    agent reading a backlog sat idle most of the time (the benchmark's Faust peer used
    0.23 of a core on JSON input; with this transport, 1.00). The
    subclasses below change that one argument before the consumer starts (aiokafka
    builds its fetcher in ``start()`` from ``_fetch_max_wait_ms``) and nothing else;
    check them when upgrading Faust.

    ``idempotent``: the broker hands out producer ids (Apache Kafka; detected by
    :func:`~kernelstream.app.kafka.capabilities.probe`). Faust makes an idempotent
    producer only inside transactions; here every producer is, so a produce request
    retried after a lost answer (a broker killed, a leader moved) is written once.
    """
    from faust.transport.drivers import aiokafka as driver

    wait_ms = settings.fetch_wait()

    class _ConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            consumer._fetch_max_wait_ms = wait_ms
            return consumer

        async def on_thread_stop(self) -> None:
            await stop_within(super().on_thread_stop(), CONSUMER_STOP_S)

    class _Consumer(driver.Consumer):
        def _new_consumer_thread(self) -> Any:
            return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class _Producer(driver.Producer):
        def _settings_extra(self) -> Any:
            extra = dict(super()._settings_extra())
            if idempotent:
                extra["enable_idempotence"] = True
            return extra

        async def refresh_metadata(self) -> None:
            """Read the topics' partitions again (partitions added since the last read:
            aiokafka refuses to send to a partition its cached metadata lacks)."""
            await self._ensure_producer().client.force_metadata_update()

    class _Transport(driver.Transport):
        Consumer = _Consumer
        Producer = _Producer

    return _Transport(app.conf.broker_consumer, app)


def create_app(
    settings: Settings,
    bootstrap: str,
    *,
    web: bool = True,
    window_consumer: Any = None,
    capabilities: BrokerCapabilities | None = None,
) -> faust.App:
    """Build the worker's Faust app with every agent registered.

    ``window_consumer``: an :class:`~kernelstream.agents.window_consumer.EarlyConsumer`
    already joining the window agent's group (``kernelstream worker``); by default the
    window agent creates its consumer when the app starts. ``capabilities``: what the
    broker answered to :func:`~kernelstream.app.kafka.capabilities.probe` (default: a
    single broker without idempotent producers, which works everywhere).
    """
    capabilities = capabilities or BrokerCapabilities(brokers=1, idempotent_producer=False)
    settings = settings.for_broker(capabilities)
    from functools import partial

    from kernelstream.agents.window_agent import state_topic
    from kernelstream.agents.worker import register_agents
    from kernelstream.app.observability.health import add_worker_endpoints

    app = faust.App(
        settings.app_id,
        broker=f"kafka://{bootstrap}",
        store="rocksdb://",  # Faust uses rocksdict for this store when it is installed
        datadir=str(settings.data_dir),
        topic_partitions=settings.partitions,
        # the topics Faust declares (the window-state handover) as kernelstream's own
        topic_replication_factor=capabilities.replication_factor,
        topic_allow_declare=True,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=settings.worker_linger_ms / 1000.0,
        # The window agent publishes a burst at every window close (a window and a
        # finding per stream: 64 streams ~ 200 KB). aiokafka keeps one open batch per
        # partition and one produce request in flight per broker, and send() waits
        # while a partition's batch is full: with Faust's 16 KiB batches the burst
        # waited for several broker round trips (publish mean 3.3 ms, max 121 ms per
        # window on a busy machine). 256 KiB holds a burst and stays far below Kafka's
        # default message.max.bytes (1 MiB) per batch.
        producer_max_batch_size=256 * 1024,
        # The default partitioner's murmur2, once per key (pure Python: ~7 us a send).
        producer_partitioner=CachedKeyPartitioner(),
        web_enabled=web,
        web_port=settings.web_port,
        web_bind=settings.web_bind,
        stream_wait_empty=False,
        # Few events buffered per agent so memory stays flat (launch batches bypass
        # Faust's streams; see agents/window_agent.py).
        consumer_max_fetch_size=4 << 20,
        stream_buffer_maxsize=64,
        **faust_broker_kwargs(settings),
    )
    app.transport = transport(settings, app, capabilities.idempotent_producer)
    kept = member_file(settings.data_dir, "faust")

    async def keep_member_id(sender: Any, /, *args: Any, signal: Any, **kwargs: Any) -> None:
        # So that a restart after a crash ends this membership at once
        # (app/kafka/group_member.py; start_window_consumer does it for both groups).
        keep_member(kept, settings.app_id, faust_member_id(app))

    app.on_partitions_assigned.connect(keep_member_id)  # a strong reference (weak=False)

    topics = {
        s.role: app.topic(
            s.name, key_serializer="raw", value_serializer="raw", partitions=s.partitions
        )
        for s in topic_specs(settings)
    }
    # The window agent's partition handover: co-partitioned with the launches topic,
    # declared by the agent itself (a few records per rebalance).
    # Compacted (Apache Kafka keeps each partition's newest whole "state" record and
    # drops the ones it replaced) with the launches' retention bounding chunked ones;
    # a broker that does not apply the policy (the embedded one) just keeps everything.
    launches = next(s for s in topic_specs(settings) if s.role == "launches")
    topics["window_state"] = app.topic(
        state_topic(settings),
        key_serializer="raw",
        value_serializer="raw",
        partitions=settings.partitions,
        compacting=True,
        deleting=True,
        retention=launches.retention_ms / 1000.0,
    )
    from kernelstream.app.worker.start import findings_consumer
    from kernelstream.app.worker.start import window_consumer as make_window_consumer

    known = [0]  # partitions of the window-state topic this worker made sure of

    async def state_partitions(needed: int) -> None:
        if needed > known[0]:
            known[0] = await ensure_state_partitions(settings, bootstrap, needed)
            await app.producer.refresh_metadata()  # type: ignore[attr-defined]  # _Producer

    agents = register_agents(
        app,
        settings,
        topics,
        window_consumer,
        partial(make_window_consumer, settings, bootstrap),
        state_partitions,
        partial(findings_consumer, settings, bootstrap),
    )
    _stats_page(app, agents)
    add_worker_endpoints(app, agents)
    return app


def _stats_page(app: faust.App, agents: Any) -> None:
    """``GET /ks/stats/``: the worker's progress as JSON (benchmarks and operators read it)."""
    import time

    started_at = time.time()

    @app.page("/ks/stats/")
    async def stats(web: Any, request: Any) -> Any:
        return web.json(
            {
                "pid": os.getpid(),
                "started_at": started_at,
                "maxrss_kib": _peak_rss_kib(),
                "open_windows": agents.windower.open_windows(),
                "window": agents.window_stats.as_dict(),
                "counters": dict(agents.ctx.counters),
            }
        )


def _peak_rss_kib() -> int:
    """This process's peak resident memory (KiB).

    ``VmHWM`` from /proc, not ``getrusage``'s ``ru_maxrss``: Linux carries
    ``ru_maxrss`` over fork and exec, so a worker spawned by a large parent (the
    benchmark holding its input) reported the parent's peak as its own.
    """
    import resource

    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
