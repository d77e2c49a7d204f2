"""The Apache Kafka launcher against the real broker: storage, restart, CLI."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.apache import KafkaCluster, kafka_libs
from kernelstream.app.kafka.capabilities import probe
from kernelstream.app.kafka.embedded import free_port, wait_for_kafka
from tests.integration.conftest import _kafka_unavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def libs() -> Path:
    try:
        return kafka_libs()
    except BrokerError as exc:
        _kafka_unavailable(exc)
        raise


def test_storage_formats_with_a_cluster_id_beginning_with_a_dash(
    libs: Path, tmp_path: Path
) -> None:
    # a random id starts with "-" one time in 64; the storage tool must not read it as an option
    cluster = KafkaCluster(tmp_path, cluster_id="-aCBTgsJQEmYXqLNXaOSXw")
    node = cluster.nodes[0]
    cluster._format(node, cluster._write_config(node))
    meta = (node.data_dir / "meta.properties").read_text()
    assert "cluster.id=-aCBTgsJQEmYXqLNXaOSXw" in meta


def test_a_killed_node_restarts_on_its_storage_and_outlives_the_restarting_thread(
    libs: Path, tmp_path: Path
) -> None:
    with KafkaCluster(tmp_path) as kafka:
        caps = asyncio.run(probe(kafka.bootstrap))
        assert (caps.brokers, caps.idempotent_producer) == (1, True)
        kafka.signal(1, signal.SIGKILL)
        assert not kafka.running
        # as a drill does (asyncio.to_thread): the thread ends once the node serves
        restart = threading.Thread(target=kafka.start_node, args=(1,))
        restart.start()
        restart.join()
        time.sleep(2.0)
        assert kafka.running, "the node died with the thread that restarted it"
        asyncio.run(wait_for_kafka(kafka.bootstrap, 30))


def test_cli_starts_three_brokers_and_stops_them_on_ctrl_c(libs: Path, tmp_path: Path) -> None:
    port = free_port()
    args = ["--engine", "kafka", "--brokers", "3", "--port", str(port), "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelstream.app.cli", "broker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once every broker serves and topics exist
        assert line.startswith(f"broker ready: KAFKA_BOOTSTRAP=127.0.0.1:{port},"), line
        assert asyncio.run(probe(line.split("=")[1].split()[0])).brokers == 3
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    time.sleep(0.5)
    assert proc.returncode == 0
    assert not list(tmp_path.glob("kafka-*")), "the command left its storage behind"
    with pytest.raises(BrokerError):
        asyncio.run(wait_for_kafka(f"127.0.0.1:{port}", 2))
