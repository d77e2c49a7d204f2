"""Metrics and health endpoints of a real worker and a real node on the embedded broker.

A ``kernelstream worker`` and a ``kernelstream node`` (sim backend) run as processes;
a bad message is produced so a dead letter exists. Both ``/metrics`` endpoints must
serve every metric of :data:`app.metrics.METRICS` of their kind with sane values,
and ``/readyz`` must say ready only once the process is (and never while it is not).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.observability.metrics import METRICS
from kernelstream.app.settings import Settings
from tests.integration.conftest import settings_env
from tests.integration.helpers import produce
from tests.integration.workers import wait_for

pytestmark = pytest.mark.integration

Samples = dict[str, list[tuple[dict[str, str], float]]]


def get(port: int, path: str) -> tuple[int, bytes]:
    """Status and body; status 0 while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def scrape(port: int) -> Samples:
    status, body = get(port, "/metrics")
    assert status == 200, f"/metrics answered {status}: {body[-2000:]!r}"
    out: Samples = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for lb, v in samples.get(name, []) if all(lb.get(k) == val for k, val in labels.items())
    )


@contextlib.contextmanager
def node_process(settings: Settings, log: Path, **env: str) -> Iterator[int]:
    """A ``kernelstream node`` (sim backend) process; yields its metrics port."""
    port = free_port()
    full = settings_env(settings)
    full.update(KERNELSTREAM_NODE_METRICS_PORT=str(port), KERNELSTREAM_BACKEND="sim", **env)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelstream.app.cli", "node"], env=full, stdout=out, stderr=out
        )
        try:
            yield port
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def node_port(settings: Settings, tmp_path: Path) -> Iterator[int]:
    workloads = '["matmul","transpose"]'
    with node_process(settings, tmp_path / "node.log", KERNELSTREAM_WORKLOADS=workloads) as port:
        yield port


def ready_answer(port: int, statuses: list[int]) -> bool:
    """One /readyz answer (recorded); its body must agree with its status."""
    status, body = get(port, "/readyz")
    statuses.append(status)
    if status == 200:
        assert json.loads(body)["ready"] is True
    elif status:
        assert status == 503 and json.loads(body)["ready"] is False
    return status == 200


async def test_worker_and_node_metrics(
    settings: Settings, worker: subprocess.Popen[bytes], node_port: int
) -> None:
    bootstrap = str(settings.bootstrap)
    await ensure_topics(settings, bootstrap)
    wport = settings.web_port

    # Readiness: poll from start; once 200, the worker's window consumer has its assignment.
    statuses: list[int] = []
    await wait_for(lambda: ready_answer(wport, statuses), 90, "worker /readyz 200")
    stats = json.loads(get(wport, "/ks/stats/")[1])
    assert stats["window"]["assigned_at"] is not None
    assert get(wport, "/healthz")[0] == 200
    await wait_for(lambda: get(node_port, "/readyz")[0] == 200, 60, "node /readyz 200")
    assert get(node_port, "/healthz")[0] == 200

    await produce(bootstrap, settings.topic_launches, [(b"bad-key", b"{not json")])

    def flowing() -> bool:
        w, n = scrape(wport), scrape(node_port)
        return (
            total(w, "kernelstream_worker_recommendations_total") > 0
            and total(w, "kernelstream_dead_letters_total", stage="window") > 0
            and total(n, "kernelstream_node_recommendations_total", outcome="applied") > 0
        )

    await wait_for(flowing, 120, "recommendations applied and a dead letter")
    w, n = scrape(wport), scrape(node_port)

    for m in METRICS:
        assert m.sample_name in (w if m.source == "worker" else n), f"{m.sample_name} missing"
    for name in (
        "kernelstream_worker_launches_total",
        "kernelstream_worker_launch_batches_total",
        "kernelstream_worker_windows_total",
        "kernelstream_worker_findings_total",
        "kernelstream_worker_recommendations_total",
        "kernelstream_worker_outcomes_total",
    ):
        assert total(w, name) > 0, name
    assert total(w, "kernelstream_ready") == 1
    assert total(w, "kernelstream_worker_late_launches_total") >= 0
    assert total(w, "kernelstream_worker_open_windows") >= 0
    assert {lb["consumer"] for lb, _ in w["kernelstream_worker_assigned_partitions"]} == {
        "window",
        "agents",
    }
    lag = w["kernelstream_consumer_lag"]
    assert {lb["topic"] for lb, _ in lag} >= {settings.topic_launches}
    assert all(v >= 0 for _, v in lag)
    dead = {lb["reason"]: v for lb, v in w["kernelstream_dead_letters_total"] if v}
    assert dead == {"invalid_json": 1}, dead
    classes = {lb["classification"] for lb, v in w["kernelstream_worker_findings_total"] if v}
    assert classes, "no classification counted"

    node = settings.node_id
    assert total(n, "kernelstream_node_ready", node=node) == 1
    assert total(n, "kernelstream_node_launches_total", node=node) > 0
    assert total(n, "kernelstream_node_batches_total", node=node) > 0
    assert {lb["outcome"] for lb, _ in n["kernelstream_node_recommendations_total"]} == {
        "applied",
        "rejected",
        "kept",
        "rolled_back",
    }
    kernels = {lb["kernel"]: v for lb, v in n["kernelstream_kernel_speedup"]}
    assert set(kernels) == {"matmul", "transpose"}
    assert all(0 < v < 1000 for v in kernels.values()), kernels
    durations = [v for _, v in n["kernelstream_kernel_duration_seconds"]]
    assert durations and all(0 < v < 1 for v in durations), durations
    assert total(n, "kernelstream_outbox_depth") >= 0
    assert total(n, "kernelstream_outbox_dropped_launches_total") == 0
    assert total(n, "process_resident_memory_bytes") > 0


async def test_node_not_ready_without_broker(settings: Settings, tmp_path: Path) -> None:
    """A node whose broker is unreachable is alive but not ready (and says why)."""
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    with node_process(settings, tmp_path / "node.log", KAFKA_BOOTSTRAP=nowhere) as port:
        await wait_for(lambda: get(port, "/healthz")[0] == 200, 60, "node /healthz")
        status, body = get(port, "/readyz")
        assert status == 503 and json.loads(body)["ready"] is False
        assert total(scrape(port), "kernelstream_node_ready") == 0
