"""Integration fixtures: real brokers, fresh topics per test.

The session's ``broker`` fixture is parametrized over the engines in
:data:`ENGINES`: every test that uses it (directly or through ``settings``) runs
once on the embedded Tansu broker and once on single-node Apache Kafka, both
started here on loopback. ``KERNELSTREAM_TEST_KAFKA_BOOTSTRAP`` points the Kafka
runs at a cluster that already exists instead (its security settings come from
the usual ``KERNELSTREAM_SECURITY_PROTOCOL``, ``KERNELSTREAM_SASL_*`` and
``KERNELSTREAM_SSL_*`` variables). ``KERNELSTREAM_TEST_ENGINES=tansu`` (or
``kafka``) runs one engine only. A Kafka that cannot start skips its tests on a
developer's machine and fails them with ``CI=true``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.acls import Acl
from kernelstream.app.kafka.apache import KafkaCluster, SecuredListeners
from kernelstream.app.kafka.embedded import EmbeddedBroker, free_port
from kernelstream.app.sdk.local import settings_env
from kernelstream.app.settings import Settings

pytestmark = pytest.mark.integration

ENGINES = ("tansu", "kafka")

# The Apache Kafka brokers this suite starts (and those its subprocesses start) compile
# with the JVM's first-tier compiler only: on a two-core machine a broker's optimizing
# compiler competed with the tests' own workers and nodes for the cores (a 3-node start:
# 30 CPU seconds and 15 s, against 19-22 and 10-11 s this way), and no test measures the
# broker's peak throughput. A KAFKA_OPTS already set is kept.
os.environ.setdefault("KAFKA_OPTS", "-XX:TieredStopAtLevel=1")


@dataclass(frozen=True)
class ExternalKafka:
    """A Kafka cluster this suite did not start (``KERNELSTREAM_TEST_KAFKA_BOOTSTRAP``)."""

    bootstrap: str


def _engines() -> list[str]:
    chosen = os.environ.get("KERNELSTREAM_TEST_ENGINES", ",".join(ENGINES)).split(",")
    unknown = set(chosen) - set(ENGINES)
    if unknown:
        raise pytest.UsageError(f"KERNELSTREAM_TEST_ENGINES: unknown {sorted(unknown)}")
    return chosen


def _kafka_unavailable(exc: Exception) -> None:
    msg = f"Apache Kafka could not start: {exc}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)  # CI has Java and Maven: a Kafka that does not start is a defect
    pytest.skip(msg)


@pytest.fixture(scope="session", params=_engines())
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmbeddedBroker | KafkaCluster | ExternalKafka]:
    """A running broker of each engine (the parameter); its ``bootstrap`` for clients."""
    if request.param == "tansu":
        tansu = EmbeddedBroker(tmp_path_factory.mktemp("broker")).start()
        try:
            yield tansu
        finally:
            tansu.stop()
        return
    existing = os.environ.get("KERNELSTREAM_TEST_KAFKA_BOOTSTRAP")
    if existing:
        yield ExternalKafka(existing)
        return
    try:
        kafka = KafkaCluster(tmp_path_factory.mktemp("kafka"), nodes=1).start()
    except BrokerError as exc:
        _kafka_unavailable(exc)
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A 3-node Apache Kafka cluster of this suite (fault drills signal its nodes)."""
    try:
        cluster = KafkaCluster(tmp_path_factory.mktemp("kafka3"), nodes=3).start()
    except BrokerError as exc:
        _kafka_unavailable(exc)
    try:
        yield cluster
    finally:
        cluster.stop()


# How a client authenticates to the secured cluster: SCRAM over TLS, or its certificate.
TRANSPORTS = ("sasl_ssl", "mtls")


