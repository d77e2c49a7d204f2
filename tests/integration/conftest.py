"""Integration fixtures: one real embedded broker per session, fresh topics per test."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from kernelstream.app.kafka.embedded import EmbeddedBroker, free_port
from kernelstream.app.settings import Settings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker(tmp_path_factory.mktemp("broker")).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def signing_keys() -> tuple[str, str]:
    """The recommender's key pair (private PEM, public PEM): nodes refuse unsigned ones."""
    from kernelstream.schemas.signing import generate_keypair

    private, public = generate_keypair()
    return private.decode(), public.decode()


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path, signing_keys: tuple[str, str]) -> Settings:
    """Settings with topic names, app id and state directory unique to this test."""
    tag = uuid.uuid4().hex[:8]
    # Any: fields named at run time (mypy would match a str dict against
    # BaseSettings' own typed _-prefixed keyword arguments)
    topics: dict[str, Any] = {
        f"topic_{role}": f"t{tag}.{role}"
        for role in (
            "launches",
            "windows",
            "findings",
            "recommendations",
            "reconfig",
            "late",
            "deadletter",
            "alerts",
        )
    }
    return Settings(
        bootstrap=broker.bootstrap,
        app_id=f"ks-test-{tag}",
        data_dir=tmp_path / "worker",
        node_state_dir=tmp_path / "nodes",
        web_port=free_port(),
        partitions=2,
        node_id=f"node-{tag}",
        signing_private_key=SecretStr(signing_keys[0]),
        signing_public_key=signing_keys[1],
        **topics,
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process exactly these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELSTREAM_")}
    env["KAFKA_BOOTSTRAP"] = str(settings.bootstrap)
    for name, value in settings.model_dump(exclude={"bootstrap"}).items():
        if value is None or name.startswith(("sasl_", "ssl_")):
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


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``kernelstream worker`` process on the test's topics."""
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelstream.app.cli", "worker"],
        env=settings_env(settings),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
