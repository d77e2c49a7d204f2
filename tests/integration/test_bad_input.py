"""Every class of bad input through a real worker: dead-lettered with its reason, counted,
and the windows of the good records are exactly those of the good records alone."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.request
from typing import Any

import pytest

from kernelstream.agents.logic.windowing import WindowSpec, aggregate_reference, launch_rows
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, WindowAggregate, encode
from tests.bad_input import bad_inputs, good_batch
from tests.integration.helpers import TopicReader, produce

pytestmark = pytest.mark.integration

_MAX_BYTES = 100_000


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The worker refuses messages over 100 kB, so the oversized case stays small."""
    return settings.model_copy(update={"max_message_bytes": _MAX_BYTES})


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ks/stats/", timeout=5) as resp:
        return dict(json.loads(resp.read()))


async def _scenario(s: Settings, worker: subprocess.Popen[bytes]) -> None:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    now = time.time()
    good = [
        good_batch(s.node_id, kernel, now - 2.5 + 0.5 * i, 50, 50 * i)
        for i in range(4)
        for kernel in ("matmul", "transpose")
    ]
    bad = bad_inputs(good[0], now, oversize_bytes=_MAX_BYTES)
    items: list[tuple[bytes | None, bytes]] = []
    for i, b in enumerate(good):  # bad input interleaved with the good batches
        items.append((b.stream_key.encode(), encode(b)))
        items += [(k, v) for j, (_, _, k, v) in enumerate(bad) if j % len(good) == i]
    await produce(bootstrap, s.topic_launches, items)

    spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s, s.idle_timeout_s)
    want = aggregate_reference(launch_rows(good), spec)
    async with TopicReader(bootstrap, s.topic_windows, s.topic_deadletter) as r:
        await r.until(
            lambda: (
                len(r.records[s.topic_deadletter]) >= len(bad)
                and len(r.records[s.topic_windows]) >= len(want)
            ),
            90,
            "every dead letter and every window",
        )
        await asyncio.sleep(1.0)
        await r.poll()
    letters = [d for d in r.records[s.topic_deadletter] if isinstance(d, DeadLetter)]
    by_message = {(d.key_b64, d.value_b64): d for d in letters}
    assert len(letters) == len(bad), [d.reason for d in letters]
    for name, code, key, value in bad:
        b64 = base64.b64encode
        dl = by_message[(b64(key).decode() if key else None, b64(value).decode())]
        assert dl.reason_code == code and dl.stage == "window" and dl.reason, f"{name}: {dl}"

    got = sorted(
        (w for w in r.records[s.topic_windows] if isinstance(w, WindowAggregate)),
        key=lambda a: (a.stream_key, a.window_start, a.config_id),
    )
    assert [
        (w.stream_key, w.window_start, w.count, w.failures, w.seq_min, w.seq_max) for w in got
    ] == [(w.stream_key, w.window_start, w.count, w.failures, w.seq_min, w.seq_max) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.duration_mean_us == pytest.approx(w.duration_mean_us, rel=1e-9)
        assert g.duration_p95_us == pytest.approx(w.duration_p95_us, rel=1e-9)

    counters = (await asyncio.to_thread(_stats, s.web_port))["counters"]
    for code in {c for _, c, _, _ in bad}:
        expected = sum(1 for _, c, _, _ in bad if c == code)
        assert counters.get(f"deadletter.window.{code}") == expected, counters
    assert worker.poll() is None, "the worker must keep running"


def test_every_bad_input_class_is_dead_lettered_and_good_results_are_unchanged(
    settings: Settings, worker: subprocess.Popen[bytes]
) -> None:
    asyncio.run(_scenario(settings, worker))
