"""Metrics and health endpoints of a real worker and real nodes, scraped by a real Prometheus.

A ``kernelstream worker`` and two ``kernelstream node`` processes (sim backend, two
device models) run on the embedded broker, and Debian's ``prometheus`` scrapes them
with the project's alert rules loaded. A bad message is produced (after Prometheus
has seen the dead-letter counters at 0) so a dead letter exists. Both kinds of
``/metrics`` endpoint must serve every metric of :data:`METRICS` of their kind with
sane values; every dashboard query and the signal of every alert rule must return
data in Prometheus; ``/readyz`` must say ready only once the process is.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.observability.metrics import (
    CLASSIFICATIONS,
    METRICS,
    NODE_DEAD_LETTERS,
    OUTCOMES,
    WORKER_DEAD_LETTERS,
)
from kernelstream.app.settings import Settings
from tests.integration.conftest import settings_env
from tests.integration.helpers import produce
from tests.integration.prometheus import PrometheusServer, alert_signals, dashboard_queries
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
def node_ports(settings: Settings, tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Two sim nodes: this test's node id on an A100 and a second one on an H100."""
    workloads = '["matmul","transpose"]'
    with (
        node_process(settings, tmp_path / "node.log", KERNELSTREAM_WORKLOADS=workloads) as a,
        node_process(
            settings,
            tmp_path / "node-b.log",
            KERNELSTREAM_WORKLOADS=workloads,
            KERNELSTREAM_NODE_ID=f"{settings.node_id}-b",
            KERNELSTREAM_DEVICE_MODEL="H100-SXM5-80GB",
        ) as b,
    ):
        yield a, b


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[PrometheusServer]:
    """Not started: the test starts it once it knows the ports to scrape."""
    server = PrometheusServer(tmp_path / "prometheus")
    try:
        yield server
    finally:
        server.stop()


def node_ready(port: int) -> bool:
    return get(port, "/readyz")[0] == 200


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
    settings: Settings,
    worker: subprocess.Popen[bytes],
    node_ports: tuple[int, int],
    prometheus: PrometheusServer,
) -> None:
    bootstrap = str(settings.bootstrap)
    await ensure_topics(settings, bootstrap)
    wport, (node_port, node_b_port) = settings.web_port, node_ports
    prometheus.start(worker_ports=[wport], node_ports=[node_port, node_b_port])

    # Readiness: poll from start; once 200, the worker's window consumer has its assignment.
    statuses: list[int] = []
    await wait_for(lambda: ready_answer(wport, statuses), 90, "worker /readyz 200")
    stats = json.loads(get(wport, "/ks/stats/")[1])
    assert stats["window"]["assigned_at"] is not None
    assert get(wport, "/healthz")[0] == 200
    for port in node_ports:
        await wait_for(partial(node_ready, port), 60, "node /readyz 200")
        assert get(port, "/healthz")[0] == 200

    # The first dead letter of a (stage, reason) must count: Prometheus has to have seen
    # its counter at 0 before it happens.
    first = 'kernelstream_worker_dead_letters_total{stage="window",reason="invalid_json"}'
    await wait_for(lambda: prometheus.values(first) == [0.0], 60, "the counter at 0 in Prometheus")
    await produce(bootstrap, settings.topic_launches, [(b"bad-key", b"{not json")])

    def flowing() -> bool:
        w, n = scrape(wport), scrape(node_port)
        return (
            total(w, "kernelstream_worker_recommendations_total") > 0
            and total(w, "kernelstream_worker_dead_letters_total", stage="window") > 0
            and total(n, "kernelstream_node_recommendations_total", outcome="applied") > 0
        )

    await wait_for(flowing, 120, "recommendations applied and a dead letter")
    # The benchmark's clocks: from the start of the poll that brought the first data (it
    # decompressed them), through the first batch counted, to the last one.
    win = json.loads(get(wport, "/ks/stats/")[1])["window"]
    assert win["first_poll_at"] <= win["first_batch_at"] <= win["last_batch_at"]
    assert win["cpu_at_first_poll"] <= win["cpu_at_first_batch"] <= win["cpu_at_last_batch"]
    check_worker_samples(scrape(wport), settings)
    check_node_samples(await node_scrape(node_port), settings.node_id)
    check_node_samples(await node_scrape(node_b_port), f"{settings.node_id}-b")

    queries = dashboard_queries() + [signal for _, signal in alert_signals()]
    assert len(queries) >= 40
    missing = await prometheus.wait_for_data(queries, 90)
    assert not missing, f"no data in Prometheus for: {missing}"

    def counted() -> bool:  # extrapolated by increase(): about 1
        return [round(v) for v in prometheus.values(f"increase({first}[10m])")] == [1]

    await wait_for(counted, 30, "the first dead letter counted by increase()")
    assert all(r["health"] == "ok" for r in prometheus.rules()), prometheus.rules()
    firing = 'ALERTS{alertname="KernelstreamWorkerDeadLetters",reason="invalid_json"}'
    await wait_for(lambda: bool(prometheus.values(firing)), 30, "the dead-letter alert")


