"""Topic definitions: names (from settings), keys, partitions, retention; creation.

The topics are the contract between stages (see ARCHITECTURE.md). Creation is
explicit and happens before any producer writes, because a broker that
auto-creates topics on first produce picks its own partition count, and Faust
refuses to run a table whose changelog partitions differ from its source. A launches
topic created by the broker first is still used as it is: the window agent's handover
topic follows its partition count (:func:`ensure_state_partitions`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.capabilities import replication_factor
from kernelstream.app.settings import Settings
from kernelstream.schemas.keys import group_key, stream_key

__all__ = [
    "TopicSpec",
    "ensure_state_partitions",
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


log = logging.getLogger("kernelstream.topics")

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
    """Create every missing topic; return the names created. Existing ones are left as is;
    one with fewer partitions than configured is logged (a warning): it bounds how many
    workers share its work (a broker that creates topics on first use gives its own
    count, 1 by default on Apache Kafka)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings.kafka_client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        specs = topic_specs(settings)
        missing = [s for s in specs if s.name not in existing]
        keyed = {s.name: s.partitions for s in specs if s.name in existing and s.partitions > 1}
        for name, have in (await _partition_counts(admin, list(keyed))).items():
            if have < keyed[name]:
                log.warning(
                    "topic %r has %d partition(s), fewer than the %d configured "
                    "(KERNELSTREAM_PARTITIONS): at most %d worker(s) share its work; "
                    "add partitions to it (kafka-topics --alter) to run more",
                    name,
                    have,
                    keyed[name],
                    have,
                )
        if missing:
            rf = replication_factor(len((await admin.describe_cluster())["brokers"]))
            resp = await admin.create_topics(
                [NewTopic(s.name, s.partitions, rf, topic_configs=s.configs()) for s in missing]
            )
            for err in resp.topic_errors:
                name, code = err[0], err[1]
                if code not in (0, _TOPIC_ALREADY_EXISTS):  # a racing creator is fine
                    raise _not_created(name, code)
        return [s.name for s in missing]
    finally:
        await admin.close()


async def ensure_state_partitions(settings: Settings, bootstrap: str, needed: int = 0) -> int:
    """The window agent's handover topic, with a partition for each launches partition.

    The two are co-partitioned: the window state of launches partition p is handed over
    on partition p of ``<launches>.window-state``
    (:func:`~kernelstream.agents.window_agent.state_topic`). The launches topic can have
    more partitions than ``settings.partitions``: a broker that creates topics on first
    use (Apache Kafka and the embedded broker do by default) gives it its own count when
    a node publishes, or a client asks for its metadata, before any worker created it; an
    operator can add partitions. So the handover topic is created with the launches
    topic's count as it is (or ``needed``, if more), and grown where it has fewer.
    Returns its partition count. A broker that cannot add partitions (the embedded one)
    gets a one-line :class:`BrokerError` saying what to do.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

    from kernelstream.agents.window_agent import state_topic

    name = state_topic(settings)
    launches = next(s for s in topic_specs(settings) if s.role == "launches")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **settings.kafka_client_kwargs())
    await admin.start()
    try:
        counts = await _partition_counts(admin, [launches.name, name])
        want = max(needed, counts.get(launches.name, launches.partitions))
        have = counts.get(name)
        if have is None:
            spec = TopicSpec(
                "window_state", name, "state record", want, launches.retention_ms, True
            )
            rf = replication_factor(len((await admin.describe_cluster())["brokers"]))
            resp = await admin.create_topics(
                [NewTopic(name, want, rf, topic_configs=spec.configs())]
            )
            code = resp.topic_errors[0][1]
            if code == 0:
                return want
            if code != _TOPIC_ALREADY_EXISTS:
                raise _not_created(name, code)
            # Another worker created it meanwhile: grown below if it has fewer.
            have = (await _partition_counts(admin, [name])).get(name, want)
        if have >= want:
            return have
        try:
            await admin.create_partitions({name: NewPartitions(want)})
        except Exception as ex:
            raise BrokerError(
                f"topic {launches.name!r} has {want} partitions but its window-state topic "
                f"{name!r} has {have}, and the broker did not add partitions ({ex!r}): "
                f"add them (kafka-topics --alter --partitions {want}) or delete {name!r} "
                "while no worker runs"
            ) from ex
        return want
    finally:
        await admin.close()


def _not_created(name: str, code: int) -> BrokerError:
    """Why topic ``name`` was not created (Kafka's error ``code``), in a line."""
    from aiokafka.errors import for_code

    from kernelstream.agents.retry_log import ACLS_FIX, denied_errors

    error = for_code(code)
    if issubclass(error, denied_errors()):
        return BrokerError(
            f"could not create topic {name!r}: not allowed by the broker's ACLs "
            f"({error.__name__}); {ACLS_FIX}, or have an administrator run "
            "`kernelstream topics` first"
        )
    return BrokerError(f"could not create topic {name!r}: {error.__name__} (Kafka error {code})")


async def _partition_counts(admin: Any, names: list[str]) -> dict[str, int]:
    """Partitions of each of ``names`` that exists."""
    existing = set(await admin.list_topics())
    wanted = [n for n in names if n in existing]
    if not wanted:
        return {}
    return {
        t["topic"]: len(t["partitions"])
        for t in await admin.describe_topics(wanted)
        if t["error_code"] == 0
    }
