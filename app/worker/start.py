"""Worker start: join the window consumer's group first, import and build the rest meanwhile.

A consumer group join is mostly waiting: the embedded broker holds every JoinGroup
for half the session timeout (3 s with the default 6 s), and Apache Kafka holds the
first one for ``group.initial.rebalance.delay.ms``. Importing and building the Faust
worker (Faust, aiohttp, NumPy, pydantic, the agents) is CPU work of about 0.8 s on
an idle 2-core machine and twice that on a busy one. Done one after the other, as a
plain ``create_app`` + ``Worker`` start does, the two add up; here the window
consumer (light: aiokafka only) is created and subscribed first, so its join is in
flight on the event loop while a thread imports the heavy modules, and the window
agent adopts the already-joined consumer when the app starts.

The partitions assigned before the window agent runs wait for it: the rebalance
listener defers to the agent once it is attached (its takeover reads checkpoints
and the handover topic, which need the app).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import importlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from kernelstream.agents.window_consumer import DeferredListener, EarlyConsumer
from kernelstream.app.kafka.capabilities import probe
from kernelstream.app.kafka.group_member import (
    consumer_member_id,
    keep_member,
    leave_previous_member,
    member_file,
)
from kernelstream.app.settings import Settings

__all__ = [
    "THREADS_EXIT_S",
    "exit_without_stuck_threads",
    "retain_heap",
    "run_worker",
    "start_window_consumer",
    "window_consumer",
]

log = logging.getLogger("kernelstream.worker")

# mallopt(3) parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def retain_heap(mib: int) -> bool:
    """Have glibc's malloc keep up to ``mib`` MiB of freed heap for reuse; False where
    there is nothing to set (0, or a C library without ``mallopt``, as musl's that ignores it).

    By default glibc serves blocks above a threshold that adapts (128 KiB to 32 MiB) with
    fresh mappings, and gives the top of the heap back once more than twice that is free.
    A worker's poll allocates and frees megabytes (decompressed record batches, the
    columns joined for the edge checks, window concatenations), so the same memory went
    back and forth and every page of it faulted in again. Here blocks up to 32 MiB come
    from the heap, and it is trimmed only above ``mib`` MiB free.
    """
    if mib <= 0:
        return False
    # the symbols the process already has loaded, the C library's among them
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, min(mib << 20, _MMAP_THRESHOLD_MAX)),
            (_M_TRIM_THRESHOLD, mib << 20),
            (_M_TOP_PAD, min(mib << 20, 16 << 20)),
        )
    )
    if not ok:
        log.warning("the C library refused a heap setting (mallopt): its defaults apply")
    return ok


# Imported on a thread while the group join is held by the broker.
_HEAVY_MODULES = (
    "numpy",
    "faust",
    "faust.worker",
    "kernelstream.app.worker.faust_app",
    "kernelstream.agents.worker",
)


def window_group(settings: Settings) -> str:
    return f"{settings.app_id}.window"


def _consumer(settings: Settings, bootstrap: str, group: str, **kw: Any) -> AIOKafkaConsumer:
    """A plain aiokafka consumer of the worker: offsets committed by its owner after the
    work, from the earliest where the group has none, the settings' fetch wait and
    client (security) options."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=settings.fetch_wait(),
        **kw,
        **settings.kafka_client_kwargs(),
    )


def window_consumer(settings: Settings, bootstrap: str) -> AIOKafkaConsumer:
    """The window agent's plain aiokafka group consumer of the launches topic."""
    from kernelstream.app.kafka import zstd_decode

    zstd_decode.install()  # the launch batches' decompression, ~2x faster per batch
    s = settings
    return _consumer(
        s,
        bootstrap,
        window_group(s),
        session_timeout_ms=int(s.session_timeout_s * 1000),
        heartbeat_interval_ms=int(s.heartbeat_interval_s * 1000),
        rebalance_timeout_ms=int(s.session_timeout_s * 1000),
        max_partition_fetch_bytes=4 << 20,
        fetch_max_bytes=16 << 20,
    )


def findings_group(settings: Settings) -> str:
    """The consumer group whose committed offsets are the findings reader's positions. It
    has no members: the reader assigns itself the partitions the app's group gave this
    worker (:mod:`~kernelstream.agents.findings_agent`)."""
    return f"{settings.app_id}.findings"


def findings_consumer(settings: Settings, bootstrap: str) -> AIOKafkaConsumer:
    """The findings reader's plain aiokafka consumer (partitions assigned by the reader).

    A backlog of findings (~1.5 KB each) is prefetched a few MiB at a time, as Faust's
    consumer did (``consumer_max_fetch_size``)."""
    return _consumer(
        settings,
        bootstrap,
        findings_group(settings),
        max_partition_fetch_bytes=1 << 20,
        fetch_max_bytes=4 << 20,
    )


