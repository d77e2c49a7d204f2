"""Topic definitions: names (from settings), keys, partitions, retention; creation.

The topics are the contract between stages (see ARCHITECTURE.md). Creation is
explicit and happens before any producer writes, because a broker that
auto-creates topics on first produce picks its own partition count, and Faust
refuses to run a table whose changelog partitions differ from its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.capabilities import replication_factor
from kernelstream.app.settings import Settings
from kernelstream.schemas.keys import group_key, stream_key

__all__ = [
    "TopicSpec",
    "ensure_topics",
    "group_key",
    "stream_key",
    "topic_specs",
    "topics_markdown",
]


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, what its key is, partitions and retention."""

    role: str
    name: str
    key: str
    partitions: int
    retention_ms: int
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.retention_ms),
            "cleanup.policy": "compact,delete" if self.compacted else "delete",
        }


_DAY_MS = 24 * 3600 * 1000
_TOPIC_ALREADY_EXISTS = 36


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """All topics kernelstream uses, with the names configured in ``settings``."""
    p = settings.partitions
    return [
        TopicSpec("launches", settings.topic_launches, "node:device/kernel", p, 7 * _DAY_MS),
        TopicSpec("windows", settings.topic_windows, "node:device/kernel", p, 30 * _DAY_MS),
        TopicSpec(
            "findings", settings.topic_findings, "device_model/workload/size", p, 30 * _DAY_MS
        ),
        TopicSpec("recommendations", settings.topic_recommendations, "node", p, 30 * _DAY_MS),
        TopicSpec(
            "reconfig", settings.topic_reconfig, "device_model/workload/size", p, 90 * _DAY_MS
        ),
        TopicSpec("alerts", settings.topic_alerts, "series key", p, 30 * _DAY_MS),
        TopicSpec("late", settings.topic_late, "node:device/kernel", p, 7 * _DAY_MS),
        TopicSpec("deadletter", settings.topic_deadletter, "original key", 1, 30 * _DAY_MS),
    ]


def topics_markdown(settings: Settings) -> str:
    """The topic table of the README's Operations section (``kernelstream topics --table``)."""
    rows = [
        "| topic | key | partitions | retention | cleanup.policy |",
        "|---|---|---|---|---|",
    ]
    for s in topic_specs(settings):
        parts = f"`partitions` ({s.partitions})" if s.partitions == settings.partitions else "1"
        rows.append(
            f"| `{s.name}` | {s.key} | {parts} | {s.retention_ms // _DAY_MS} d "
            f"| {s.configs()['cleanup.policy']} |"
        )
    return "\n".join(rows) + "\n"


async def ensure_topics(settings: Settings, bootstrap: str) -> list[str]:
    """Create every missing topic; return the names created. Existing ones are left as is."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings.kafka_client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [s for s in topic_specs(settings) if s.name not in existing]
        if missing:
            rf = replication_factor(len((await admin.describe_cluster())["brokers"]))
            resp = await admin.create_topics(
                [NewTopic(s.name, s.partitions, rf, topic_configs=s.configs()) for s in missing]
            )
            for err in resp.topic_errors:
                name, code = err[0], err[1]
                if code not in (0, _TOPIC_ALREADY_EXISTS):  # a racing creator is fine
                    raise BrokerError(f"could not create topic {name!r}: Kafka error code {code}")
        return [s.name for s in missing]
    finally:
        await admin.close()
