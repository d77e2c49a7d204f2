"""Prometheus metrics of workers and nodes: every metric kernelstream exports, in one place.

:data:`METRICS` names each metric once (name, type, labels, help); the collectors
below read the processes' existing counters at scrape time (the worker's
``WorkerContext.counters`` and window-agent stats, the node's report, outbox and
inbox), so the hot paths carry no metric code of their own. The Grafana dashboard
in ``deploy/`` may use only these names (checked by a test).

>>> "kernelstream_worker_launches_total" in exported_names()
True
>>> sorted({m.source for m in METRICS})
['node', 'worker']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE",
    "METRICS",
    "KernelSpeed",
    "MetricSpec",
    "NodeMetrics",
    "exported_names",
    "render",
    "worker_registry",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric. A counter's samples carry the ``_total`` suffix."""

    name: str
    kind: Literal["counter", "gauge"]
    help: str
    labels: tuple[str, ...] = ()
    source: Literal["worker", "node"] = "worker"

    @property
    def sample_name(self) -> str:
        return f"{self.name}_total" if self.kind == "counter" else self.name

    def family(self) -> CounterMetricFamily | GaugeMetricFamily:
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        return cls(self.name, self.help, labels=list(self.labels))


def _w(name: str, kind: Literal["counter", "gauge"], help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, kind, help, labels, "worker")


def _n(name: str, kind: Literal["counter", "gauge"], help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, kind, help, ("node", *labels), "node")


METRICS: tuple[MetricSpec, ...] = (
    # --- worker ---------------------------------------------------------------
    _w("kernelstream_ready", "gauge", "1 when this process is ready (see /readyz), else 0."),
    _w(
        "kernelstream_worker_launches",
        "counter",
        "Launch records accepted by the window agent (rate = records/s).",
    ),
    _w("kernelstream_worker_launch_batches", "counter", "Launch batches accepted."),
    _w("kernelstream_worker_windows", "counter", "Window aggregates emitted."),
    _w(
        "kernelstream_worker_late_launches",
        "counter",
        "Launches later than the allowed lateness, sent to the late topic.",
    ),
    _w(
        "kernelstream_worker_duplicate_launches",
        "counter",
        "Launches received again (resent or replayed) and counted once.",
    ),
    _w("kernelstream_worker_open_windows", "gauge", "Windows open in this worker."),
    _w(
        "kernelstream_worker_findings",
        "counter",
        "Window classifications by the detector.",
        "classification",
    ),
    _w("kernelstream_worker_recommendations", "counter", "Recommendations published."),
    _w(
        "kernelstream_worker_outcomes",
        "counter",
        "Reconfiguration outcomes seen on the reconfig topic (fleet-wide).",
        "outcome",
    ),
    _w(
        "kernelstream_consumer_lag",
        "gauge",
        "Messages not yet processed per partition (fetch high watermark minus position).",
        "consumer",
        "topic",
        "partition",
    ),
    _w(
        "kernelstream_worker_assigned_partitions",
        "gauge",
        "Partitions assigned to this worker.",
        "consumer",
    ),
    MetricSpec(
        "kernelstream_dead_letters",
        "counter",
        "Records sent to the dead-letter topic, by stage and reason code (workers and nodes).",
        ("stage", "reason"),
        "worker",
    ),
    # --- node -----------------------------------------------------------------
    _n("kernelstream_node_ready", "gauge", "1 when this node is ready (see /readyz), else 0."),
    _n("kernelstream_node_launches", "counter", "Launches run and published (rate = records/s)."),
    _n("kernelstream_node_batches", "counter", "Launch batches published."),
    _n(
        "kernelstream_node_recommendations",
        "counter",
        "Recommendations by outcome on this node: applied, rejected, kept, rolled_back.",
        "outcome",
    ),
    _n(
        "kernelstream_kernel_duration_seconds",
        "gauge",
        "Recent mean duration of a kernel under its current configuration.",
        "device_model",
        "kernel",
    ),
    _n(
        "kernelstream_kernel_speedup",
        "gauge",
        "Mean duration under the default configuration / under the current one.",
        "device_model",
        "kernel",
    ),
    _n("kernelstream_outbox_depth", "gauge", "Messages in the node's outbox not yet delivered."),
    _n("kernelstream_outbox_bytes", "gauge", "Bytes in the node's outbox not yet delivered."),
    _n("kernelstream_outbox_send_failures", "counter", "Failed sends (retried in order)."),
    _n(
        "kernelstream_outbox_dropped_launches",
        "counter",
        "Launches dropped because the outbox was full during an outage.",
    ),
    _n(
        "kernelstream_node_dead_letters",
        "counter",
        "Dead letters written by the node, by reason code.",
        "reason",
    ),
    _n("kernelstream_node_tick_lag_seconds", "gauge", "Worst overrun of the launch loop's tick."),
)

