"""The Apache Kafka launcher's configuration, version and error paths (no JVM started)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
import yaml

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka import apache
from kernelstream.app.kafka.apache import KafkaCluster, SecuredListeners, kafka_libs, kafka_version

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


def test_a_sasl_ssl_listener_is_where_clients_connect(tmp_path: Path) -> None:
    listener = SecuredListeners(tmp_path / "broker.pem", {"ks": "s3cret"}, "SCRAM-SHA-256")
    cluster = KafkaCluster(tmp_path, nodes=3, secured=listener)
    ports = [p for n in cluster.nodes for p in (n.port, n.controller_port, n.client_port)]
    assert len(set(ports)) == 9 and None not in ports
    assert cluster.bootstrap == ",".join(f"127.0.0.1:{n.client_port}" for n in cluster.nodes)
    assert cluster.plaintext_bootstrap == ",".join(n.address for n in cluster.nodes)
    node = cluster.nodes[0]
    props = cluster.server_properties(node)
    assert f"CLIENT://127.0.0.1:{node.client_port}" in props["advertised.listeners"]
    assert props["listener.security.protocol.map"].endswith(",CLIENT:SASL_SSL")
    assert props["inter.broker.listener.name"] == "PLAINTEXT"  # brokers among themselves
    assert props["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-256"
    assert props["listener.name.client.ssl.keystore.location"] == str(tmp_path / "broker.pem")
    assert "ScramLoginModule" in props["listener.name.client.scram-sha-256.sasl.jaas.config"]
    assert "authorizer.class.name" not in props and "MTLS" not in props["listeners"]
    with pytest.raises(BrokerError, match="no mutual-TLS listener"):
        _ = cluster.mtls_bootstrap
    plain = KafkaCluster(tmp_path).nodes[0]
    assert plain.client_port is None and plain.client_address == plain.address


def test_a_mutual_tls_listener_wants_a_certificate_of_the_client_ca(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    listener = SecuredListeners(tmp_path / "broker.pem", {"ks": "pw"}, client_ca=ca, authorize=True)
    cluster = KafkaCluster(tmp_path, secured=listener)
    (node,) = cluster.nodes
    assert len({node.port, node.controller_port, node.client_port, node.mtls_port}) == 4
    assert cluster.mtls_bootstrap == f"127.0.0.1:{node.mtls_port}"
    props = cluster.server_properties(node)
    assert props["listener.security.protocol.map"].endswith(",CLIENT:SASL_SSL,MTLS:SSL")
    assert props["listener.name.mtls.ssl.client.auth"] == "required"
    assert props["listener.name.mtls.ssl.truststore.location"] == str(ca)
    assert props["super.users"] == "User:ANONYMOUS"  # the plaintext listener's, sets the ACLs
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")


@pytest.mark.parametrize(
    ("users", "mechanism", "says"),
    [
        ({}, "SCRAM-SHA-512", "at least one user"),
        ({"ks": "a,b"}, "SCRAM-SHA-512", "not 'a,b'"),
        ({"k=s": "pw"}, "SCRAM-SHA-512", "not 'k=s'"),
        ({"ks": "pw"}, "PLAIN", "a SCRAM mechanism is needed"),
    ],
)
def test_a_sasl_ssl_listener_refuses_what_the_storage_tool_cannot_take(
    tmp_path: Path, users: dict[str, str], mechanism: str, says: str
) -> None:
    with pytest.raises(BrokerError, match=re.escape(says)):
        SecuredListeners(tmp_path / "broker.pem", users, mechanism)


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
