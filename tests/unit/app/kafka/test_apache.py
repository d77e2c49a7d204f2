"""The Apache Kafka launcher's configuration, version and error paths (no JVM started)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import yaml

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka import apache
from kernelstream.app.kafka.apache import KafkaCluster, kafka_libs, kafka_version

ROOT = Path(__file__).resolve().parents[4]


def test_version_is_the_one_compose_and_k8s_run() -> None:
    version = kafka_version()
    assert re.fullmatch(r"4\.\d+\.\d+", version)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{version}"
    config = next(yaml.safe_load_all((ROOT / "deploy/k8s/config.yaml").read_text()))
    assert config["metadata"]["labels"]["kernelstream.io/kafka-version"] == version


def test_three_nodes_form_one_quorum_with_replication(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, nodes=3)
    props = [cluster.server_properties(n) for n in cluster.nodes]
    assert len({p["controller.quorum.voters"] for p in props}) == 1
    assert props[0]["controller.quorum.voters"].count("@127.0.0.1:") == 3
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert len({n.port for n in cluster.nodes} | {n.controller_port for n in cluster.nodes}) == 6
    for p in props:
        assert p["default.replication.factor"] == "3"
        assert p["min.insync.replicas"] == "2"
        assert p["offsets.topic.replication.factor"] == "3"
        assert p["group.initial.rebalance.delay.ms"] == "0"
    assert cluster.bootstrap.count(",") == 2


def test_one_node_needs_no_replicas(tmp_path: Path) -> None:
    (props,) = [KafkaCluster(tmp_path).server_properties(n) for n in KafkaCluster(tmp_path).nodes]
    assert props["default.replication.factor"] == "1"
    assert props["min.insync.replicas"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    # what docker-compose.yml's broker allows: 8 MiB node batches
    assert props["message.max.bytes"] == str(8 << 20)


def test_ports_are_distinct_and_avoid_the_taken_one() -> None:
    ports = apache.distinct_free_ports(64, taken={9092})
    assert len(set(ports)) == 64 and 9092 not in ports


def test_cluster_id_is_kraft_shaped(tmp_path: Path) -> None:
    ids = {KafkaCluster(tmp_path).cluster_id for _ in range(5)}
    assert len(ids) == 5
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{22}", i) for i in ids)


def test_zero_nodes_and_unknown_nodes_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="at least one node"):
        KafkaCluster(tmp_path, nodes=0)
    with pytest.raises(BrokerError, match="no Kafka node 4"):
        KafkaCluster(tmp_path).signal(4, signal.SIGKILL)
    with pytest.raises(BrokerError, match="not running"):
        KafkaCluster(tmp_path).signal(1, signal.SIGKILL)


def test_cached_jars_need_no_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = tmp_path / f"kafka-{kafka_version()}" / "libs"
    libs.mkdir(parents=True)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn anywhere
    assert kafka_libs(tmp_path) == libs


def test_missing_maven_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(BrokerError, match="needs 'mvn' on PATH"):
        kafka_libs(tmp_path)
    assert not (tmp_path / f"kafka-{kafka_version()}" / "libs").exists()


def test_a_failed_fetch_leaves_no_partial_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "mvn").write_text("#!/bin/sh\necho 'Could not resolve dependencies' >&2\nexit 1\n")
    (fake / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    with pytest.raises(BrokerError, match="Could not resolve dependencies"):
        kafka_libs(tmp_path / "cache")
    root = tmp_path / "cache" / f"kafka-{kafka_version()}"
    assert sorted(p.name for p in root.iterdir()) == [".lock"]


def test_default_cache_follows_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert apache.default_cache_dir() == tmp_path / "kernelstream"


def test_kafka_opts_reach_the_jvm_after_its_own_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    monkeypatch.setattr(apache, "kafka_libs", lambda cache_dir=None: libs)
    monkeypatch.setenv("KAFKA_OPTS", "-Xmx1g  -Dlog4j2.configurationFile='/my dir/log.yaml'")
    cmd = KafkaCluster(tmp_path)._java_cmd("kafka.Kafka", "server.properties")
    # split as a shell would, and after the heap and log configuration, which they override
    at = cmd.index("-Xmx1g")
    assert cmd[at : at + 2] == ["-Xmx1g", "-Dlog4j2.configurationFile=/my dir/log.yaml"]
    assert at > cmd.index("-Xmx512m") and at > cmd.index("-XX:+UseSerialGC")
    assert cmd[at + 2 :] == ["-cp", f"{libs}/*", "kafka.Kafka", "server.properties"]
    monkeypatch.delenv("KAFKA_OPTS")
    assert "-Xmx1g" not in KafkaCluster(tmp_path)._java_cmd("kafka.Kafka")
