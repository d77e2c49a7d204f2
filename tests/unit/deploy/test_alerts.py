"""The alert rules: valid, on exported metrics, shipped by every deployment, and tested.

``promtool test rules`` runs ``deploy/prometheus/alerts.test.yml``: each rule fires
on a broken fleet and stays quiet on a healthy one. That each rule's signal returns
data from real processes is checked by ``tests/integration/test_metrics.py``.
"""

from __future__ import annotations

import subprocess

import yaml

from kernelstream.app.observability.metrics import exported_names
from tests.integration.prometheus import ALERTS, ROOT, alert_rules, alert_signals, binary
from tests.unit.deploy.test_dashboard import PROCESS, metric_names

PROMETHEUS_MADE = {"up", "ALERTS"}  # series Prometheus writes itself


def test_alert_rules_use_only_exported_metrics() -> None:
    signals = alert_signals()
    assert len(signals) >= 10
    known = exported_names() | PROCESS | PROMETHEUS_MADE
    for alert, signal in signals:
        assert metric_names(signal) <= known, (alert, metric_names(signal) - known)


def test_every_rule_says_what_and_how_bad() -> None:
    for rule in alert_rules():
        assert rule["alert"].startswith("Kernelstream"), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]


def test_every_rule_has_a_firing_test_case() -> None:
    tests = yaml.safe_load((ALERTS.parent / "alerts.test.yml").read_text())["tests"]
    fired = {
        case["alertname"] for t in tests for case in t["alert_rule_test"] if case.get("exp_alerts")
    }
    assert fired == {r["alert"] for r in alert_rules()}


def test_deployments_load_the_rules() -> None:
    prom = yaml.safe_load((ALERTS.parent / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["alerts.yml"]
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    kustomize = yaml.safe_load((ROOT / "deploy" / "k8s" / "kustomization.yaml").read_text())
    files = [f for g in kustomize["configMapGenerator"] for f in g["files"]]
    assert "kernelstream-alerts.yml=../prometheus/alerts.yml" in files


def test_promtool_checks_and_unit_tests_pass() -> None:
    promtool = binary("promtool")
    for args in (
        ["check", "config", str(ALERTS.parent / "prometheus.yml")],
        ["test", "rules", str(ALERTS.parent / "alerts.test.yml")],
    ):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_metrics_page_lists_every_metric_and_alert() -> None:
    from kernelstream.app.observability.metrics import METRICS

    page = (ROOT / "docs" / "operate" / "metrics.md").read_text()
    for m in METRICS:
        assert f"`{m.sample_names[0] if m.kind == 'counter' else m.name}`" in page, m.name
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in page, rule["alert"]
