"""The Kafka ACLs a worker and a node need, and nothing more.

On a cluster with an authorizer, give each kind of process its own principal and only
these: nodes write launches, outcomes and dead letters and read the recommendations
topic (their own partition, assigned, no group); workers read the launches and
outcomes, write every derived topic, create the topics they find missing (with their
partitions and policies), and own the consumer groups and the Faust app's internal
topics named after ``app_id``. Above all, no principal but the workers' may write the
recommendations topic (nodes also check every recommendation's signature:
docs/operate/security.md).

``kernelstream topics --acls worker --principal User:NAME`` prints them as Apache
Kafka's ``kafka-acls.sh`` commands; tests/integration/test_secured_kafka.py runs the whole loop
on Apache Kafka with only these allowed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from kernelstream.app.settings import Settings

__all__ = ["Acl", "kafka_acls_commands", "node_acls", "worker_acls"]

Resource = Literal["topic", "group"]


@dataclass(frozen=True)
class Acl:
    """Operations allowed on one resource pattern (a name, or every name with a prefix)."""

    resource: Resource
    name: str
    operations: tuple[str, ...]  # Kafka's operation names: READ, WRITE, CREATE, ...
    prefixed: bool = False


def worker_acls(settings: Settings) -> list[Acl]:
    """What a worker of ``settings`` does on the cluster (READ and WRITE imply DESCRIBE)."""
    from kernelstream.agents.window_agent import state_topic

    s = settings
    made = ("CREATE",)  # by the worker where it finds the topic missing (ensure_topics)
    out = [
        Acl("topic", s.topic_launches, ("READ", *made)),
        # the window agent's handover topic, grown with the launches topic
        Acl("topic", state_topic(s), ("READ", "WRITE", "ALTER", *made)),
        Acl("topic", s.topic_findings, ("READ", "WRITE", *made)),
        Acl("topic", s.topic_reconfig, ("READ", *made)),
    ]
    for topic in (
        s.topic_windows,
        s.topic_recommendations,
        s.topic_alerts,
        s.topic_late,
        s.topic_deadletter,
    ):
        out.append(Acl("topic", topic, ("WRITE", *made)))
    out += [
        # the Faust app's internal topics, and every consumer group of the worker
        Acl("topic", s.app_id, ("READ", "WRITE", *made), prefixed=True),
        Acl("group", s.app_id, ("READ",), prefixed=True),
    ]
    return out


def node_acls(settings: Settings) -> list[Acl]:
    """What a node of ``settings`` does on the cluster: its recommendations' partition is
    assigned (no consumer group)."""
    s = settings
    return [
        Acl("topic", s.topic_launches, ("WRITE",)),
        Acl("topic", s.topic_reconfig, ("WRITE",)),
        Acl("topic", s.topic_deadletter, ("WRITE",)),
        Acl("topic", s.topic_recommendations, ("READ",)),
    ]


def _camel(operation: str) -> str:
    """DESCRIBE_CONFIGS -> DescribeConfigs, as kafka-acls.sh names operations."""
    return "".join(part.title() for part in operation.split("_"))


def kafka_acls_commands(principal: str, acls: list[Acl], bootstrap: str = "$BOOTSTRAP") -> str:
    """``acls`` for ``principal`` as ``kafka-acls.sh`` commands, one per resource pattern
    (``--command-config`` left to the operator's admin client settings)."""
    lines = []
    for acl in acls:
        where = [f"--{acl.resource}", acl.name]
        pattern = ["--resource-pattern-type", "prefixed"] if acl.prefixed else []
        ops = [arg for op in acl.operations for arg in ("--operation", _camel(op))]
        cmd = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--add"]
        cmd += ["--allow-principal", principal, *ops, *where, *pattern]
        lines.append(" ".join(shlex.quote(c) if not c.startswith("$") else c for c in cmd))
    return "\n".join(lines) + "\n"