_BY_NAME = {m.name: m for m in METRICS}


def exported_names() -> set[str]:
    """Every sample name a kernelstream process may export (process_* excluded)."""
    return {m.sample_name for m in METRICS}


def _family(name: str) -> CounterMetricFamily | GaugeMetricFamily:
    return _BY_NAME[name].family()


def render(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus' text exposition format."""
    return bytes(generate_latest(registry))


def _registry(collector: Collector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    ProcessCollector(registry=reg)
    return reg


# --- worker -------------------------------------------------------------------


class _WorkerCollector(Collector):
    """Reads the worker's counters, window stats and consumers at scrape time."""

    def __init__(self, agents: Any, faust_app: Any, ready: Callable[[], bool]) -> None:
        self.agents, self.app, self.ready = agents, faust_app, ready

    def collect(self) -> Iterator[Metric]:
        ctx, stats = self.agents.ctx, self.agents.window_stats
        c = dict(ctx.counters)
        yield _gauge("kernelstream_ready", 1.0 if self.ready() else 0.0)
        yield _count("kernelstream_worker_launches", c.get("launches.in", 0))
        yield _count("kernelstream_worker_launch_batches", stats.batches)
        yield _count("kernelstream_worker_windows", c.get("windows.out", 0))
        yield _count("kernelstream_worker_late_launches", c.get("launches.late", 0))
        yield _count("kernelstream_worker_duplicate_launches", c.get("launches.duplicate", 0))
        yield _gauge("kernelstream_worker_open_windows", self.agents.windower.open_windows())
        yield _count("kernelstream_worker_recommendations", c.get("recommendations.out", 0))
        yield _by_prefix("kernelstream_worker_findings", c, "findings.")
        yield _by_prefix("kernelstream_worker_outcomes", c, "outcomes.")
        dead = _family("kernelstream_dead_letters")
        for key, n in sorted(ctx.dead_letter_counts().items()):
            stage, _, reason = key.rpartition(".")
            dead.add_metric([stage, reason], n)
        yield dead
        lag = _family("kernelstream_consumer_lag")
        assigned = _family("kernelstream_worker_assigned_partitions")
        for consumer, parts in self._lags():
            assigned.add_metric([consumer], len(parts))
            for (topic, partition), n in sorted(parts.items()):
                lag.add_metric([consumer, topic, str(partition)], n)
        yield lag
        yield assigned

    def _lags(self) -> Iterator[tuple[str, dict[tuple[str, int], int]]]:
        window_lag = self.agents.ctx.probes.get("window.lag")
        yield "window", dict(window_lag()) if window_lag else {}
        yield "agents", _faust_lag(self.app)


def _faust_lag(app: Any) -> dict[tuple[str, int], int]:
    """Lag of Faust's own consumer (detector, tuner), from fetch high watermarks."""
    out: dict[tuple[str, int], int] = {}
    consumer = getattr(app, "_consumer", None)  # never create one just to be scraped
    if consumer is None:
        return out
    try:
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            read = consumer._read_offset.get(tp)  # last offset handed to an agent
            if high is not None:
                out[(tp.topic, tp.partition)] = max(0, high - (read + 1 if read is not None else 0))
    except Exception:  # the consumer thread not started yet or stopping
        return out
    return out


def worker_registry(agents: Any, faust_app: Any, ready: Callable[[], bool]) -> CollectorRegistry:
    """A registry for one worker process (its agents, Faust consumer and readiness)."""
    return _registry(_WorkerCollector(agents, faust_app, ready))


# --- node ---------------------------------------------------------------------


@dataclass
class KernelSpeed:
    """Recent mean duration of each (kernel, configuration) a node ran.

    Each observed chunk moves the mean of its configuration by ``alpha`` (weighted
    by launches), so the gauge follows a configuration's current speed without
    keeping history. The default configuration's mean is kept from its own launches.

    >>> import numpy as np
    >>> ks = KernelSpeed({"k": "c0"})
    >>> ks.observe("k", "c0", np.array([20.0, 20.0]), np.array([True, True]))
    >>> ks.observe("k", "c1", np.array([10.0]), np.array([True]))
    >>> ks.speedup("k", "c1"), ks.mean_us("k", "c1")
    (2.0, 10.0)
    """

    default_config: dict[str, str]
    alpha: float = 0.2
    _mean: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, kernel: str, config_id: str, duration_us: Any, ok: Any) -> None:
        good = duration_us[ok]
        if not len(good):
            return
        m = float(good.mean())
        key = (kernel, config_id)
        old = self._mean.get(key)
        a = min(1.0, self.alpha * len(good) / 100) if old is not None else 1.0
        self._mean[key] = m if old is None else old + max(a, 0.01) * (m - old)

    def mean_us(self, kernel: str, config_id: str) -> float | None:
        return self._mean.get((kernel, config_id))

    def speedup(self, kernel: str, config_id: str) -> float | None:
        base = self.mean_us(kernel, self.default_config.get(kernel, ""))
        cur = self.mean_us(kernel, config_id)
        if base is None or cur is None or cur <= 0:
            return None
        return base / cur


class NodeMetrics(Collector):
    """The node's metrics: attach it to a running node (``run_node(metrics=...)``)."""

    def __init__(self) -> None:
        self.node: Any = None
        self.speed: KernelSpeed | None = None
        self.registry = _registry(self)

    def attach(self, node: Any) -> None:
        """Called by the node once its parts exist."""
        self.node = node
        self.speed = KernelSpeed({k: st.config_id for k, st in node.runner.kernels.items()})

    def observe(self, chunks: Iterable[Any]) -> None:
        """Durations of the launches of one tick (every chunk holds one configuration)."""
        if self.speed is not None:
            for ch in chunks:
                self.speed.observe(ch.kernel, ch.config_id, ch.duration_us, ch.ok)

    def ready(self) -> bool:
        """Connected to the broker both ways: the outbox producer and the inbox consumer."""
        node = self.node
        return bool(
            node is not None and node.sender.connected.is_set() and node.inbox.ready.is_set()
        )

    def collect(self) -> Iterator[Metric]:
        node = self.node
        nid = [node.s.node_id] if node is not None else [""]
        yield _gauge("kernelstream_node_ready", 1.0 if self.ready() else 0.0, nid)
        if node is None:
            return
        report, ob = node.report, node.outbox.stats
        yield _count("kernelstream_node_launches", report.launches, nid)
        yield _count("kernelstream_node_batches", report.batches, nid)
        rec = _family("kernelstream_node_recommendations")
        for outcome in ("applied", "rejected", "kept", "rolled_back"):
            rec.add_metric([*nid, outcome], report.outcomes.get(outcome, 0))
        yield rec
        yield from self._kernels(node, nid)
        yield _gauge("kernelstream_outbox_depth", ob.pending, nid)
        yield _gauge("kernelstream_outbox_bytes", ob.pending_bytes, nid)
        yield _count("kernelstream_outbox_send_failures", ob.send_failures, nid)
        yield _count("kernelstream_outbox_dropped_launches", ob.dropped_launches, nid)
        dead = _family("kernelstream_node_dead_letters")
        dead.add_metric([*nid, "outbox_full"], ob.dropped_batches)
        dead.add_metric([*nid, "invalid_recommendation"], node.inbox.dead_letters)
        yield dead
        yield _gauge("kernelstream_node_tick_lag_seconds", max(0.0, report.max_tick_lag_s), nid)

    def _kernels(self, node: Any, nid: list[str]) -> Iterator[Metric]:
        duration = _family("kernelstream_kernel_duration_seconds")
        speedup = _family("kernelstream_kernel_speedup")
        model = str(node.device.spec.name)
        for kernel, st in sorted(node.runner.kernels.items()):
            if self.speed is None:
                break
            labels = [*nid, model, kernel]
            mean = self.speed.mean_us(kernel, st.config_id)
            if mean is not None:
                duration.add_metric(labels, mean / 1e6)
            s = self.speed.speedup(kernel, st.config_id)
            if s is not None:
                speedup.add_metric(labels, s)
        yield duration
        yield speedup


# --- helpers ------------------------------------------------------------------


def _count(name: str, value: float, labels: list[str] | None = None) -> Metric:
    fam = _family(name)
    fam.add_metric(labels or [], value)
    return fam


def _gauge(name: str, value: float, labels: list[str] | None = None) -> Metric:
    return _count(name, value, labels)


def _by_prefix(name: str, counters: dict[str, int], prefix: str) -> Metric:
    fam = _family(name)
    for key, n in sorted(counters.items()):
        if key.startswith(prefix):
            fam.add_metric([key[len(prefix) :]], n)
    return fam