@dataclass(frozen=True)
class SecuredKafka:
    """Apache Kafka whose clients' listeners authenticate them (SASL_SSL, and mutual TLS)
    and whose ACLs decide what each principal may do; what a client needs."""

    cluster: KafkaCluster
    ca: Path  # the certificate of the CA that signed the broker's and the clients'
    users: dict[str, str]  # SCRAM-SHA-512 users: name -> password
    certs: dict[str, tuple[Path, Path]]  # user -> certificate (CN=user), key (password "pw")

    def security(self, user: str, transport: str = "sasl_ssl") -> dict[str, Any]:
        """Settings fields (the bootstrap servers among them) of a client of this cluster
        as ``user``: over SASL_SSL with its password, or over mutual TLS ("mtls") with its
        certificate."""
        if transport == "mtls":
            cert, key = self.certs[user]
            return {
                "bootstrap": self.cluster.mtls_bootstrap,
                "security_protocol": "SSL",
                "ssl_cafile": self.ca,
                "ssl_certfile": cert,
                "ssl_keyfile": key,
                "ssl_password": SecretStr("pw"),
            }
        return {
            "bootstrap": self.cluster.bootstrap,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": user,
            "sasl_password": SecretStr(self.users[user]),
            "ssl_cafile": self.ca,
        }

    @staticmethod
    def principal(user: str, transport: str = "sasl_ssl") -> str:
        """The broker's principal of ``user`` over ``transport``."""
        return f"User:CN={user}" if transport == "mtls" else f"User:{user}"

    def grant(self, principal: str, acls: list[Acl]) -> None:
        """Allow ``principal`` the operations of ``acls`` (set by the cluster's super
        user, on its plaintext listener)."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            AdminClient,
            ResourcePatternType,
            ResourceType,
        )

        bindings = [
            AclBinding(
                ResourceType[acl.resource.upper()],
                acl.name,
                ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
                principal,
                "*",
                AclOperation[op],
                AclPermissionType.ALLOW,
            )
            for acl in acls
            for op in acl.operations
        ]
        admin = AdminClient({"bootstrap.servers": self.cluster.plaintext_bootstrap})
        for done in admin.create_acls(bindings, request_timeout=30).values():
            done.result()


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    """One Apache Kafka node of this suite whose clients authenticate, over SASL_SSL
    (SCRAM-SHA-512) or mutual TLS, the broker's and the clients' certificates signed by a
    CA of the test's own, with ACLs (no ACL, no access), as production clusters run;
    users ``ks-worker`` and ``ks-node``, allowed nothing yet."""
    from tests.pki import PrivateCA

    if "kafka" not in _engines():
        pytest.skip("Apache Kafka is not among KERNELSTREAM_TEST_ENGINES")
    if os.environ.get("KERNELSTREAM_TEST_KAFKA_BOOTSTRAP"):
        pytest.skip("a cluster of the user's (KERNELSTREAM_TEST_KAFKA_BOOTSTRAP) is tested instead")
    work = tmp_path_factory.mktemp("kafka-secured")
    ca = PrivateCA(work)
    users = {"ks-worker": uuid.uuid4().hex, "ks-node": uuid.uuid4().hex}
    certs = {user: ca.client(user) for user in users}
    listeners = SecuredListeners(ca.broker_keystore(), users, authorize=True, client_ca=ca.path)
    try:
        kafka = KafkaCluster(work, nodes=1, secured=listeners).start()
    except BrokerError as exc:
        _kafka_unavailable(exc)
    try:
        yield SecuredKafka(kafka, ca.path, users, certs)
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def signing_keys() -> tuple[str, str]:
    """The recommender's key pair (private PEM, public PEM): nodes refuse unsigned ones."""
    from kernelstream.schemas.signing import generate_keypair

    private, public = generate_keypair()
    return private.decode(), public.decode()


@pytest.fixture
def engine(broker: object) -> str:
    """The engine of this run's broker: ``"tansu"`` or ``"kafka"``."""
    return "tansu" if isinstance(broker, EmbeddedBroker) else "kafka"


@pytest.fixture
def settings(
    broker: EmbeddedBroker | KafkaCluster | ExternalKafka,
    tmp_path: Path,
    signing_keys: tuple[str, str],
) -> Settings:
    """Settings with topic names, app id and state directory unique to this test."""
    return make_settings(broker.bootstrap, tmp_path, signing_keys=signing_keys)


def make_settings(
    bootstrap: str,
    tmp_path: Path,
    partitions: int = 2,
    signing_keys: tuple[str, str] | None = None,
) -> Settings:
    """Settings for a broker at ``bootstrap`` with names unique to one test."""
    if signing_keys is None:
        from kernelstream.schemas.signing import generate_keypair

        private, public = generate_keypair()
        signing_keys = (private.decode(), public.decode())
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
        bootstrap=bootstrap,
        app_id=f"ks-test-{tag}",
        data_dir=tmp_path / "worker",
        node_state_dir=tmp_path / "nodes",
        web_port=free_port(),
        # a node started by a test serves no metrics unless it asks (6067 may be taken)
        node_metrics_port=0,
        partitions=partitions,
        node_id=f"node-{tag}",
        signing_private_key=SecretStr(signing_keys[0]),
        signing_public_key=signing_keys[1],
        **topics,
    )


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``kernelstream worker`` process on the test's topics."""
    path = tmp_path / "worker.log"
    log = path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelstream.app.cli", "-v", "worker"],
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
            # Not a failure of the test that used it, but never silent: a stop takes about
            # 1.5 s, and a stuck one is bounded at about 11 s (docs/reliability).
            warnings.warn(
                f"the worker did not exit within 15 s of SIGTERM and was killed; see {path}",
                stacklevel=1,
            )
        log.close()
        # Captured, so shown with the test's report when it fails: what the worker said.
        lines = path.read_text(errors="replace").splitlines()
        print(f"--- {path} (last 80 of {len(lines)} lines) ---", *lines[-80:], sep="\n")
