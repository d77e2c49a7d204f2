"""The loop on Apache Kafka whose clients authenticate, as production clusters run it.

The broker (:func:`~tests.integration.conftest.secured_kafka`) takes clients on a
listener that wants TLS, its certificate signed by the test's own CA, and SCRAM-SHA-512
credentials, and on one that wants a client certificate signed by that CA (mutual TLS);
an authorizer allows each principal only what an ACL allows. A client without the
security settings cannot even bootstrap. So every Kafka client of the
worker and the node (producers, consumers, the admin client, Faust's) carries the
settings' security here, or a hop of the loop never happens. A user whose settings the
broker refuses gets one line naming the setting to fix, not "cannot reach".
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from pydantic import SecretStr

from kernelstream.app.kafka.acls import Acl, node_acls, worker_acls
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.sdk.local import settings_env
from kernelstream.app.settings import Settings
from tests.integration.conftest import TRANSPORTS, SecuredKafka, make_settings
from tests.integration.helpers import produce, run
from tests.integration.test_pipeline import scenario
from tests.integration.workers import WorkerProc

pytestmark = pytest.mark.integration


_SIM_NODE = ("--node-id", "n1", "--backend", "sim", "--duration", "6")


def _settings(
    kafka: SecuredKafka,
    tmp_path: Path,
    wrong: dict[str, object] | None = None,
    transport: str = "sasl_ssl",
) -> Settings:
    """Settings of a client of ``kafka`` as the worker's user over ``transport``, but for
    the ``wrong`` fields; topic names and app id of the test's own (no ACL names them
    until the test grants one)."""
    fields = {**kafka.security("ks-worker", transport), **(wrong or {})}
    return make_settings(kafka.cluster.bootstrap, tmp_path).model_copy(update=fields)


def _cli(settings: Settings, *args: str) -> tuple[int, str, list[str]]:
    """``kernelstream ARGS`` with ``settings``: (exit code, stderr, its lines)."""
    done = subprocess.run(
        [sys.executable, "-m", "kernelstream.app.cli", *args],
        # a node serves no metrics (its default port may be taken)
        env={**settings_env(settings), "KERNELSTREAM_NODE_METRICS_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stderr, done.stderr.strip().splitlines()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_hop_with_only_the_documented_acls(
    secured_kafka: SecuredKafka, tmp_path: Path, transport: str
) -> None:
    """The worker and the node as principals of their own (SCRAM users, or the subjects
    of their certificates), each allowed only its ACLs (app/kafka/acls.py); the test
    reads and writes as the cluster's super user."""
    settings = _settings(secured_kafka, tmp_path, transport=transport)
    node = settings.model_copy(update=secured_kafka.security("ks-node", transport))
    secured_kafka.grant(secured_kafka.principal("ks-worker", transport), worker_acls(settings))
    secured_kafka.grant(secured_kafka.principal("ks-node", transport), node_acls(settings))
    worker = WorkerProc(settings, tmp_path / "worker.log")
    worker.start()
    assert worker.proc is not None
    try:
        run(
            scenario(
                worker.settings, worker.proc, node, (secured_kafka.cluster.plaintext_bootstrap, {})
            )
        )
    finally:
        worker.stop()
    # what the ACLs keep a node from: commanding other nodes
    with pytest.raises(TopicAuthorizationFailedError):
        run(
            produce(
                settings.bootstrap or "",
                settings.topic_recommendations,
                [(b"node-x", b"{}")],
                **node.kafka_client_kwargs(),
            )
        )


@pytest.mark.parametrize(
    ("wrong", "says"),
    [
        (
            {"sasl_password": SecretStr("not-the-password")},
            "the broker refused the SASL credentials (Authentication failed",
        ),
        ({"sasl_mechanism": "PLAIN"}, "does not take this SASL mechanism"),
        ({"ssl_cafile": None}, "the broker's TLS certificate was not accepted"),
        ({"security_protocol": "PLAINTEXT"}, "check KERNELSTREAM_SECURITY_PROTOCOL"),
    ],
    ids=["password", "mechanism", "ca", "protocol"],
)
def test_a_refused_client_is_told_what_to_fix(
    secured_kafka: SecuredKafka, tmp_path: Path, wrong: dict[str, object], says: str
) -> None:
    code, stderr, lines = _cli(_settings(secured_kafka, tmp_path, wrong), "worker")
    assert code == 1, stderr
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert lines[0].startswith(f"Error: Kafka at {secured_kafka.cluster.bootstrap}: "), lines
    assert says in lines[0], lines


