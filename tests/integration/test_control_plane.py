"""Hostile and faulty recommendations sent to a running node with signing configured.

The test plays the recommender: it holds the Ed25519 private key, the node only
the public key. Forged, unsigned, foreign-key, stale, misaddressed, out-of-space
and too-large-step recommendations are all rejected with a published reason; a
valid one that makes the kernel slower is applied once (a second delivery, and a
third after the node restarts, are rejected as replays) and rolled back while its
launches still fall within two windows of event time.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.node.runtime import run_node
from kernelstream.app.settings import Settings
from kernelstream.kernels import open_device
from kernelstream.schemas import LaunchBatch, Recommendation, ReconfigOutcome, encode
from kernelstream.schemas.signing import Signer, generate_keypair, load_private_key
from tests.integration.helpers import TopicReader, produce

pytestmark = pytest.mark.integration

MODEL = "A100-SXM4-80GB"


def _slowest_neighbor(kernel: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The workload, its start config and the one-step neighbour that runs slowest."""
    device = open_device("sim", model=MODEL, device_index=0, seed=0)
    [w] = [w for w in device.workloads() if w.name == kernel]
    start = w.space.start_config()
    base = float(device.launch(w, start, 200).duration_us.mean())
    worst = max(w.space.neighbors(start), key=lambda c: device.launch(w, c, 200).duration_us.mean())
    assert device.launch(w, worst, 200).duration_us.mean() > 1.2 * base
    return w, start, worst


def _rec(
    w: Any, to: str, rid: str, config: dict[str, Any], start: dict[str, Any], **over: Any
) -> Recommendation:
    now = time.time()
    fields: dict[str, Any] = dict(
        id=rid,
        node=to,
        device_index=0,
        device_model=MODEL,
        kernel=w.name,
        workload=w.name,
        problem_size=list(w.problem_size),
        from_config_id=w.space.config_id(start),
        config=config,
        config_id=w.space.config_id(config) if set(config) == set(w.space.names) else "x",
        reason="test",
        evidence={},
        expected_gain=1.5,
        issued_at=now,
        expires_at=now + 60.0,
    )
    fields.update(over)
    return Recommendation(**fields)


def _outcomes(r: TopicReader, topic: str, rid: str) -> list[ReconfigOutcome]:
    return [
        o for o in r.records[topic] if isinstance(o, ReconfigOutcome) and o.recommendation_id == rid
    ]