def check_worker_samples(w: Samples, settings: Settings) -> None:
    """Every worker metric present with sane values; known label values pre-initialised."""
    for m in METRICS:
        if m.source == "worker":
            assert set(m.sample_names) <= set(w), f"{m.name} missing"
    for name in (
        "kernelstream_worker_launches_total",
        "kernelstream_worker_launch_batches_total",
        "kernelstream_worker_windows_total",
        "kernelstream_worker_findings_total",
        "kernelstream_worker_recommendations_total",
        "kernelstream_worker_outcomes_total",
        "kernelstream_worker_window_latency_seconds_count",
    ):
        assert total(w, name) > 0, name
    assert total(w, "kernelstream_worker_ready") == 1
    assert total(w, "kernelstream_worker_late_launches_total") >= 0
    assert total(w, "kernelstream_worker_open_windows") >= 0
    assert {lb["consumer"] for lb, _ in w["kernelstream_worker_assigned_partitions"]} == {
        "window",
        "findings",
        "agents",
    }
    lag = w["kernelstream_worker_consumer_lag"]
    assert {lb["topic"] for lb, _ in lag} >= {settings.topic_launches}
    assert all(v >= 0 for _, v in lag)
    dead = {(lb["stage"], lb["reason"]): v for lb, v in w["kernelstream_worker_dead_letters_total"]}
    assert set(WORKER_DEAD_LETTERS) <= set(dead)
    assert {k: v for k, v in dead.items() if v} == {("window", "invalid_json"): 1}, dead
    findings = {lb["classification"] for lb, _ in w["kernelstream_worker_findings_total"]}
    assert findings >= set(CLASSIFICATIONS)
    assert {lb["outcome"] for lb, _ in w["kernelstream_worker_outcomes_total"]} >= set(OUTCOMES)
    buckets = w["kernelstream_worker_window_latency_seconds_bucket"]
    count = total(w, "kernelstream_worker_window_latency_seconds_count")
    assert max(v for _, v in buckets) == count  # the +Inf bucket holds every window
    mean = total(w, "kernelstream_worker_window_latency_seconds_sum") / count
    assert 0 < mean < 60, mean  # at least the out-of-orderness, at most the test's length


async def node_scrape(port: int) -> Samples:
    """A scrape of a node in which both kernels have their duration and speedup.

    Those are means under a kernel's current configuration: in the moment after the node
    applies a recommendation (or rolls one back), until that kernel's next launches are
    measured, its two gauges are absent, as they should be. A single scrape right after
    recommendations started to flow could fall in that moment.
    """
    got: list[Samples] = []

    def complete() -> bool:
        n = scrape(port)
        gauges = ("kernelstream_node_kernel_duration_seconds", "kernelstream_node_kernel_speedup")
        have = [{lb["kernel"] for lb, _ in n.get(name, [])} for name in gauges]
        if all(h >= {"matmul", "transpose"} for h in have):
            got.append(n)
            return True
        return False

    await wait_for(complete, 30, "a scrape with both kernels' duration and speedup")
    return got[-1]


def check_node_samples(n: Samples, node: str) -> None:
    """Every node metric present for this node id, with sane values."""
    for m in METRICS:
        if m.source == "node":
            assert set(m.sample_names) <= set(n), f"{m.name} missing"
    assert total(n, "kernelstream_node_ready", node=node) == 1
    assert total(n, "kernelstream_node_launches_total", node=node) > 0
    assert total(n, "kernelstream_node_batches_total", node=node) > 0
    outcomes = {lb["outcome"] for lb, _ in n["kernelstream_node_recommendations_total"]}
    assert outcomes == set(OUTCOMES)
    dead = {(lb["stage"], lb["reason"]) for lb, _ in n["kernelstream_node_dead_letters_total"]}
    assert dead == set(NODE_DEAD_LETTERS)
    kernels = {lb["kernel"]: v for lb, v in n["kernelstream_node_kernel_speedup"]}
    assert set(kernels) == {"matmul", "transpose"}
    assert all(0 < v < 1000 for v in kernels.values()), kernels
    durations = [v for _, v in n["kernelstream_node_kernel_duration_seconds"]]
    assert durations and all(0 < v < 1 for v in durations), durations
    ((labels, lag),) = n["kernelstream_node_consumer_lag"]
    assert labels["consumer"] == "recommendations" and lag >= 0
    assert total(n, "kernelstream_node_outbox_depth") >= 0
    assert total(n, "kernelstream_node_outbox_bytes") >= 0
    assert total(n, "kernelstream_node_outbox_dropped_launches_total") == 0
    assert 0 <= total(n, "kernelstream_node_tick_lag_seconds") < 5
    assert total(n, "process_resident_memory_bytes") > 0


async def test_node_not_ready_without_broker(settings: Settings, tmp_path: Path) -> None:
    """A node whose broker is unreachable is alive but not ready (and says why)."""
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens there
    with node_process(settings, tmp_path / "node.log", KAFKA_BOOTSTRAP=nowhere) as port:
        await wait_for(lambda: get(port, "/healthz")[0] == 200, 60, "node /healthz")
        status, body = get(port, "/readyz")
        assert status == 503 and json.loads(body)["ready"] is False
        assert total(scrape(port), "kernelstream_node_ready") == 0
