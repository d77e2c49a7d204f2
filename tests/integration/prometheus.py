"""A real Prometheus (Debian's ``prometheus`` package) for tests, and the project's queries.

:class:`PrometheusServer` runs the ``prometheus`` binary on loopback with a scrape
interval of 1 s and the project's alert rules (``deploy/prometheus/alerts.yml``)
loaded. Without the binary the test is skipped with the install command, unless
``KERNELSTREAM_REQUIRE_PROMETHEUS=1`` (set by ``.ci/run``, which installs it) makes
that a failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelstream.app.kafka.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "kernelstream.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
INSTALL_HINT = "apt-get install -y prometheus (Debian/Ubuntu)"

# An alert rule is "<signal> <comparison> <number>": the signal is what must return data.
_RULE = re.compile(r"(?P<signal>.+?)\s*(?:>=|<=|==|!=|>|<)\s*[-+0-9.e]+\s*", re.S)


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the Grafana dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    """Every alert rule of ``deploy/prometheus/alerts.yml``."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def alert_signals() -> list[tuple[str, str]]:
    """``(alert name, signal)`` per rule: its expression without the threshold."""
    out = []
    for rule in alert_rules():
        m = _RULE.fullmatch(rule["expr"])
        assert m, f"{rule['alert']}: expr is not '<signal> <comparison> <number>'"
        out.append((rule["alert"], m["signal"]))
    return out


def binary(name: str) -> str:
    """Path of a Prometheus tool; skips (or fails, in CI) when it is not installed."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed: {INSTALL_HINT}"
        if os.environ.get("KERNELSTREAM_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


class PrometheusServer:
    """One ``prometheus`` process scraping the given worker and node ports."""

    def __init__(self, workdir: Path) -> None:
        self.binary = binary("prometheus")
        self.dir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, worker_ports: list[int], node_ports: list[int]) -> None:
        """Start scraping (job names as in deploy/prometheus/prometheus.yml)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                _job("kernelstream-worker", worker_ports),
                _job("kernelstream-node", node_ports),
            ],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = self.dir / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:  # a query that does not parse: 400 with the error
            body = json.loads(e.read())
        assert body["status"] == "success", f"{params}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now (a parse error fails the test)."""
        data = self._api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return list(data["result"])

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def empty(self, exprs: list[str]) -> list[str]:
        """The expressions that return no data now: no sample, or only NaN ones.

        ``histogram_quantile`` of a rate without observations is NaN: a latency
        panel with nothing to show, which must not pass for data.
        """
        return [e for e in exprs if not any(math.isfinite(v) for v in self.values(e))]

    async def wait_for_data(self, exprs: list[str], timeout_s: float) -> list[str]:
        """Poll until every expression returns data; returns those that never did."""
        deadline = time.monotonic() + timeout_s
        missing = self.empty(exprs)
        while missing and time.monotonic() < deadline:
            await asyncio.sleep(1)
            missing = self.empty(missing)
        return missing

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rules with their evaluation health."""
        return [r for g in self._api("rules")["groups"] for r in g["rules"]]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _job(name: str, ports: list[int]) -> dict[str, Any]:
    return {"job_name": name, "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}
