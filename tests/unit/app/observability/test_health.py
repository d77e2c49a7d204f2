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


def test_metric_names_unique_and_prefixed() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert all(n.startswith("kernelstream_") for n in names)
    assert all(not n.endswith("_total") for n in names)  # the client adds it to counters
    assert "kernelstream_dead_letters_total" in exported_names()
