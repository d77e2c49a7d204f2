"""Valid records with values at the edges of their schema, drawn at random (fixed seeds),
through the worker's stages: nothing fails, everything published is valid.

Launch batches with extreme numbers (durations of 0, 5e-324 or an hour, peaks of 1e-300
or 1e300 GB/s, device samples at their limits, host gaps) go through the window agent with
its inline detector; the findings it publishes, then findings drawn directly (what any
producer on ``ks.findings`` could write), go through the tuner and the alert forecaster.
Each of these once found a record that stopped or poisoned a stage
(docs/reliability/bad-input.md).
"""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace
from typing import Any

import pytest

from kernelstream.agents.alert_agent import forecaster_from_settings
from kernelstream.agents.context import WorkerContext
from kernelstream.agents.detector_agent import InlineDetector
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.agents.tuner_agent import recommend_all, tuner_from_settings
from kernelstream.agents.window_agent import WindowIngest
from kernelstream.app.settings import Settings
from kernelstream.kernels import get_workload
from kernelstream.schemas import (
    DeadLetter,
    Finding,
    LaunchBatch,
    Record,
    WindowAggregate,
    decode,
    decode_any,
    encode,
)
from kernelstream.schemas.binary import encode_launch_batch
from tests.bad_input import good_batch

EXTREMES = [0.0, 5e-324, 1e-300, 1e-3, 1.0, 1e4, 1e12, 1e100, 1e300, 1.7e308]
DURATIONS = [0.0, 5e-324, 1e-3, 1.0, 50.0, 3.6e9]


class Topic:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send(self, key: Any = None, value: bytes = b"", partition: Any = None) -> None:
        self.sent.append(value)


def _batch(rnd: random.Random, node: str, kernel: str, t0: float, seq: int) -> LaunchBatch:
    n = 20
    b = good_batch(node, kernel, t0, n, seq)
    changes: dict[str, Any] = {
        "bytes_moved": rnd.choice(EXTREMES),
        "flops": rnd.choice(EXTREMES),
        "occupancy": rnd.choice([0.0, 1e-300, 0.5, 1.0]),
        "waves": rnd.choice(EXTREMES),
        "peak_gbs": rnd.choice(EXTREMES),
        "peak_gflops": rnd.choice(EXTREMES),
        "launch_overhead_us": rnd.choice(EXTREMES),
        "duration_us": [rnd.choice(DURATIONS) for _ in range(n)],
        "samples": [
            {
                "t": t0 + 0.01 * i,
                "sm_clock_mhz": rnd.choice([0.0, 5e-324, 1e4]),
                "mem_used_bytes": rnd.choice([0.0, float(1 << 44)]),
                "power_w": rnd.choice(EXTREMES),
            }
            for i in range(rnd.randint(1, 3))
        ],
        "host_gap_us": [rnd.choice(DURATIONS) for _ in range(n)],
        "host_waited": [rnd.randint(0, 1) for _ in range(n)],
    }
    picked = {k: v for k, v in changes.items() if rnd.random() < 0.6}
    return LaunchBatch.model_validate({**b.to_wire(), **picked})


def _valid(record: Record) -> None:
    assert decode_any(encode(record)) == record


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_extreme_launch_batches_through_window_agent_tuner_and_forecaster(seed: int) -> None:
    rnd = random.Random(seed)
    settings = Settings()
    topics = {role: Topic() for role in ("deadletter", "late", "windows", "findings")}
    ctx = WorkerContext(settings, topics)
    spec = WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05)
    ingest = WindowIngest(None, ctx, Windower(spec), InlineDetector(ctx))
    now = time.time()
    events: list[SimpleNamespace] = []
    for step in range(30):
        for node in ("a", "b", "c"):
            for kernel in ("matmul", "transpose"):
                b = _batch(rnd, node, kernel, now - 8 + 0.2 * step, 20 * step)
                value = encode_launch_batch(b) if rnd.random() < 0.5 else encode(b)
                msg = SimpleNamespace(
                    topic="ks.launches",
                    partition=0,
                    offset=len(events),
                    key=b.stream_key.encode(),
                    value=value,
                )
                events.append(SimpleNamespace(message=msg, key=msg.key, value=msg.value))

    async def run() -> None:
        for i in range(0, len(events), 16):
            await ingest.ingest(events[i : i + 16], set())
        await ingest.publish(ingest.windower.flush_all())

    asyncio.run(run())
    assert [decode(v, DeadLetter).reason for v in topics["deadletter"].sent] == []
    windows = [decode(v, WindowAggregate) for v in topics["windows"].sent]
    findings = [decode(v, Finding) for v in topics["findings"].sent]
    assert len(windows) >= 30 and len(findings) >= len(windows)

    tuner, forecaster = tuner_from_settings(settings), forecaster_from_settings(settings)
    todo = [(f.id, f, get_workload(f.workload, tuple(f.problem_size)).space) for f in findings]
    recs, failed = recommend_all(tuner, todo)
    assert failed == []
    for rec in recs:
        _valid(rec)
    for f in findings:
        alerts, _ = forecaster.observe(f)
        for alert in alerts:
            _valid(alert)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_extreme_findings_through_the_tuner_and_the_forecaster(seed: int) -> None:
    # What any producer on ks.findings could write, within the finding's schema.
    rnd = random.Random(seed)
    settings = Settings()
    tuner, forecaster = tuner_from_settings(settings), forecaster_from_settings(settings)
    space = get_workload("matmul", (2048,)).space
    configs = list(space)[:40]
    for step in range(300):
        node, config = rnd.choice(["a", "b", "c"]), rnd.choice(configs)
        evidence: dict[str, float | int | str | bool] = {"bw_fraction": rnd.choice(EXTREMES)}
        for name in ("sm_clock_mean_mhz", "mem_used_max_bytes", "baseline_us", "expected_gain"):
            if rnd.random() < 0.4:
                evidence[name] = rnd.choice(EXTREMES)
        t = 1.7e9 + step * rnd.choice([0.0, 1.0, 1.0, 1e-9, 1e6])
        finding = Finding(
            id=f"{node}/{step}",
            node=node,
            device_index=0,
            device_model=rnd.choice(["A100-SXM4-80GB", "unknown GPU"]),
            kernel="matmul",
            workload="matmul",
            problem_size=[2048],
            config=dict(config),
            config_id=space.config_id(config),
            window_start=t,
            window_end=t + rnd.choice([1.0, 0.0, 1e-300, 1e9]),
            classification=rnd.choice(["memory_bottleneck", "balanced", "regression"]),
            evidence=evidence,
            summary="s",
            count=rnd.choice([0, 1, 100, 1 << 53]),
            failures=rnd.choice([0, 0, 5]),
            duration_mean_us=rnd.choice(DURATIONS),
        )
        recs, failed = recommend_all(tuner, [(step, finding, space)])
        assert failed == []
        for rec in recs:
            _valid(rec)
        alerts, _ = forecaster.observe(finding)
        for alert in alerts:
            _valid(alert)
