"""``kernelstream watch`` against the real embedded broker: filters, table and JSON lines."""

from __future__ import annotations

import asyncio
import io

import orjson
import pytest

from kernelstream.app.cli.watch import watch_topic
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from kernelstream.schemas import Recommendation, encode
from tests.integration.helpers import produce

pytestmark = pytest.mark.integration


def recommendation(node: str, kernel: str, i: int) -> Recommendation:
    return Recommendation(
        id=f"rec/{node}/{kernel}/{i}",
        node=node,
        device_index=0,
        device_model="A100-SXM4-80GB",
        kernel=kernel,
        workload=kernel,
        problem_size=[2048],
        from_config_id="a=1",
        config={"a": 2},
        config_id="a=2",
        reason="test",
        evidence={"x": 1.0},
        expected_gain=0.1 * i,
        issued_at=1_790_000_000.0 + i,
        expires_at=1_790_000_100.0 + i,
    )


def test_watch_filters_and_formats(settings: Settings) -> None:
    bootstrap = str(settings.bootstrap)
    asyncio.run(ensure_topics(settings, bootstrap))
    recs = [
        recommendation(node, kernel, i)
        for i, (node, kernel) in enumerate(
            [("n1", "matmul"), ("n2", "matmul"), ("n1", "transpose"), ("n1", "matmul")]
        )
    ]
    topic = settings.topic_recommendations
    items: list[tuple[bytes | None, bytes]] = [(r.node.encode(), encode(r)) for r in recs]
    asyncio.run(produce(bootstrap, topic, [*items, (b"n1", b"{")]))

    def watch(**kw: object) -> str:
        out = io.StringIO()
        coro = watch_topic(settings, topic, from_beginning=True, out=out, **kw)  # type: ignore[arg-type]
        asyncio.run(asyncio.wait_for(coro, 60))
        return out.getvalue()

    lines = watch(node="n1", kernel="matmul", as_json=True, limit=2).splitlines()
    got = [orjson.loads(line) for line in lines if not line.startswith("#")]
    assert [g["id"] for g in got] == ["rec/n1/matmul/0", "rec/n1/matmul/3"]
    assert got[0] == recs[0].to_wire()

    table = watch(kernel="transpose", limit=1).splitlines()
    assert table[0].startswith("issued") and "transpose" in table[1] and "n1:0" in table[1]

    everything = watch(limit=4)
    assert everything.count("matmul") == 3 and everything.count("issued") == 1
