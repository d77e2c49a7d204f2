"""The Grafana dashboard's queries use only metric names the code exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from kernelstream.app.observability.metrics import exported_names

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kernelstream.json"
# process_* come from prometheus_client's process collector, registered by app.metrics.
PROCESS = {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"}
_FUNCS = {
    "sum", "avg", "min", "max", "count", "rate", "increase", "irate", "by", "without",
    "histogram_quantile", "topk", "bottomk", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "offset", "abs", "clamp_min", "clamp_max", "delta", "deriv",
    "vector",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Identifiers of a PromQL expression that name metrics (not functions or labels)."""
    expr = re.sub(r'"[^"]*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\((?:by|without)?\s*\)", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))
    return {n for n in names if n not in _FUNCS}


def targets(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for v in node.values() for e in targets(v)]
    if isinstance(node, list):
        return [e for v in node for e in targets(v)]
    return []


def test_metric_names_parser() -> None:
    expr = "sum by (stage, reason) (increase(kernelstream_worker_dead_letters_total[5m]))"
    assert metric_names(expr) == {"kernelstream_worker_dead_letters_total"}
    expr = "histogram_quantile(0.95, sum by (le) (rate(x_bucket[5m]))) or vector(0)"
    assert metric_names(expr) == {"x_bucket"}
    got = metric_names('process_resident_memory_bytes{job="kernelstream-worker"} + up')
    assert got == {"process_resident_memory_bytes", "up"}


def test_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = targets(dash["panels"])
    assert len(exprs) >= 10
    known = exported_names() | PROCESS
    used = set().union(*(metric_names(e) for e in exprs))
    assert used <= known, f"unknown metrics in the dashboard: {sorted(used - known)}"


def test_dashboard_shows_what_an_operator_watches() -> None:
    used = set().union(*(metric_names(e) for e in targets(json.loads(DASHBOARD.read_text()))))
    for name in (
        "kernelstream_node_launches_total",  # fleet throughput
        "kernelstream_worker_consumer_lag",
        "kernelstream_node_consumer_lag",  # the nodes' recommendation consumer
        "kernelstream_node_kernel_duration_seconds",
        "kernelstream_node_kernel_speedup",
        "kernelstream_worker_findings_total",
        "kernelstream_node_recommendations_total",  # applied / rejected / rolled back
        "kernelstream_worker_outcomes_total",
        "kernelstream_worker_dead_letters_total",
        "kernelstream_node_dead_letters_total",
        "kernelstream_node_outbox_bytes",
        "kernelstream_node_tick_lag_seconds",
        "kernelstream_worker_window_latency_seconds_bucket",
        "kernelstream_node_recommendation_latency_seconds_bucket",
        "kernelstream_node_copy_bytes_total",  # achieved copy bandwidth
        "kernelstream_node_copy_seconds_total",
        "kernelstream_node_host_gap_seconds_total",
        "kernelstream_node_host_waits_total",
    ):
        assert name in used, name
