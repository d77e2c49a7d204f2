"""``kernelstream demo --scenario drift``: a predictive alert before the regression.

A kernel that slows down over hours cannot be watched live in a demo, so this
scenario writes three hours of generated launch telemetry at once: a ``matmul`` on
one node, flat for half an hour, then 20% slower per hour (the shape of thermal
throttling or a growing input), with 3% noise. A real worker (ten-second windows)
windows it, the detector classifies it, and the alert agent forecasts it; the demo
follows ``ks.alerts`` and ``ks.findings`` and prints the alert, its lead and the
event time at which the detector's own ``regression`` finding came, so the warning
can be read against it. The node's device samples show its SM clock sagging 15% per
hour after the same half hour (a GPU throttling), which the alert agent forecasts as
a device alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.app.cli.demo import ChildProcesses, DemoFailedError
from kernelstream.app.kafka.embedded import EmbeddedBroker, free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.kernels import get_workload
from kernelstream.kernels.backends.sim_drift import DeviceDrift, device_state
from kernelstream.kernels.devices import get_device_spec
from kernelstream.schemas import (
    Alert,
    DeviceSample,
    Finding,
    LaunchBatch,
    SchemaError,
    decode_any,
    encode,
)

__all__ = ["DriftOutcome", "drifting_launches", "run_drift_demo"]

NODE = "drift-node"
_WINDOW_S = 10.0
_PER_WINDOW = 12
_HOURS = 3.0
_FLAT_H = 0.5
_RATE_PER_H = 0.2
_CLOCK_SAG_PER_H = 0.15


def drifting_launches(node: str, end: float, seed: int = 7) -> list[LaunchBatch]:
    """Three hours of a ``matmul`` (A100 model) ending at ``end``: flat, then +20%/h;
    a device sample per window, the SM clock flat, then sagging 15%/h."""
    rng = np.random.default_rng(seed)
    n = int(_HOURS * 3600 / _WINDOW_S) * _PER_WINDOW
    t0 = end - _HOURS * 3600
    t = t0 + (np.arange(n) + 0.5) * (_WINDOW_S / _PER_WINDOW)
    rise = _RATE_PER_H * np.clip((t - t0) / 3600 - _FLAT_H, 0, None)
    dur = 100.0 * (1 + rise) * (1 + 0.03 * rng.standard_normal(n))
    space = get_workload("matmul", (2048,)).space  # its default: a config workers accept
    per = 20 * _PER_WINDOW
    return [
        make_example_batch(
            [round(float(x), 6) for x in t[i : i + per]],
            [round(float(x), 3) for x in dur[i : i + per]],
            node=node,
            kernel="matmul",
            problem_size=[2048],
            config=dict(space.default),
            config_id=space.config_id(space.default),
            seq_start=i,
            samples=_sagging_clock(t[i : i + per : _PER_WINDOW], t0, rng),
        )
        for i in range(0, n, per)
    ]


def _sagging_clock(times: np.ndarray, t0: float, rng: np.random.Generator) -> list[DeviceSample]:
    """What a sim node with a throttling A100 samples at ``times`` (one per window)."""
    spec = get_device_spec("A100-SXM4-80GB")
    drift = DeviceDrift(clock_sag_per_h=_CLOCK_SAG_PER_H, start_h=_FLAT_H)
    return [
        DeviceSample(t=round(float(t), 6), **device_state(spec, drift, (t - t0) / 3600, rng))
        for t in times
    ]


@dataclass
class DriftOutcome:
    """What the demo saw: the alerts in order, and the first regression finding."""

    t0: float
    alerts: list[Alert]
    regression: Finding | None = None

    def done(self) -> bool:
        crossed = any(a.state == "crossed" and a.scope != "device" for a in self.alerts)
        return crossed and self.device_alert() is not None and self.regression is not None

    def device_alert(self) -> Alert | None:
        return next((a for a in self.alerts if a.scope == "device" and a.state == "raised"), None)


def _clock(t: float, t0: float) -> str:
    m = int((t - t0) // 60)
    return f"+{m // 60}h{m % 60:02d}m"


def _alert_line(a: Alert, t0: float) -> str:
    if a.scope == "device":
        return f"  {_clock(a.at, t0)}  {'ALERT ' if a.state == 'raised' else ''}{a.summary}"
    if a.state == "raised" and a.lead_s is not None:
        return (
            f"  {_clock(a.at, t0)}  ALERT raised ({a.scope}): {a.kernel} on {a.key} forecast to "
            f"cross {a.threshold:.1f} us in {a.lead_s / 60:.0f} min (now {a.level:.1f} us, "
            f"{a.slope_per_h:+.1f} us/h, confidence {a.confidence:.3f})"
        )
    return f"  {_clock(a.at, t0)}  alert {a.state}: {a.summary}"


async def _follow(settings: Settings, bootstrap: str, out: DriftOutcome, timeout_s: float) -> None:
    from aiokafka import AIOKafkaConsumer

    from kernelstream.agents.first_offset import assign_from_first

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **settings.kafka_client_kwargs(),
    )
    await consumer.start()
    deadline = time.monotonic() + timeout_s
    try:
        # From offset 0: the embedded broker's "beginning" can be one too high.
        await assign_from_first(consumer, (settings.topic_alerts, settings.topic_findings))
        while not out.done() and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            for msgs in batch.values():
                for msg in msgs:
                    with contextlib.suppress(SchemaError):
                        _take(decode_any(msg.value), out)
    finally:
        await consumer.stop()


def _take(rec: object, out: DriftOutcome) -> None:
    if isinstance(rec, Alert) and rec.node == NODE:
        out.alerts.append(rec)
    elif (
        isinstance(rec, Finding)
        and rec.node == NODE
        and rec.classification == "regression"
        and out.regression is None
    ):
        out.regression = rec


def _print_timeline(out: DriftOutcome) -> None:
    """Alerts and the first regression finding in event-time order."""
    events: list[tuple[float, str]] = [(a.at, _alert_line(a, out.t0)) for a in out.alerts]
    if out.regression is not None:
        r = out.regression
        events.append((r.window_end, f"  {_clock(r.window_end, out.t0)}  detector: {r.summary}"))
    for _, line in sorted(events):
        print(line, flush=True)


async def _produce(settings: Settings, bootstrap: str, batches: list[LaunchBatch]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **settings.kafka_client_kwargs())
    await producer.start()
    try:
        for b in batches:
            key = b.stream_key.encode()
            await producer.send_and_wait(settings.topic_launches, encode(b), key=key)
    finally:
        await producer.stop()


def _print_verdict(out: DriftOutcome) -> int:
    _print_timeline(out)
    raised = next((a for a in out.alerts if a.state == "raised" and a.scope != "device"), None)
    if raised is None or out.regression is None or out.device_alert() is None:
        print(
            "no kernel alert, device alert and regression seen in time: see the worker's log",
            flush=True,
        )
        return 1
    early = out.regression.window_end - raised.at
    print(
        f"the alert came {early / 60:.0f} min of event time before the detector's first "
        f"regression finding (its forecast lead: {(raised.lead_s or 0) / 60:.0f} min)",
        flush=True,
    )
    return 0


def run_drift_demo(settings: Settings, run_dir: Path, timeout_s: float = 180.0) -> int:
    """Run the drift scenario; return the process exit code."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    broker: EmbeddedBroker | None = None
    children: ChildProcesses | None = None
    try:
        if settings.bootstrap:
            bootstrap = settings.bootstrap
        else:
            broker = EmbeddedBroker(run_dir).start()
            bootstrap = broker.bootstrap
        print(f"broker: {bootstrap}; logs and state in {run_dir}", flush=True)
        asyncio.run(ensure_topics(settings, bootstrap))
        env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "PYTHONUNBUFFERED": "1"}
        children = ChildProcesses(run_dir, env)
        children.spawn(
            "worker",
            ["worker"],
            KERNELSTREAM_DATA_DIR=str(run_dir / "worker"),
            KERNELSTREAM_WEB_PORT=str(free_port()),
            KERNELSTREAM_APP_ID=f"kernelstream-drift-{os.getpid()}",
            KERNELSTREAM_WINDOW_S=str(_WINDOW_S),
        )
        end = time.time() - 60
        batches = drifting_launches(NODE, end)
        t0 = end - _HOURS * 3600
        print(
            f"{sum(len(b.t_end) for b in batches):,} generated launches of matmul on {NODE}, "
            f"{_HOURS:.0f} h of event time from {datetime.fromtimestamp(t0, UTC):%H:%M} UTC: "
            f"flat for {_FLAT_H * 60:.0f} min, then {_RATE_PER_H:.0%} slower per hour, "
            f"the A100's SM clock {_CLOCK_SAG_PER_H:.0%} lower per hour",
            flush=True,
        )
        asyncio.run(_produce(settings, bootstrap, batches))
        out = DriftOutcome(t0, [])
        asyncio.run(_follow(settings, bootstrap, out, timeout_s))
        if children.failed():
            raise DemoFailedError(children.failure_message())
        return _print_verdict(out)
    except KeyboardInterrupt:
        return 130
    finally:
        if children is not None:
            children.stop(timeout_s=1.0)
        if broker is not None:
            broker.stop(timeout_s=1.0)
