"""Prometheus metrics of workers and nodes: every metric kernelstream exports, in one place.

:data:`METRICS` names each metric once (name, type, labels, help); the collectors
below read the processes' existing counters at scrape time (the worker's
``WorkerContext.counters`` and window-agent stats, the node's report, outbox and
inbox), so the hot paths carry no metric code of their own beyond two latency
histograms (one bisect per emitted window or applied recommendation). Label values
known in advance are exported at 0 from the first scrape. The Grafana dashboard and
the alert rules in ``deploy/`` may use only these names (checked by tests).

>>> "kernelstream_worker_launches_total" in exported_names()
True
>>> sorted({m.source for m in METRICS})
['node', 'worker']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kernelstream.agents.latency import TICK_LAG_WINDOW_S, LatencyHistogram
from kernelstream.schemas.codec import REASON_CODES
from kernelstream.schemas.records import AlertScope, AlertState, Classification, OutcomeStatus

__all__ = [
    "CLASSIFICATIONS",
    "CONTENT_TYPE",
    "METRICS",
    "NODE_DEAD_LETTERS",
    "OUTCOMES",
    "WORKER_DEAD_LETTERS",
    "KernelSpeed",
    "MetricSpec",
    "NodeMetrics",
    "exported_names",
    "render",
    "worker_registry",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


Kind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True)
class MetricSpec:
    """One exported metric. A counter's samples carry the ``_total`` suffix.

    Names follow one scheme: ``kernelstream_<process>_<what>``, where the process
    is ``worker`` or ``node``; what both kinds export (``_ready``,
    ``_consumer_lag``, ``_dead_letters_total``) has the same suffix and labels.
    """

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    source: Literal["worker", "node"] = "worker"

    @property
    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "counter":
            return (f"{self.name}_total",)
        if self.kind == "histogram":
            return tuple(f"{self.name}_{s}" for s in ("bucket", "sum", "count"))
        return (self.name,)

    def family(self) -> Metric:
        cls = {
            "counter": CounterMetricFamily,
            "gauge": GaugeMetricFamily,
            "histogram": HistogramMetricFamily,
        }[self.kind]
        return cls(self.name, self.help, labels=list(self.labels))


def _w(name: str, kind: Kind, help: str, *labels: str) -> MetricSpec:
    assert name.startswith("kernelstream_worker_"), name  # the naming scheme
    return MetricSpec(name, kind, help, labels, "worker")


def _n(name: str, kind: Kind, help: str, *labels: str) -> MetricSpec:
    assert name.startswith("kernelstream_node_"), name
    return MetricSpec(name, kind, help, ("node", *labels), "node")


_LAG_HELP = "Messages not yet processed per partition (fetch high watermark minus position)."

METRICS: tuple[MetricSpec, ...] = (
    # --- worker ---------------------------------------------------------------
    _w("kernelstream_worker_ready", "gauge", "1 when this worker is ready (see /readyz), else 0."),
    _w(
        "kernelstream_worker_launches",
        "counter",
        "Launch records accepted by the window agent (rate = records/s).",
    ),
    _w("kernelstream_worker_launch_batches", "counter", "Launch batches accepted."),
    _w("kernelstream_worker_windows", "counter", "Window aggregates emitted."),
    _w(
        "kernelstream_worker_window_latency_seconds",
        "histogram",
        "Event time of a window's end to the window's emission (worker clock).",
    ),
    _w(
        "kernelstream_worker_late_launches",
        "counter",
        "Launches later than the allowed lateness, sent to ks.late.",
    ),
    _w(
        "kernelstream_worker_duplicate_launches",
        "counter",
        "Launches received again and counted once.",
    ),
    _w(
        "kernelstream_worker_skipped_launch_messages",
        "counter",
        "Launch messages deleted from the broker (retention) before this worker read them:"
        " their launches are lost. Logged with the offsets.",
    ),
    _w(
        "kernelstream_worker_publish_failed_records",
        "counter",
        "Windows and findings whose record batch the broker did not take after the"
        " producer's retries. Logged with the partition.",
    ),
    _w("kernelstream_worker_open_windows", "gauge", "Windows open in this worker."),
    _w(
        "kernelstream_worker_findings",
        "counter",
        "Window classifications by the detector.",
        "classification",
    ),
    _w(
        "kernelstream_worker_findings_read",
        "counter",
        "Findings taken from the findings topic by the tuner and alert stages (any worker's).",
    ),
    _w("kernelstream_worker_recommendations", "counter", "Recommendations published."),
    _w(
        "kernelstream_worker_outcomes",
        "counter",
        "Reconfiguration outcomes seen on the reconfig topic (fleet-wide).",
        "outcome",
    ),
    _w(
        "kernelstream_worker_alerts",
        "counter",
        "Predictive alerts published to ks.alerts, by state (raised, withdrawn, crossed).",
        "state",
    ),
    _w(
        "kernelstream_worker_predicted_regressions",
        "gauge",
        "Predictive alerts raised and not yet withdrawn or crossed on this worker, by scope.",
        "scope",
    ),
    _w("kernelstream_worker_consumer_lag", "gauge", _LAG_HELP, "consumer", "topic", "partition"),
    _w(
        "kernelstream_worker_assigned_partitions",
        "gauge",
        "Partitions assigned to this worker.",
        "consumer",
    ),
    _w(
        "kernelstream_worker_dead_letters",
        "counter",
        "Records sent to the dead-letter topic, by stage and reason code.",
        "stage",
        "reason",
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
        "kernelstream_node_recommendation_latency_seconds",
        "histogram",
        "A recommendation's issued_at (worker clock) to its application on this node.",
    ),
    _n("kernelstream_node_consumer_lag", "gauge", _LAG_HELP, "consumer", "topic", "partition"),
    _n(
        "kernelstream_node_kernel_duration_seconds",
        "gauge",
        "Recent mean duration of a kernel under its current configuration.",
        "device_model",
        "kernel",
    ),
    _n(
        "kernelstream_node_kernel_speedup",
        "gauge",
        "Mean duration under the default configuration / under the current one.",
        "device_model",
        "kernel",
    ),
    _n(
        "kernelstream_node_outbox_depth",
        "gauge",
        "Messages in the node's outbox not yet delivered.",
    ),
    _n("kernelstream_node_outbox_bytes", "gauge", "Bytes in the node's outbox not yet delivered."),
    _n("kernelstream_node_outbox_send_failures", "counter", "Failed sends (retried in order)."),
    _n(
        "kernelstream_node_outbox_dropped_launches",
        "counter",
        "Launches dropped because the outbox was full during an outage.",
    ),
    _n(
        "kernelstream_node_dead_letters",
        "counter",
        "Records the node sent to the dead-letter topic, by stage and reason code.",
        "stage",
        "reason",
    ),
    _n(
        "kernelstream_node_copy_bytes",
        "counter",
        "Bytes copied by the node's kernels' steps, by direction and pinned (1) or pageable (0).",
        "kernel",
        "direction",
        "pinned",
    ),
    _n(
        "kernelstream_node_copy_seconds",
        "counter",
        "Time spent in copies (CUDA events on a GPU), by direction and pinned or pageable.",
        "kernel",
        "direction",
        "pinned",
    ),
    _n(
        "kernelstream_node_host_gap_seconds",
        "counter",
        "Host time between a kernel's launches (its launch calls, waits, Python).",
        "kernel",
    ),
    _n(
        "kernelstream_node_host_waits",
        "counter",
        "Launches before which the host waited on the device (a synchronization).",
        "kernel",
    ),
    _n(
        "kernelstream_node_tick_lag_seconds",
        "gauge",
        f"Worst overrun of the launch loop's 50 ms tick in the last {TICK_LAG_WINDOW_S:.0f} s.",
    ),
)

#: Label values known in advance: their series exist from the first scrape at 0,
#: so ``increase()`` counts the first event and a healthy system shows 0, not "No data".
CLASSIFICATIONS: tuple[str, ...] = get_args(Classification)
OUTCOMES: tuple[str, ...] = get_args(OutcomeStatus)
ALERT_STATES: tuple[str, ...] = get_args(AlertState)
ALERT_SCOPES: tuple[str, ...] = get_args(AlertScope)
_STAGE_CODES = tuple(c for c in REASON_CODES if c != "outbox_full")
WORKER_DEAD_LETTERS: tuple[tuple[str, str], ...] = tuple(
    (stage, code)
    for stage in ("window", "findings", "tuner", "outcomes", "alerts")
    for code in _STAGE_CODES
)
NODE_DEAD_LETTERS: tuple[tuple[str, str], ...] = (
    ("node.outbox", "outbox_full"),
    *(("node.reconfig", code) for code in _STAGE_CODES),
    *(("node.telemetry", code) for code in _STAGE_CODES),
)

_BY_NAME = {m.name: m for m in METRICS}


def exported_names() -> set[str]:
    """Every sample name a kernelstream process may export (process_* excluded)."""
    return {n for m in METRICS for n in m.sample_names}


def _family(name: str) -> Any:
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
        yield _gauge("kernelstream_worker_ready", 1.0 if self.ready() else 0.0)
        yield _count("kernelstream_worker_launches", c.get("launches.in", 0))
        yield _count("kernelstream_worker_launch_batches", stats.batches)
        yield _count("kernelstream_worker_windows", c.get("windows.out", 0))
        yield _histogram("kernelstream_worker_window_latency_seconds", ctx.window_latency)
        yield _count("kernelstream_worker_late_launches", c.get("launches.late", 0))
        yield _count("kernelstream_worker_duplicate_launches", c.get("launches.duplicate", 0))
        yield _count(
            "kernelstream_worker_skipped_launch_messages", c.get("window.messages_skipped", 0)
        )
        yield _count("kernelstream_worker_publish_failed_records", c.get("publish.failed", 0))
        yield _gauge("kernelstream_worker_open_windows", self.agents.windower.open_windows())
        yield _count("kernelstream_worker_findings_read", c.get("read.findings", 0))
        yield _count("kernelstream_worker_recommendations", c.get("recommendations.out", 0))
        yield _by_prefix("kernelstream_worker_findings", c, "findings.", CLASSIFICATIONS)
        yield _by_prefix("kernelstream_worker_outcomes", c, "outcomes.", OUTCOMES)
        yield _by_prefix("kernelstream_worker_alerts", c, "alerts.", ALERT_STATES)
        yield self._predicted()
        yield _dead_letters("kernelstream_worker_dead_letters", [], WORKER_DEAD_LETTERS, {
            tuple(key.rsplit(".", 1)): n for key, n in ctx.dead_letter_counts().items()
        })  # fmt: skip
        lag = _family("kernelstream_worker_consumer_lag")
        assigned = _family("kernelstream_worker_assigned_partitions")
        for consumer, parts in self._lags():
            assigned.add_metric([consumer], len(parts))
            for (topic, partition), n in sorted(parts.items()):
                lag.add_metric([consumer, topic, str(partition)], n)
        yield lag
        yield assigned

    def _predicted(self) -> Metric:
        active = self.agents.ctx.probes.get("alerts.active")
        by_scope = dict.fromkeys(ALERT_SCOPES, 0)
        for alert_id, _key, _lead in active() if active else []:
            scope = alert_id.split("|", 1)[0]
            by_scope[scope] = by_scope.get(scope, 0) + 1
        fam = _family("kernelstream_worker_predicted_regressions")
        for scope, n in sorted(by_scope.items()):
            fam.add_metric([scope], n)
        return fam

    def _lags(self) -> Iterator[tuple[str, dict[tuple[str, int], int]]]:
        window_lag = self.agents.ctx.probes.get("window.lag")
        yield "window", dict(window_lag()) if window_lag else {}
        findings_lag = self.agents.ctx.probes.get("findings.lag")
        yield "findings", dict(findings_lag()) if findings_lag else {}
        yield "agents", _faust_lag(self.app)


def _faust_lag(app: Any) -> dict[tuple[str, int], int]:
    """Lag of Faust's own consumer (the tuner's reconfiguration outcomes), from fetch high
    watermarks."""
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
        self.host = HostTally()
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
                self.host.observe(ch)

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
        for outcome in OUTCOMES:
            rec.add_metric([*nid, outcome], report.outcomes.get(outcome, 0))
        yield rec
        latency = node.recommendation_latency
        yield _histogram("kernelstream_node_recommendation_latency_seconds", latency, nid)
        lag = _family("kernelstream_node_consumer_lag")
        for (topic, partition), n in sorted(node.inbox.lag().items()):
            lag.add_metric([*nid, "recommendations", topic, str(partition)], n)
        yield lag
        yield from self._kernels(node, nid)
        yield _gauge("kernelstream_node_outbox_depth", ob.pending, nid)
        yield _gauge("kernelstream_node_outbox_bytes", ob.pending_bytes, nid)
        yield _count("kernelstream_node_outbox_send_failures", ob.send_failures, nid)
        yield _count("kernelstream_node_outbox_dropped_launches", ob.dropped_launches, nid)
        dead: dict[tuple[str, ...], int] = {("node.outbox", "outbox_full"): ob.dropped_batches}
        dead.update((("node.reconfig", code), n) for code, n in node.inbox.dead_letters.items())
        dead.update((("node.telemetry", code), n) for code, n in node.report.refused.items())
        yield _dead_letters("kernelstream_node_dead_letters", nid, NODE_DEAD_LETTERS, dead)
        lag_s = max(0.0, node.tick_lag.value(time.monotonic()))
        yield _gauge("kernelstream_node_tick_lag_seconds", lag_s, nid)
        yield from self.host.families(nid, node.runner.kernels)

    def _kernels(self, node: Any, nid: list[str]) -> Iterator[Metric]:
        duration = _family("kernelstream_node_kernel_duration_seconds")
        speedup = _family("kernelstream_node_kernel_speedup")
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


_DIRECTIONS = ("h2d", "d2h", "d2d")


class HostTally:
    """Copies, host gaps and waits of a node's launches, summed for its counters."""

    def __init__(self) -> None:
        self.copy_bytes: dict[tuple[str, str, str], float] = {}
        self.copy_s: dict[tuple[str, str, str], float] = {}
        self.gap_s: dict[str, float] = {}
        self.waits: dict[str, int] = {}

    def observe(self, chunk: Any) -> None:
        """Add one chunk of launches (a :class:`kernels.runner.LaunchChunk`)."""
        k = chunk.kernel
        if chunk.host_gap_us is not None:
            self.gap_s[k] = self.gap_s.get(k, 0.0) + float(chunk.host_gap_us.sum()) / 1e6
        if chunk.host_waited is not None:
            self.waits[k] = self.waits.get(k, 0) + int(chunk.host_waited.sum())
        copies = chunk.copies or {}
        for d, b, us, pin in zip(
            copies.get("direction", ()),
            copies.get("bytes", ()),
            copies.get("duration_us", ()),
            copies.get("pinned", ()),
            strict=True,
        ):
            key = (k, d, str(int(pin)))
            self.copy_bytes[key] = self.copy_bytes.get(key, 0.0) + b
            self.copy_s[key] = self.copy_s.get(key, 0.0) + us / 1e6

    def families(self, nid: list[str], kernels: Iterable[str]) -> Iterator[Metric]:
        """The four families; every kernel of the node, direction and memory kind is
        exported from the first scrape (at 0 until it happens)."""
        names = sorted({*kernels, *self.gap_s, *(k for k, _, _ in self.copy_bytes)})
        keys = [(k, d, pin) for k in names for d in _DIRECTIONS for pin in ("0", "1")]
        for name, values in (
            ("kernelstream_node_copy_bytes", self.copy_bytes),
            ("kernelstream_node_copy_seconds", self.copy_s),
        ):
            fam = _family(name)
            for key in sorted({*keys, *values}):
                fam.add_metric([*nid, *key], values.get(key, 0.0))
            yield fam
        for name, per_kernel in (
            ("kernelstream_node_host_gap_seconds", self.gap_s),
            ("kernelstream_node_host_waits", self.waits),
        ):
            fam = _family(name)
            for kernel in names:
                fam.add_metric([*nid, kernel], per_kernel.get(kernel, 0))
            yield fam