async def _scenario(base: Settings, tmp_path: Path) -> None:
    priv, pub = generate_keypair()
    signer = Signer(load_private_key(priv))
    other = Signer(load_private_key(generate_keypair()[0]))
    s = base.model_copy(
        update={
            "workloads": ("matmul",),
            "device_model": MODEL,
            "signing_public_key": pub.decode(),
            "max_step": 2,
        }
    )
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    w, start, slower = _slowest_neighbor("matmul")
    node = s.node_id

    def rec(rid: str, config: dict[str, Any] | None = None, **over: Any) -> Recommendation:
        return _rec(w, node, rid, config or slower, start, **over)

    far = dict(start, block_y=32, items_per_thread=8)  # valid, but 5 steps away
    assert w.space.is_valid(far) and w.space.steps(start, far) > 2
    hostile = {
        "unsigned": (rec("unsigned"), "unsigned"),
        "forged": (signer.sign(rec("forged")).model_copy(update={"expires_at": 1e11}), "forged"),
        "foreign key": (other.sign(rec("foreign")), "unknown key"),
        "stale": (signer.sign(rec("stale", expires_at=time.time() - 5)), "expired"),
        "issued 30 days ago, far expiry": (
            signer.sign(
                rec("old", issued_at=time.time() - 30 * 86_400, expires_at=time.time() + 86_400)
            ),
            "stale: issued",
        ),
        "other node": (signer.sign(rec("other-node", node="someone-else")), "addressed to node"),
        "out of bounds": (
            signer.sign(rec("oob", dict(start, block_x=12))),
            "outside the declared space",
        ),
        "too large a step": (signer.sign(rec("far", far)), "exceeds the allowed 2"),
        "unknown kernel": (
            signer.sign(rec("unknown-kernel", kernel="transpose", workload="transpose")),
            "unknown kernel",
        ),
    }
    valid = encode(signer.sign(rec("valid-regression")))
    key = node.encode()

    stop = asyncio.Event()
    task = asyncio.create_task(run_node(s, bootstrap, stop=stop))
    topic = s.topic_reconfig
    async with TopicReader(bootstrap, topic, s.topic_launches) as r:
        await r.until(lambda: len(r.records[s.topic_launches]) > 3, 60, "the node's first launches")
        await produce(
            bootstrap, s.topic_recommendations, [(key, encode(m)) for m, _ in hostile.values()]
        )
        await r.until(
            lambda: all(_outcomes(r, topic, m.id) for m, _ in hostile.values()),
            60,
            "every rejection",
        )
        for name, (m, reason) in hostile.items():
            [o] = _outcomes(r, topic, m.id)
            assert o.status == "rejected" and reason in o.reason, f"{name}: {o.reason}"

        await produce(bootstrap, s.topic_recommendations, [(key, valid)])
        await r.until(
            lambda: any(o.status == "rolled_back" for o in _outcomes(r, topic, "valid-regression")),
            60,
            "the planted regression rolled back",
        )
        await produce(bootstrap, s.topic_recommendations, [(key, valid)])  # delivered twice
        await r.until(lambda: len(_outcomes(r, topic, "valid-regression")) >= 3, 60, "the replay")
        stop.set()
        await task

        # Restart: the node re-reads its partition (old messages are not replays), then
        # the valid recommendation arrives a third time.
        stop = asyncio.Event()
        task = asyncio.create_task(run_node(s, bootstrap, stop=stop))
        await asyncio.sleep(3.0)
        await produce(bootstrap, s.topic_recommendations, [(key, valid)])
        await r.until(
            lambda: len(_outcomes(r, topic, "valid-regression")) >= 4, 60, "the 2nd replay"
        )
        await asyncio.sleep(1.0)
        await r.poll()
        stop.set()
        await task

        statuses = [o.status for o in _outcomes(r, topic, "valid-regression")]
        assert statuses == ["applied", "rolled_back", "rejected", "rejected"], statuses
        replays = [o for o in _outcomes(r, topic, "valid-regression") if o.status == "rejected"]
        assert all("replayed" in o.reason for o in replays)
        rolled = next(
            o for o in _outcomes(r, topic, "valid-regression") if o.status == "rolled_back"
        )
        assert rolled.after_mean_us is not None and rolled.before_mean_us is not None
        assert rolled.after_mean_us > rolled.before_mean_us

        # Within two windows: the slower configuration's launches (event time) touch at
        # most two tumbling windows before the node switched back.
        bad_id = w.space.config_id(slower)
        windows = {
            math.floor(t / s.window_s)
            for b in r.records[s.topic_launches]
            if isinstance(b, LaunchBatch) and b.config_id == bad_id
            for t in b.t_end
        }
        assert 1 <= len(windows) <= 2, windows
        # Nothing but the hostile ones and the replays was rejected, and nothing else applied.
        assert not any(
            o.status == "applied" and o.recommendation_id != "valid-regression"
            for o in r.records[topic]
            if isinstance(o, ReconfigOutcome)
        )

    audit = [
        orjson.loads(line) for line in (s.node_dir() / "audit.jsonl").read_bytes().splitlines()
    ]
    assert {a["recommendation_id"] for a in audit} >= {m.id for m, _ in hostile.values()}
    assert [a["status"] for a in audit if a["recommendation_id"] == "valid-regression"] == statuses


def test_forged_stale_replayed_and_out_of_bounds_recommendations_are_rejected(
    settings: Settings, tmp_path: Path
) -> None:
    asyncio.run(_scenario(settings, tmp_path))


async def _default_node(base: Settings) -> None:
    """A node with default settings (no verifying key) refuses unsigned and foreign-signed
    recommendations, and says why."""
    s = base.model_copy(
        update={"workloads": ("matmul",), "device_model": MODEL, "signing_public_key": None}
    )
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    w, start, slower = _slowest_neighbor("matmul")
    attacker = Signer(load_private_key(generate_keypair()[0]))
    recs = [
        _rec(w, s.node_id, "unsigned", slower, start),
        attacker.sign(_rec(w, s.node_id, "attacker-signed", slower, start)),
    ]
    stop = asyncio.Event()
    task = asyncio.create_task(run_node(s, bootstrap, stop=stop))
    topic = s.topic_reconfig
    try:
        async with TopicReader(bootstrap, topic, s.topic_launches) as r:
            await r.until(lambda: len(r.records[s.topic_launches]) > 3, 60, "first launches")
            key = s.node_id.encode()
            await produce(bootstrap, s.topic_recommendations, [(key, encode(m)) for m in recs])
            await r.until(lambda: all(_outcomes(r, topic, m.id) for m in recs), 60, "outcomes")
            for m in recs:
                [o] = _outcomes(r, topic, m.id)
                assert o.status == "rejected" and "no verifying key" in o.reason, o.reason
    finally:
        stop.set()
        await task


def test_a_node_with_default_settings_refuses_unsigned_and_foreign_signed(
    settings: Settings,
) -> None:
    asyncio.run(_default_node(settings))