class _KeepMemberId(DeferredListener):
    """Forwards to the window agent, and first keeps the consumer's member id in the data
    folder at each assignment (:mod:`~kernelstream.app.kafka.group_member`)."""

    def __init__(self, path: Path, group: str) -> None:
        super().__init__()
        self.path, self.group = path, group
        self.consumer: AIOKafkaConsumer | None = None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        keep_member(self.path, self.group, consumer_member_id(self.consumer))
        await super().on_partitions_assigned(assigned)


async def start_window_consumer(settings: Settings, bootstrap: str) -> EarlyConsumer:
    """Create the topics (the subscription must see them), end the previous run's group
    membership, and the Faust app's, if it did not (:mod:`~kernelstream.app.kafka.group_member`),
    start, subscribe."""
    from kernelstream.app.kafka.topics import ensure_state_partitions, ensure_topics

    await ensure_topics(settings, bootstrap)
    await ensure_state_partitions(settings, bootstrap)
    group, path = window_group(settings), member_file(settings.data_dir)
    kwargs = settings.kafka_client_kwargs()
    await asyncio.gather(
        leave_previous_member(path, group, bootstrap, kwargs),
        # the Faust app's group (findings, tuner, alerts), whose consumer starts later
        leave_previous_member(
            member_file(settings.data_dir, "faust"), settings.app_id, bootstrap, kwargs
        ),
    )
    listener = _KeepMemberId(path, group)
    early = EarlyConsumer(window_consumer(settings, bootstrap), listener)
    listener.consumer = early.consumer
    # Started before subscribing: ``start()`` of a subscribed consumer returns only
    # once partitions are assigned. Subscribed after, the join runs in the background.
    await early.consumer.start()
    early.consumer.subscribe([settings.topic_launches], listener=early.listener)
    return early


def _import_heavy() -> None:
    for name in _HEAVY_MODULES:
        importlib.import_module(name)


def run_worker(settings: Settings, bootstrap: str, loglevel: str) -> None:
    """``kernelstream worker``: the window group join overlaps the worker's imports."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # Faust and mode run the worker on the current loop
    caps = loop.run_until_complete(probe(bootstrap, settings.kafka_client_kwargs()))
    settings = settings.for_broker(caps)
    early = loop.run_until_complete(start_window_consumer(settings, bootstrap))
    # The loop keeps running (the join in flight) while the thread imports.
    loop.run_until_complete(asyncio.to_thread(_import_heavy))

    from faust.worker import Worker

    from kernelstream.app.worker.faust_app import create_app

    app = create_app(settings, bootstrap, window_consumer=early, capabilities=caps)
    # What start-up created (modules, the app, its agents) lives as long as the process:
    # out of the collector's sight, a full collection scans only what came after.
    gc.freeze()
    retain_heap(settings.worker_heap_retain_mib)
    code, why = 0, None
    try:
        Worker(
            app, loop=loop, loglevel=loglevel, quiet=True, override_logging=False
        ).execute_from_commandline()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        raise
    except BaseException as exc:  # the command says it once the process can exit
        code, why = 1, exc
        raise
    finally:
        exit_without_stuck_threads(code, THREADS_EXIT_S, why)


# How long the worker's own threads get to end once its event loop has stopped (they end
# in milliseconds when nothing is stuck).
THREADS_EXIT_S = 5.0


def exit_without_stuck_threads(code: int, wait_s: float, why: BaseException | None = None) -> None:
    """Once the worker has stopped: wait up to ``wait_s`` for its other non-daemon
    threads to end, and where one does not, say which and end the process with ``code``.

    Python does not exit while such a thread runs, and Faust's consumer runs in one
    (a thread of its own with its own event loop): where its stop hung (in a group join
    that was in progress when the worker stopped), the worker's process never exited
    after SIGTERM and waited for a SIGKILL. Everything the worker
    keeps is written by then (the window agent hands over and closes its checkpoint
    store first), so exiting without the thread loses nothing. ``why``: the exception
    the worker stopped with, said here since the command cannot say it any more.
    """
    deadline = time.monotonic() + wait_s
    main = threading.main_thread()
    others = [t for t in threading.enumerate() if t is not main and not t.daemon]
    for t in others:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in others if t.is_alive()]
    if stuck:
        log.error(
            "the worker stopped%s but its threads %s did not within %.0f s; exiting without them",
            f" ({why})" if why is not None else "",
            ", ".join(stuck),
            wait_s,
        )
        logging.shutdown()
        os._exit(code)
