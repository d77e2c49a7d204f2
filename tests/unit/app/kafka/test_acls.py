"""The ACLs a worker and a node need (app/kafka/acls.py), and how they are printed.

That these and no more run the whole loop on Apache Kafka with an authorizer is
tests/integration/test_secured_kafka.py.
"""

from __future__ import annotations

import shlex

from click.testing import CliRunner

from kernelstream.agents.window_agent import state_topic
from kernelstream.app.cli import main
from kernelstream.app.kafka.acls import Acl, kafka_acls_commands, node_acls, worker_acls
from kernelstream.app.kafka.topics import topic_specs
from kernelstream.app.settings import Settings


def _allowed(acls: list[Acl]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for acl in acls:
        out.setdefault(f"{acl.resource}:{acl.name}{'*' if acl.prefixed else ''}", set()).update(
            acl.operations
        )
    return out


def test_a_worker_may_create_and_use_every_topic_and_its_groups() -> None:
    s = Settings()
    allowed = _allowed(worker_acls(s))
    for spec in topic_specs(s):
        ops = allowed[f"topic:{spec.name}"]
        assert "CREATE" in ops and ops & {"READ", "WRITE"}, spec.name
    assert {"READ", "WRITE", "ALTER"} <= allowed[f"topic:{state_topic(s)}"]
    assert allowed[f"group:{s.app_id}*"] == {"READ"}
    assert "READ" not in allowed[f"topic:{s.topic_windows}"]  # written, never read


def test_a_node_may_not_write_recommendations_nor_read_launches() -> None:
    s = Settings()
    allowed = _allowed(node_acls(s))
    assert allowed == {
        f"topic:{s.topic_launches}": {"WRITE"},
        f"topic:{s.topic_reconfig}": {"WRITE"},
        f"topic:{s.topic_deadletter}": {"WRITE"},
        f"topic:{s.topic_recommendations}": {"READ"},
    }


def test_the_commands_are_kafka_acls_sh_lines() -> None:
    s = Settings()
    text = kafka_acls_commands("User:ks node", worker_acls(s))
    lines = text.splitlines()
    assert len(lines) == len(worker_acls(s))
    first = shlex.split(lines[0].replace("$BOOTSTRAP", "B"))
    assert first[:6] == [
        "kafka-acls.sh",
        "--bootstrap-server",
        "B",
        "--add",
        "--allow-principal",
        "User:ks node",
    ]
    assert first[6:] == [
        "--operation",
        "Read",
        "--operation",
        "Create",
        "--topic",
        s.topic_launches,
    ]
    group = shlex.split(lines[-1].replace("$BOOTSTRAP", "B"))
    assert group[-4:] == ["--group", s.app_id, "--resource-pattern-type", "prefixed"]


def test_topics_prints_them_without_a_broker() -> None:
    result = CliRunner().invoke(main, ["topics", "--acls", "node", "--principal", "User:n1"])
    assert result.exit_code == 0, result.output
    assert result.output == kafka_acls_commands("User:n1", node_acls(Settings()))
