"""Benchmark helpers: settings for one run, worker processes, RSS sampling, stats polling."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from kernelstream.app.kafka.embedded import die_with_parent, free_port
from kernelstream.app.settings import Settings

__all__ = [
    "WorkerProc",
    "bench_settings",
    "every_stage_done",
    "every_stage_figures",
    "peer_stats",
    "pinned_cpus",
    "settings_env",
]


# CPUs the benchmark's worker processes run on (None: wherever the scheduler puts them),
# and those of everything else it starts; set by :func:`pinned_cpus`.
_WORKER_CPUS: set[int] | None = None


@contextmanager
def pinned_cpus(on: bool) -> Iterator[dict[str, list[int]] | None]:
    """With ``on``, the benchmark's worker processes run on the machine's last CPU alone
    and this process, with whatever it starts meanwhile (the broker, the fleet), on the
    others, as a worker deployed with a core of its own would: on a small machine the
    broker's and the fleet's threads otherwise take turns on the worker's core. Yields
    the split (None when off); the affinity is restored after.
    """
    global _WORKER_CPUS
    if not on:
        yield None
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("pinning the worker needs at least 2 CPUs")
    worker, rest = {cpus[-1]}, set(cpus[:-1])
    os.sched_setaffinity(0, rest)  # this thread; children and later threads inherit it
    _WORKER_CPUS = worker
    try:
        yield {"worker": sorted(worker), "others": sorted(rest)}
    finally:
        _WORKER_CPUS = None
        os.sched_setaffinity(0, set(cpus))


def _child_setup() -> None:  # runs in the child between fork and exec
    die_with_parent()
    if _WORKER_CPUS is not None:
        os.sched_setaffinity(0, _WORKER_CPUS)


def bench_settings(bootstrap: str, data_dir: Path, **overrides: Any) -> Settings:
    """Settings with topics, app id and state directory unique to one benchmark phase."""
    tag = uuid.uuid4().hex[:8]
    roles = ("launches", "windows", "findings", "recommendations", "reconfig", "late", "deadletter")
    base: dict[str, Any] = {
        "bootstrap": bootstrap,
        "app_id": f"ks-bench-{tag}",
        "data_dir": data_dir / tag,
        "web_port": free_port(),
        **{f"topic_{r}": f"bench-{tag}.{r}" for r in roles},
    }
    data_dir.mkdir(parents=True, exist_ok=True)
    return Settings(**(base | overrides))


def peer_stats() -> dict[str, Any]:
    """A peer's progress as its ``/ks/stats/`` page serves it under ``window``: the
    worker's fields that the benchmark reads (:class:`agents.window_agent.WindowAgentStats`)."""
    clocks = ("first_poll_at", "cpu_at_first_poll", "first_batch_at", "last_batch_at")
    cpu = ("cpu_at_first_batch", "cpu_at_last_batch")
    return dict.fromkeys(clocks + cpu) | {"launches": 0}


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSTREAM_")}
    env["KAFKA_BOOTSTRAP"] = str(settings.bootstrap)
    for name, value in settings.model_dump(exclude={"bootstrap"}).items():
        if value is None or name.startswith(("sasl_", "ssl_")):
            continue
        env[f"KERNELSTREAM_{name.upper()}"] = (
            "[" + ",".join(f'"{v}"' for v in value) + "]"
            if isinstance(value, tuple)
            else str(value)
        )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerProc:
    """A real ``kernelstream worker`` process; its stats page and its RSS."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        argv: list[str] | None = None,
        source: Path | None = None,
    ) -> None:
        """``source``: run the ``kernelstream`` of that source tree (a checkout) instead."""
        self.settings = settings
        self.log_path = log_path
        self.argv = argv or [sys.executable, "-m", "kernelstream.app.cli", "worker"]
        self.source = source
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0

    def start(self) -> WorkerProc:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.spawned_at = time.time()
            env = settings_env(self.settings)
            if self.source is not None:  # ``-m`` looks in the working directory first
                env["PYTHONPATH"] = str(self.source)
            self.proc = subprocess.Popen(
                self.argv,
                env=env,
                cwd=self.source,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup if sys.platform.startswith("linux") else None,
            )
        return self

    def stats(self) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{self.settings.web_port}/ks/stats/"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return dict(orjson.loads(r.read()))
        except OSError:
            return None

    def rss_bytes(self) -> int:
        import psutil

        assert self.proc is not None
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    async def wait_stats(
        self, cond: Any, timeout_s: float, what: str, every_s: float = 0.05
    ) -> dict[str, Any]:
        """Poll the stats page every ``every_s`` until ``cond(stats)``.

        Each poll costs the worker an HTTP request on its event loop (~1 ms): phases
        that time the worker by its own timestamps poll less often.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            st = await asyncio.to_thread(self.stats)
            if st is not None and cond(st):
                return st
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker: no {what} within {timeout_s} s; last stats {st}")
            await asyncio.sleep(every_s)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def running(worker: WorkerProc) -> Iterator[WorkerProc]:
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()


async def every_stage_done(w: WorkerProc, last_batch_at: float) -> dict[str, float]:
    """The moment a worker's tuner and alert stages have taken every finding its window
    agent published, and the worker's CPU clock then (all threads, the clock of its own
    stamps); empty for a worker without the ``read.findings`` counter (an older tree).

    The window agent holds the event loop while its consumer has launches buffered, so
    much of the findings reader's work that feeds those stages can run after the last
    batch: a rate to the last batch leaves it out. The stats page is polled every
    0.1 s. Where the stages are still behind ``idle_timeout_s`` after the last batch, the
    closing of the streams' last windows for idleness, and their findings, count too.
    """
    import psutil

    assert w.proc is not None
    proc = psutil.Process(w.proc.pid)
    while True:
        st = await asyncio.to_thread(w.stats)
        counters = (st or {}).get("counters", {})
        published = sum(n for k, n in counters.items() if k.startswith("findings."))
        read = counters.get("read.findings")
        if published and read is not None and read >= published:
            cpu = proc.cpu_times()
            return {"at": time.time(), "cpu": cpu.user + cpu.system}
        waited = time.time() - last_batch_at
        if waited > 120.0 or (read is None and waited > 20.0):
            return {}
        await asyncio.sleep(0.1)


def every_stage_figures(window: dict[str, Any], done: dict[str, float]) -> dict[str, float]:
    """From the window stage's stats and :func:`every_stage_done`: wall and CPU seconds from
    the first poll until every stage was done, and launches per CPU second over them
    (empty where ``done`` is)."""
    if not done:
        return {}
    cpu_s = done["cpu"] - window["cpu_at_first_poll"]
    return {
        "every_stage_s": done["at"] - window["first_poll_at"],
        "every_stage_cpu_s": cpu_s,
        "every_stage_per_cpu_s": window["launches"] / cpu_s,
    }
