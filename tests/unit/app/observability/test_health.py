"""Worker readiness reasons and the metric list (no broker)."""

from __future__ import annotations

from types import SimpleNamespace

from kernelstream.app.observability.health import worker_readiness
from kernelstream.app.observability.metrics import METRICS, exported_names


def _agents(window_ready: bool | None) -> SimpleNamespace:
    probes = {} if window_ready is None else {"window.ready": lambda: window_ready}
    return SimpleNamespace(ctx=SimpleNamespace(probes=probes))


def test_not_ready_until_both_groups_joined_and_not_rebalancing() -> None:
    joined = SimpleNamespace(rebalancing_count=1, rebalancing=False)
    assert worker_readiness(joined, _agents(None))[0] is False
    assert worker_readiness(joined, _agents(False))[0] is False
    fresh = SimpleNamespace(rebalancing_count=0, rebalancing=False)
    assert worker_readiness(fresh, _agents(True)) == (
        False,
        "the agents' consumer group has not been joined yet",
    )
    busy = SimpleNamespace(rebalancing_count=2, rebalancing=True)
    assert worker_readiness(busy, _agents(True)) == (False, "rebalancing")
    assert worker_readiness(joined, _agents(True)) == (True, "ready")


def test_metric_names_unique_and_one_scheme() -> None:
    """``kernelstream_<worker|node>_<what>``; what both kinds export has the same labels."""
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(m.name.startswith(f"kernelstream_{m.source}_") for m in METRICS)
    assert all(not n.endswith("_total") for n in names)  # the client adds it to counters
    assert all("node" in m.labels for m in METRICS if m.source == "node")
    by_suffix: dict[str, dict[str, tuple[str, ...]]] = {}
    for m in METRICS:
        labels = tuple(lb for lb in m.labels if lb != "node")
        by_suffix.setdefault(m.name.split("_", 2)[2], {})[m.source] = (m.kind, *labels)
    for what in ("ready", "consumer_lag", "dead_letters"):
        assert by_suffix[what]["worker"] == by_suffix[what]["node"], what
    assert "kernelstream_worker_dead_letters_total" in exported_names()
    assert "kernelstream_worker_window_latency_seconds_bucket" in exported_names()


def test_counters_exist_at_zero_before_their_first_event() -> None:
    """``increase()`` counts the first dead letter only if Prometheus saw its series at 0."""
    from prometheus_client.parser import text_string_to_metric_families

    from kernelstream.agents.context import WorkerContext
    from kernelstream.agents.window_agent import WindowAgentStats
    from kernelstream.app.observability.metrics import (
        CLASSIFICATIONS,
        OUTCOMES,
        WORKER_DEAD_LETTERS,
        render,
        worker_registry,
    )

    ctx = WorkerContext(settings=None, topics={})
    agents = SimpleNamespace(
        ctx=ctx, window_stats=WindowAgentStats(), windower=SimpleNamespace(open_windows=lambda: 0)
    )
    samples = [
        s
        for fam in text_string_to_metric_families(
            render(worker_registry(agents, None, lambda: False)).decode()
        )
        for s in fam.samples
    ]

    def labels(name: str, *keys: str) -> set[tuple[str, ...]]:
        found = {tuple(s.labels[k] for k in keys) for s in samples if s.name == name}
        assert all(s.value == 0 for s in samples if s.name == name), name
        return found

    dead = labels("kernelstream_worker_dead_letters_total", "stage", "reason")
    assert dead == set(WORKER_DEAD_LETTERS) and ("window", "invalid_json") in dead
    findings = labels("kernelstream_worker_findings_total", "classification")
    assert findings == {(c,) for c in CLASSIFICATIONS}
    assert labels("kernelstream_worker_outcomes_total", "outcome") == {(o,) for o in OUTCOMES}
    assert labels("kernelstream_worker_window_latency_seconds_count") == {()}


def test_predicted_regressions_count_the_forecasters_raised_alerts() -> None:
    from types import SimpleNamespace

    from prometheus_client.parser import text_string_to_metric_families

    from kernelstream.agents.context import WorkerContext
    from kernelstream.agents.logic.detection import Detector
    from kernelstream.agents.logic.forecast import Forecaster
    from kernelstream.agents.window_agent import WindowAgentStats
    from kernelstream.app.observability.metrics import render, worker_registry
    from kernelstream.bench.alerts import SCENARIOS, windows_of

    ctx = WorkerContext(settings=None, topics={})
    fc, detector = Forecaster(), Detector()
    ctx.probes["alerts.active"] = fc.active_alerts
    drift = next(s for s in SCENARIOS if s.name == "drift 10%/h")
    for w in windows_of(drift, 0, 10.0):
        alerts, _ = fc.observe(detector.classify(w))
        for a in alerts:
            ctx.counters[f"alerts.{a.state}"] += 1
        if any(a.state == "raised" for a in alerts):
            break
    agents = SimpleNamespace(
        ctx=ctx, window_stats=WindowAgentStats(), windower=SimpleNamespace(open_windows=lambda: 0)
    )
    text = render(worker_registry(agents, None, lambda: True)).decode()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert got[("kernelstream_worker_predicted_regressions", (("scope", "stream"),))] == 1
    assert got[("kernelstream_worker_predicted_regressions", (("scope", "fleet_group"),))] == 0
    assert got[("kernelstream_worker_alerts_total", (("state", "raised"),))] == 1
    assert got[("kernelstream_worker_alerts_total", (("state", "crossed"),))] == 0
