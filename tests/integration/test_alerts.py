"""Predictive alerts through a real worker: a drifting kernel and its device's sagging
clock are forecast on ks.alerts, findings the forecast cannot use are dead-lettered with
their reason, and replay of the recorded launches yields the very alerts the worker
published."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelstream.agents.alert_agent import forecaster_from_settings
from kernelstream.agents.window_agent import window_spec
from kernelstream.app.cli.demo_drift import drifting_launches
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.replay.analysis import OfflineAnalysis
from kernelstream.app.replay.command import KafkaSource, RangeSpec, analyse
from kernelstream.app.settings import Settings
from kernelstream.schemas import Alert, DeadLetter, Finding, encode
from tests.integration.helpers import TopicReader, produce

pytestmark = pytest.mark.integration

_WINDOW_S = 10.0  # as the drift demo's worker runs
_HOURS = 3.0  # of generated launches (kernelstream.app.cli.demo_drift)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Ten-second windows, so three hours of history is a few hundred messages."""
    return settings.model_copy(update={"window_s": _WINDOW_S})


def _bad_findings(template: Finding) -> list[tuple[str, Finding]]:
    """Findings of another node the forecast must refuse, with the reason code expected."""
    f = template.model_copy(update={"node": "gappy"})
    late = f.model_copy(
        update={"window_start": f.window_start + 7200, "window_end": f.window_end + 7200}
    )
    return [
        ("", f),  # the first window of its series: accepted
        (
            "series_gap",
            f.model_copy(
                update={
                    "window_start": f.window_end,
                    "window_end": f.window_end + 10,
                    "count": 4,
                    "failures": 4,
                    "duration_mean_us": 0.0,
                }
            ),
        ),  # no successful launch
        ("", f),  # the same window again (a restarted worker's copy): skipped, no dead letter
        ("series_gap", late),  # two hours of silence
    ]


async def _live(s: Settings) -> tuple[list[Alert], list[DeadLetter]]:
    bootstrap = str(s.bootstrap)
    await ensure_topics(s, bootstrap)
    batches = drifting_launches(s.node_id, time.time() - 60)  # its clock sags too
    await produce(
        bootstrap, s.topic_launches, [(b.stream_key.encode(), encode(b)) for b in batches]
    )
    async with TopicReader(bootstrap, s.topic_findings, s.topic_alerts, s.topic_deadletter) as r:
        windows = int(_HOURS * 3600 / _WINDOW_S)
        await r.until(lambda: len(r.records[s.topic_findings]) >= windows, 120, "all findings")
        template = r.records[s.topic_findings][0]
        bad = _bad_findings(template)
        key = b"A100-SXM4-80GB/matmul/2048"
        await produce(bootstrap, s.topic_findings, [(key, encode(f)) for _, f in bad])

        def crossed() -> bool:
            return any(a.state == "crossed" for a in r.records[s.topic_alerts])

        def letters() -> list[DeadLetter]:
            return [
                d
                for d in r.records[s.topic_deadletter]
                if isinstance(d, DeadLetter) and d.stage == "alerts"
            ]

        await r.until(
            lambda: (
                crossed()
                and len(letters()) >= len([code for code, _ in bad if code])
                and len(r.records[s.topic_findings]) >= windows + len(bad)
            ),
            120,
            "the drift's alert to cross, and a dead letter per refused finding",
        )
        await asyncio.sleep(2.0)  # anything published after the last finding
        await r.poll()
        assert [d.reason_code for d in letters()] == [code for code, _ in bad if code]
        return [a for a in r.records[s.topic_alerts] if a.node != "gappy"], letters()


async def _replayed(s: Settings) -> list[Alert]:
    analysis = OfflineAnalysis(window_spec(s), forecaster=forecaster_from_settings(s))
    async with KafkaSource(str(s.bootstrap), s.kafka_client_kwargs()) as src:
        await analyse(src, {"launches": s.topic_launches}, RangeSpec(), analysis)
    return analysis.finish().alerts


def test_drift_alert_live_and_replayed(settings: Settings, worker: subprocess.Popen[bytes]) -> None:
    live, letters = asyncio.run(_live(settings))
    assert worker.poll() is None
    raised = [a for a in live if a.state == "raised" and a.scope == "stream"]
    assert raised and raised[0].lead_s is not None and raised[0].lead_s > 0
    assert raised[0].kernel == "matmul" and raised[0].node == settings.node_id
    device = [a for a in live if a.state == "raised" and a.scope == "device"]
    assert [a.metric for a in device] == ["sm_clock_mean_mhz"]
    assert device[0].key == f"{settings.node_id}:0" and device[0].lead_s is not None
    assert all(d.reason for d in letters)
    replayed = asyncio.run(_replayed(settings))

    # ks.alerts is keyed by series: each series' alerts keep their order on its
    # partition, while the order between series depends on how partitions were read.
    def by_series(alerts: list[Alert]) -> list[bytes]:
        return [encode(a) for a in sorted(alerts, key=lambda a: a.key)]

    assert by_series(replayed) == by_series(live)


def test_demo_drift_scenario_warns_before_the_regression(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KERNELSTREAM_") and k != "KAFKA_BOOTSTRAP"
    }
    args = ["demo", "--scenario", "drift", "--run-dir", str(tmp_path / "run")]
    proc = subprocess.run(
        [sys.executable, "-m", "kernelstream.app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    alert = next(i for i, ln in enumerate(lines) if "ALERT raised" in ln)
    assert any("ALERT device" in ln and "SM clock" in ln for ln in lines), proc.stdout
    regression = next(i for i, ln in enumerate(lines) if "detector:" in ln)
    assert alert < regression  # printed in event-time order
    early = re.search(r"the alert came (\d+) min of event time before", proc.stdout)
    assert early is not None and int(early.group(1)) > 0, proc.stdout
