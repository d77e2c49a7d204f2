"""The main job: ``kernelstream demo`` runs the whole loop and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KERNELSTREAM_") and k != "KAFKA_BOOTSTRAP"
    }
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _broker_alive(port: str) -> bool:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return any("tansu" in line and f":{port}" in line for line in out.splitlines())


def test_demo_summary_from_windows(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelstream.app.cli",
            "demo",
            "--duration",
            "20",
            "--no-trace",
            "--no-live",
            "--json",
            str(out),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    port = re.search(r"broker: 127\.0\.0\.1:(\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
    assert not _broker_alive(port), "the demo left its broker running"
    series = orjson.loads(out.read_bytes())["series"]
    kernels = {(s["node"], s["kernel"]) for s in series}
    assert {("sim-a100", "matmul"), ("sim-h100", "transpose")} <= kernels
    for s in series:
        assert s["windows"] > 0 and s["default_mean_us"] > 0 and s["final_mean_us"] > 0
        assert s["speedup"] == pytest.approx(s["default_mean_us"] / s["final_mean_us"])
    assert "Summary" in proc.stdout


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelstream.app.cli",
            "demo",
            "--duration",
            "120",
            "--no-trace",
            "--no-live",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A runner started in the background of a non-interactive shell ignores SIGINT,
        # and children inherit that; the demo must see Ctrl-C as a user's terminal sends it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    port = re.search(r"broker: 127\.0\.0\.1:(\d+)", line).group(1)  # type: ignore[union-attr]
    time.sleep(8)
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    assert not _broker_alive(port)
    time.sleep(1)
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "app.cli node --node-id sim-" not in left, "the demo left a node running"
    assert "app.cli worker" not in left, "the demo left its worker running"
