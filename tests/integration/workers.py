"""Real ``kernelstream worker`` processes for integration tests, and their stats page."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.settings import Settings
from kernelstream.schemas import LaunchBatch
from tests.integration.conftest import settings_env


def stats(port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ks/stats/", timeout=2) as r:
            return dict(json.loads(r.read()))
    except OSError:
        return None


async def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.2)


class WorkerProc:
    """One worker process with its own web port and state directory (``<log>.state``)."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.settings = settings.model_copy(
            update={"web_port": free_port(), "data_dir": log.with_suffix(".state")}
        )
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernelstream.app.cli", "worker"],
                env=settings_env(self.settings),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stats(self) -> dict[str, Any]:
        assert self.proc is not None and self.proc.poll() is None, f"worker died: {self.log}"
        return stats(self.settings.web_port) or {}

    def window(self, field: str) -> Any:
        return self.stats().get("window", {}).get(field)

    def counter(self, name: str) -> int:
        return int(self.stats().get("counters", {}).get(name, 0))

    def stop(self) -> None:
        """SIGTERM: a clean shutdown, which hands the worker's partitions over."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill9(self) -> None:
        """SIGKILL: no handover, no flush, no commit."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def closing_batches(batches: list[LaunchBatch], ahead_s: float) -> list[LaunchBatch]:
    """One single-launch batch per stream, ``ahead_s`` after its last launch.

    Sent after the input, it moves every stream's watermark past the input's windows so
    all of them close, without adding launches to them.
    """
    last: dict[str, LaunchBatch] = {}
    for b in batches:
        last[b.stream_key] = b
    return [
        b.model_copy(
            update={
                "seq_start": b.seq_start + len(b.t_end),
                "t_end": [b.t_end[-1] + ahead_s],
                "duration_us": [b.duration_us[-1]],
                "ok": [1],
                "samples": [],
            }
        )
        for b in last.values()
    ]