# --- helpers ------------------------------------------------------------------


def _count(name: str, value: float, labels: list[str] | None = None) -> Metric:
    fam = _family(name)
    fam.add_metric(labels or [], value)
    return fam


def _gauge(name: str, value: float, labels: list[str] | None = None) -> Metric:
    return _count(name, value, labels)


def _by_prefix(name: str, counters: dict[str, int], prefix: str, known: tuple[str, ...]) -> Metric:
    """One sample per label value: every known one (0 until counted) and any other seen."""
    values = dict.fromkeys(known, 0)
    values.update((k[len(prefix) :], n) for k, n in counters.items() if k.startswith(prefix))
    fam = _family(name)
    for value, n in sorted(values.items()):
        fam.add_metric([value], n)
    return fam


def _dead_letters(
    name: str,
    labels: list[str],
    known: tuple[tuple[str, str], ...],
    counts: Mapping[tuple[str, ...], int],
) -> Metric:
    """Dead letters by (stage, reason): every known pair (0 until counted) and any other seen."""
    values: dict[tuple[str, ...], int] = dict.fromkeys(known, 0)
    values.update(counts)
    fam = _family(name)
    for key, n in sorted(values.items()):
        fam.add_metric([*labels, *key], n)
    return fam


def _histogram(name: str, h: LatencyHistogram, labels: list[str] | None = None) -> Metric:
    fam = _family(name)
    buckets = [(floatToGoString(bound), n) for bound, n in h.cumulative()]
    fam.add_metric(labels or [], buckets, h.sum)
    return fam
