"""Every class of bad input through a real worker: dead-lettered with its reason, counted,
and the windows of the good records are exactly those of the good records alone; valid
records whose derived ratios overflow a double get their windows and findings.

At real sizes: the worker runs with its default limits (``max_message_bytes`` 8 MiB, the
producer's default ``max_request_size`` of 1,000,000 bytes for its dead letters); the
test's own producer sends up to 16 MiB, so a 9 MiB record reaches the broker as it
would from any client configured for it."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError

from kernelstream.agents.logic.windowing import WindowSpec, aggregate_reference, launch_rows
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, WindowAggregate, encode
from tests.bad_input import OVERFLOWING, bad_inputs, good_batch, overflowing, sequence_inputs
from tests.integration.conftest import settings_env
from tests.integration.helpers import TopicReader, env_security

pytestmark = pytest.mark.integration

_PRODUCER_MAX_BYTES = 16 * 1024 * 1024


async def _produce_large(
    bootstrap: str, topic: str, items: list[tuple[Any, Any]]
) -> list[tuple[Any, Any]]:
    """Produce every item; return those the broker itself refused as too large.

    Apache Kafka refuses a record over its ``message.max.bytes`` (about 1 MiB by default)
    at produce time, so such a record never reaches a worker there; the embedded broker
    takes any size, so the worker's own limit is what is tested on it.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **env_security(),
        acks="all",
        max_request_size=_PRODUCER_MAX_BYTES,
    )
    refused = []
    await producer.start()
    try:
        for key, value in items:
            try:
                await producer.send_and_wait(topic, value, key=key)
            except MessageSizeTooLargeError:
                refused.append((key, value))
    finally:
        await producer.stop()
    return refused


def _outward_address() -> str | None:
    """This machine's non-loopback IPv4 address, if it has one (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        try:
            u.connect(("198.51.100.1", 9))
        except OSError:
            return None
        addr = str(u.getsockname()[0])
    return None if addr.startswith("127.") else addr


def _stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ks/stats/", timeout=5) as resp:
        return dict(json.loads(resp.read()))


async def _scenario(s: Settings, worker: subprocess.Popen[bytes]) -> int:
    """Run every class through the worker; the number of bad messages the topic holds."""
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    now = time.time()
    # Streams start 0.3 s into a second: a window boundary right after a stream's first
    # launch (which good_batch fails) would make a window of no successful launch, which
    # the alert stage rightly dead-letters (series_gap), one per stream, by chance.
    t0 = math.floor(now) - 3 + 0.3
    good = [
        good_batch(s.node_id, kernel, t0 + 0.5 * i, 50, 50 * i)
        for i in range(4)
        for kernel in ("matmul", "transpose")
    ]
    bad = bad_inputs(good[0], now)
    items: list[tuple[bytes | None, bytes | None]] = []
    for i, b in enumerate(good):  # bad input interleaved with the good batches
        items.append((b.stream_key.encode(), encode(b)))
        items += [(k, v) for j, (_, _, k, v) in enumerate(bad) if j % len(good) == i]
        if i == 0:  # right behind the stream's first batch: a copy and forged numbers
            items += [(k, v) for _, _, k, v in sequence_inputs(good[0], now)]
    bad += sequence_inputs(good[0], now)
    # Accepted, with numbers whose quotients overflow a double (one stream each), and
    # a node name at its 200-character limit (longer ids of findings and what follows).
    extreme = [
        overflowing(good_batch(f"x{i}", "matmul", t0, 150, 0), changes)
        for i, changes in enumerate(OVERFLOWING.values())
    ]
    extreme.append(good_batch("n" * 200, "matmul", t0, 150, 0))
    items += [(b.stream_key.encode(), encode(b)) for b in extreme]
    refused = await _produce_large(bootstrap, s.topic_launches, items)
    # Only records over the broker's own size limit may be refused, and only bad ones.
    assert all(len(v or b"") > 1_000_000 for _, v in refused), [len(v) for _, v in refused]
    assert not {(k, v) for k, v in refused} & {(b.stream_key.encode(), encode(b)) for b in good}
    bad = [b for b in bad if (b[2], b[3]) not in set(refused)]

    spec = WindowSpec(s.window_s, s.out_of_orderness_s, s.allowed_lateness_s, s.idle_timeout_s)
    want = aggregate_reference(launch_rows(good + extreme), spec)
    topics = (s.topic_windows, s.topic_deadletter, s.topic_findings)
    async with TopicReader(bootstrap, *topics) as r:
        await r.until(
            lambda: (
                len(r.records[s.topic_deadletter]) >= len(bad)
                and len(r.records[s.topic_windows]) >= len(want)
                and len(r.records[s.topic_findings]) >= len(want)
            ),
            90,
            "every dead letter and every window",
        )
        await asyncio.sleep(1.0)
        await r.poll()
    letters = [d for d in r.records[s.topic_deadletter] if isinstance(d, DeadLetter)]
    by_message = {(d.key_b64, d.value_b64): d for d in letters}
    assert len(letters) == len(bad), sorted(
        Counter((d.stage, d.reason_code) for d in letters).items()
    )
    by_digest = {(d.key_b64, d.value_sha256): d for d in letters}
    assert all(len(m.value) < 1_000_000 for m in r.raw[s.topic_deadletter])
    for name, code, key, value in bad:
        b64 = base64.b64encode
        key_b64 = b64(key).decode() if key is not None else None
        digest = hashlib.sha256(value or b"").hexdigest()
        dl = by_digest[(key_b64, digest)]
        assert dl.reason_code == code and dl.stage == "window" and dl.reason, f"{name}: {dl}"
        assert dl.value_bytes == len(value or b"") and dl.offset is not None
        if not dl.value_truncated:
            assert (key_b64, b64(value or b"").decode()) in by_message

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
        assert g.achieved_gbs == w.achieved_gbs and g.bw_fraction == w.bw_fraction
    # every window has its finding (the extreme streams' too: decoded, so valid)
    found = {(f.node, f.window_start) for f in r.records[s.topic_findings]}
    assert {(w.node, w.window_start) for w in want} <= found

    counters = (await asyncio.to_thread(_stats, s.web_port))["counters"]
    for code in {c for _, c, _, _ in bad}:
        expected = sum(1 for _, c, _, _ in bad if c == code)
        assert counters.get(f"deadletter.window.{code}") == expected, counters
    assert worker.poll() is None, "the worker must keep running"
    assert counters.get("deadletter.window.unpublished") is None, counters
    outward = _outward_address()
    if outward is not None:  # KAFKA_BOOTSTRAP is set, yet the web server is loopback only
        with pytest.raises(OSError):
            socket.create_connection((outward, s.web_port), timeout=2).close()
    return len(bad)


def test_every_bad_input_class_is_dead_lettered_and_good_results_are_unchanged(
    settings: Settings, worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    on_topic = asyncio.run(_scenario(settings, worker))
    # Replay applies the same edge checks: the report over this topic runs to the end.
    report = tmp_path / "report"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelstream.app.cli",
            "replay",
            "--no-progress",
            "--report",
            report,
        ],
        env=settings_env(settings),
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert (report / "index.html").exists()
    totals = json.loads((report / "summary.json").read_text())["totals"]
    launches = 8 * 50 + 150 * len(OVERFLOWING) + 150
    assert totals["launches"] == launches and sum(totals["rejected"].values()) == on_topic, totals