@pytest.mark.parametrize("refused_for", ["password", "acls"])
def test_a_refused_node_says_so_once_and_keeps_running(
    secured_kafka: SecuredKafka, tmp_path: Path, refused_for: str
) -> None:
    """A node keeps running while the broker refuses it (its outbox holds the launches;
    credentials or ACLs may be fixed on the broker's side), and says why in a line or
    two."""
    if refused_for == "password":
        wrong: dict[str, Any] = {"sasl_password": SecretStr("no")}
        says = "KERNELSTREAM_SASL_PASSWORD"
    else:  # its own credentials, but no ACL names this test's topics
        wrong, says = secured_kafka.security("ks-node"), "not allowed by the broker's ACLs"
    code, stderr, lines = _cli(_settings(secured_kafka, tmp_path, wrong), "node", *_SIM_NODE)
    assert code == 0, stderr
    assert not [ln for ln in lines if " ERROR " in ln or "cannot reach" in ln], stderr
    refused = [ln for ln in lines if "cannot use Kafka: " in ln or "send to" in ln]
    assert 1 <= len(refused) <= 2, stderr  # outbox and recommendation inbox
    assert all(says in ln for ln in refused), stderr


@pytest.mark.parametrize("command", ["worker", "watch"])
def test_a_principal_the_acls_do_not_allow_is_told_what_to_grant(
    secured_kafka: SecuredKafka, tmp_path: Path, command: str
) -> None:
    """Authenticated, but no ACL names this test's topics and groups: one line saying
    which operation the ACLs refused and where the ACLs a worker needs are printed."""
    code, stderr, lines = _cli(_settings(secured_kafka, tmp_path), command)
    assert code == 1, stderr
    assert "Traceback" not in stderr and len(lines) == 1, stderr
    assert "not allowed by the broker's ACLs" in lines[0], lines
    assert "TopicAuthorizationFailed" in lines[0], lines
    assert "`kernelstream topics --acls worker`" in lines[0], lines


def test_a_worker_refused_a_topic_it_writes_stops_and_says_what_to_grant(
    secured_kafka: SecuredKafka, tmp_path: Path
) -> None:
    """Topics made by an administrator, every ACL of the worker's but Write (and Create)
    on the windows topic: the worker's first windows are refused, so it stops (before any
    checkpoint says they were published: a restart publishes them again) and its error
    names the ACLs to grant."""
    settings = _settings(secured_kafka, tmp_path)
    admin = settings.model_copy(
        update={
            "bootstrap": secured_kafka.cluster.plaintext_bootstrap,
            "security_protocol": "PLAINTEXT",
        }
    )
    run(ensure_topics(admin, str(admin.bootstrap)))
    acls = [a for a in worker_acls(settings) if a.name != settings.topic_windows]
    acls.append(Acl("topic", settings.topic_windows, ("DESCRIBE",)))  # it sees the topic
    secured_kafka.grant(secured_kafka.principal("ks-worker"), acls)
    node = settings.model_copy(update=secured_kafka.security("ks-node"))
    secured_kafka.grant(secured_kafka.principal("ks-node"), node_acls(settings))
    log = tmp_path / "worker.log"
    worker = WorkerProc(settings, log)
    worker.start()
    assert worker.proc is not None
    try:
        code, stderr, _ = _cli(node, "node", *_SIM_NODE)
        assert code == 0, stderr
        worker.proc.wait(60)
    finally:
        worker.stop()
    text = log.read_text()
    assert worker.proc.returncode != 0, text
    refused = [ln for ln in text.splitlines() if "records to" in ln and "ACLs" in ln]
    assert refused and all(settings.topic_windows in ln for ln in refused), text
    assert "not allowed by the broker's ACLs" in refused[0], text
    assert "`kernelstream topics --acls worker`" in refused[0], text
