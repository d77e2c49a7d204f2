"""A worker restarted after ``kill -9`` ends its previous run's group membership itself
(:mod:`kernelstream.app.kafka.group_member`), on both brokers."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kernelstream.app.kafka.group_member import member_file
from kernelstream.app.kafka.topics import ensure_topics
from kernelstream.app.settings import Settings
from tests.integration.workers import WorkerProc, wait_for

pytestmark = pytest.mark.integration


async def test_a_worker_restarted_after_kill9_ends_its_previous_membership(
    settings: Settings, tmp_path: Path
) -> None:
    await ensure_topics(settings, str(settings.bootstrap))
    w = WorkerProc(settings, tmp_path / "worker.log")
    kept = member_file(w.settings.data_dir)
    try:
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == settings.partitions, 90, "join")
        first = orjson.loads(kept.read_bytes())
        w.kill9()  # no LeaveGroup: the broker still counts the member
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == settings.partitions, 90, "rejoin")
        second = orjson.loads(kept.read_bytes())
    finally:
        w.close()
    log = w.log.read_text(errors="replace")
    assert first["group"] == second["group"] == f"{settings.app_id}.window"
    assert first["member_id"] != second["member_id"]  # kept anew at the new assignment
    assert f"its membership ({first['member_id']}) ended now" in log, log[-3000:]
