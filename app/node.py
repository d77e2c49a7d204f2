"""The node process (``kernelstream node``): workload runner + reconfiguration agent.

Wires a device backend, the workload runner, the telemetry batcher and the
reconfiguration logic to Kafka: launch batches go to the launches topic keyed by
``node:device/kernel``; recommendations are read from this node's own partition
of the recommendations topic; every outcome (applied, kept, rolled back,
rejected) goes to the reconfig topic keyed by fleet group.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from agents.logic.reconfiguration import ReconfigPolicy, Reconfigurator
from agents.reconfig_agent import RecommendationInbox, outcome_record
from app.settings import Settings
from kernels import open_device
from kernels.runner import LaunchBatcher, WorkloadRunner
from schemas import DeviceSample, LaunchBatch, ReconfigOutcome, encode
from schemas.keys import group_key

__all__ = ["NodeReport", "run_node"]

log = logging.getLogger("kernelstream.node")

_TICK_S = 0.05
_SAMPLE_EVERY_S = 1.0


@dataclass
class NodeReport:
    """What a node did, for its own log and for tests."""

    node: str
    launches: int = 0
    batches: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    default_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    final_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_tick_lag_s: float = 0.0


def _open(settings: Settings) -> tuple[Any, list[Any]]:
    device = open_device(
        settings.backend,
        model=settings.device_model,
        device_index=settings.device_index,
        seed=settings.seed,
        trace_file=settings.trace_file,
    )
    workloads = device.workloads()
    if settings.backend != "trace":
        wanted = set(settings.workloads)
        workloads = [w for w in workloads if w.name in wanted]
    return device, workloads


async def run_node(
    settings: Settings,
    bootstrap: str,
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> NodeReport:
    """Run until ``duration_s`` passes or ``stop`` is set; flush and close cleanly."""
    from aiokafka import AIOKafkaProducer

    device, workloads = _open(settings)
    runner = WorkloadRunner(device, workloads, max_launches_per_s=settings.max_launches_per_s)
    batcher = LaunchBatcher(
        device,
        settings.node_id,
        max_launches=settings.batch_max_launches,
        max_delay_s=settings.batch_max_delay_s,
    )
    by_kernel = {w.name: w for w in workloads}
    reconf = Reconfigurator(
        settings.node_id,
        settings.device_index,
        {w.name: w.space for w in workloads},
        {k: runner.config_of(k) for k in by_kernel},
        ReconfigPolicy(max_step=settings.max_step, min_launches=settings.rollback_min_launches),
    )
    report = NodeReport(
        settings.node_id, default_configs={k: runner.config_of(k) for k in by_kernel}
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_request_size=8 * 1024 * 1024,
        **settings.kafka_client_kwargs(),
    )
    await producer.start()
    inbox = RecommendationInbox(settings, bootstrap, producer)
    await inbox.start()
    stop = stop or asyncio.Event()
    deadline = time.monotonic() + duration_s if duration_s else None
    sends: list[asyncio.Future[Any]] = []

    async def publish_outcome(outcome: ReconfigOutcome) -> None:
        report.outcomes[outcome.status] = report.outcomes.get(outcome.status, 0) + 1
        w = by_kernel.get(outcome.kernel)
        size = list(w.problem_size) if w else outcome.problem_size
        key = group_key(outcome.device_model, outcome.workload, size)
        await producer.send(settings.topic_reconfig, encode(outcome), key=key.encode())

    async def send_batches(batches: list[LaunchBatch]) -> None:
        for b in batches:
            report.batches += 1
            report.launches += len(b.t_end)
            sends.append(
                await producer.send(settings.topic_launches, encode(b), key=b.stream_key.encode())
            )

    last_sample = 0.0
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            tick_start = time.time()
            # Safe point: between ticks no launch of any kernel is in flight.
            for rec in inbox.drain():
                decision = reconf.consider(rec, time.time())
                if decision.action == "reject":
                    await publish_outcome(
                        outcome_record(
                            rec,
                            "rejected",
                            decision.reason,
                            reconf.current.get(rec.kernel, {}),
                            rec.config,
                            device,
                            time.time(),
                        )
                    )
                    continue
                before = reconf.current[rec.kernel]
                runner.set_config(rec.kernel, reconf.apply(rec, time.time()))
                await publish_outcome(
                    outcome_record(
                        rec,
                        "applied",
                        "applied at a safe point",
                        before,
                        rec.config,
                        device,
                        time.time(),
                    )
                )
            chunks = await asyncio.to_thread(runner.tick, time.time())
            now = time.time()
            for chunk in chunks:
                reconf.observe(chunk.kernel, chunk.duration_us, chunk.ok)
                await send_batches(batcher.add(chunk, now))
            await send_batches(batcher.due(now))
            for ev in reconf.evaluate(now):
                if ev.status == "rolled_back":
                    runner.set_config(ev.kernel, ev.before_config)
                await publish_outcome(
                    outcome_record(
                        ev.recommendation,
                        ev.status,
                        ev.reason,
                        ev.before_config,
                        ev.after_config,
                        device,
                        now,
                        before_mean_us=ev.before_mean_us,
                        after_mean_us=ev.after_mean_us,
                        before_count=ev.before_count,
                        after_count=ev.after_count,
                    )
                )
            if now - last_sample >= _SAMPLE_EVERY_S:
                last_sample = now
                sample = device.sample()
                if sample:
                    batcher.add_sample(DeviceSample(t=now, **sample))
            sends[:] = [f for f in sends if not f.done()]
            elapsed = time.time() - tick_start
            report.max_tick_lag_s = max(report.max_tick_lag_s, elapsed - _TICK_S)
            await asyncio.sleep(max(0.0, _TICK_S - elapsed))
    finally:
        with contextlib.suppress(Exception):
            await send_batches(batcher.flush())
        if sends:
            await asyncio.gather(*sends, return_exceptions=True)
        await inbox.stop()
        await producer.stop()
        device.close()
        report.final_configs = {k: runner.config_of(k) for k in by_kernel}
    return report
