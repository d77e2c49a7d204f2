"""A broker and a worker of the node's own, for a process given no bootstrap.

The embedded broker (Tansu) and one ``kernelstream worker`` child process, on loopback,
with their state in a folder of the node's: the same pair ``kernelstream demo`` starts.
The worker finds the search spaces of the node's kernels in ``spaces_dir``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import IO

from pydantic import SecretStr

from kernelstream.app.kafka.embedded import (
    EmbeddedBroker,
    cli_command,
    die_with_parent,
    free_port,
)
from kernelstream.app.settings import Settings

__all__ = ["LocalStack", "settings_env"]


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSTREAM_")}
    if settings.bootstrap:
        env["KAFKA_BOOTSTRAP"] = settings.bootstrap
    for name, value in settings.model_dump(exclude={"bootstrap"}).items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        env[f"KERNELSTREAM_{name.upper()}"] = (
            "[" + ",".join(f'"{v}"' for v in value) + "]"
            if isinstance(value, tuple)
            else str(value)
        )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class LocalStack:
    """Starts the embedded broker (when ``settings`` has no bootstrap) and a worker."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.broker: EmbeddedBroker | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start_broker(self) -> str:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.broker = EmbeddedBroker(self.run_dir).start()
        return self.broker.bootstrap

    def start_worker(self, settings: Settings) -> None:
        """A ``kernelstream worker`` child on ``settings`` (its log: ``worker.log``)."""
        settings = settings.model_copy(
            update={"data_dir": self.run_dir / "worker", "web_port": free_port()}
        )
        self._log = (self.run_dir / "worker.log").open("wb")
        self.worker = subprocess.Popen(
            cli_command("worker"),
            env=settings_env(settings),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(15)
            except subprocess.TimeoutExpired:
                self.worker.kill()
                self.worker.wait()
        if self._log is not None:
            self._log.close()
        if self.broker is not None:
            with contextlib.suppress(Exception):
                self.broker.stop()
