"""A restarted worker ends its previous run's group memberships itself.

A worker killed without leaving its consumer groups (``kill -9``, the OOM killer, a
container restarted by its supervisor) stays a member until its session times out, and
the broker holds the next rebalance for it: Apache Kafka until the dead member's
session expires (6 s by default here), the embedded broker for that and another join
hold. So a restarted worker waited that long for its partitions while their launches
queued. The worker keeps the member id of each of its two group consumers in its data
folder, written at every assignment: the window consumer's (group ``<app id>.window``,
:func:`member_file` ``window``) and the Faust app's, which feeds the findings, tuner and
alert stages (group ``<app id>``, ``faust``). At the next start it asks the group
coordinator to remove those members (``LeaveGroup``) before it joins: the groups
rebalance at once. The ten ``kill -9`` trials of ``tests/integration/test_worker_crash.py``
(a restart after each) took 139 s before and 58 s after on Tansu, 76 s and 41 s on Apache
Kafka (pytest ``--durations``), with the window consumer's alone; with the Faust app's too,
its stages resume 3.4-3.8 s after a restart on Apache Kafka instead of 6.0 s (on the
embedded broker, which holds every join for half a session, 6.0-6.8 s either way).

The id is only ever this worker's own previous consumer's (each worker has its own data
folder). One that left cleanly or whose session expired is unknown to the broker, which
says so; that, and any failure to reach the coordinator, leaves the start as it was.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "consumer_member_id",
    "faust_member_id",
    "keep_member",
    "leave_previous_member",
    "member_file",
    "remember_member",
]

log = logging.getLogger("kernelstream.worker")

_UNKNOWN_MEMBER_ID = 25  # Kafka's error code: the member is not (or no longer) in the group


def member_file(data_dir: Path, consumer: str = "window") -> Path:
    """Where a worker keeps the member id of its ``window`` or ``faust`` consumer."""
    return data_dir / f"{consumer}-member.json"


def consumer_member_id(consumer: Any) -> str | None:
    """The member id of an aiokafka group consumer, or None where it has none yet.

    aiokafka offers no accessor: this reads the consumer's coordinator, and any change in
    that layout gives None (the id is then not kept, and a restart waits as before).
    """
    member = getattr(getattr(consumer, "_coordinator", None), "member_id", None)
    return member if isinstance(member, str) and member else None


def faust_member_id(app: Any) -> str | None:
    """:func:`consumer_member_id` of the Faust app's group consumer, which Faust runs on a
    thread of its own (reached the way Faust itself reaches it)."""
    try:
        consumer = app.consumer._thread._ensure_consumer()
    except Exception:
        return None
    return consumer_member_id(consumer)


def keep_member(path: Path, group: str, member_id: str | None) -> None:
    """:func:`remember_member` at an assignment: nothing without an id, and a failure to
    write is logged (the start after a crash then waits as before), never raised."""
    if member_id is None:
        return
    try:
        remember_member(path, group, member_id)
    except OSError as ex:
        log.warning("could not keep the member id of group %s in %s: %s", group, path, ex)


def remember_member(path: Path, group: str, member_id: str) -> None:
    """Write ``member_id`` of ``group`` to ``path`` (atomically: a crash mid-write leaves
    the previous file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps({"group": group, "member_id": member_id}))
    tmp.replace(path)


def _previous(path: Path, group: str) -> str | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(doc, dict) or doc.get("group") != group:
        return None
    member = doc.get("member_id")
    return member if isinstance(member, str) and member else None


async def leave_previous_member(
    path: Path,
    group: str,
    bootstrap: str,
    client_kwargs: dict[str, Any] | None = None,
    timeout_s: float = 5.0,
) -> bool:
    """Remove the member id kept in ``path`` from ``group``; True if the broker removed it.

    Best effort, bounded by ``timeout_s``: the worker's start goes on whatever happens.
    """
    member = _previous(path, group)
    if member is None:
        return False
    from aiokafka import AIOKafkaClient
    from aiokafka.client import CoordinationType
    from aiokafka.protocol.group import LeaveGroupRequest

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **(client_kwargs or {}))
    try:

        async def leave() -> int:
            await client.bootstrap()
            node = await client.coordinator_lookup(CoordinationType.GROUP, group)
            response = await client.send(node, LeaveGroupRequest(group, member))
            return int(response.error_code)

        code = await asyncio.wait_for(leave(), timeout_s)
    except Exception as ex:  # any failure: join as before, and say why
        log.info("could not end the previous run's membership of %s: %r", group, ex)
        return False
    finally:
        await client.close()
    if code == 0:
        log.warning(
            "the previous run of this worker stopped without leaving group %s (a crash?): "
            "its membership (%s) ended now, so the group does not wait for it",
            group,
            member,
        )
        return True
    if code != _UNKNOWN_MEMBER_ID:
        log.info("the broker kept the previous run's member of %s: error code %d", group, code)
    return False
