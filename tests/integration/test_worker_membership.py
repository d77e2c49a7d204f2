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
    kept_faust = member_file(w.settings.data_dir, "faust")
    try:
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == settings.partitions, 90, "join")
        await wait_for(kept_faust.exists, 90, "the Faust app's assignment")
        first = orjson.loads(kept.read_bytes())
        first_faust = orjson.loads(kept_faust.read_bytes())
        w.kill9()  # no LeaveGroup: the broker still counts both members
        w.start()
        await wait_for(lambda: w.window("assigned_partitions") == settings.partitions, 90, "rejoin")
        await wait_for(
            lambda: orjson.loads(kept_faust.read_bytes()) != first_faust, 90, "the Faust rejoin"
        )
        second = orjson.loads(kept.read_bytes())
        second_faust = orjson.loads(kept_faust.read_bytes())
    finally:
        w.close()
    log = w.log.read_text(errors="replace")
    assert first["group"] == second["group"] == f"{settings.app_id}.window"
    assert first["member_id"] != second["member_id"]  # kept anew at the new assignment
    assert f"its membership ({first['member_id']}) ended now" in log, log[-3000:]
    # the Faust app's group (findings, tuner, alerts): the same
    assert first_faust["group"] == second_faust["group"] == settings.app_id
    assert first_faust["member_id"] != second_faust["member_id"]
    assert f"its membership ({first_faust['member_id']}) ended now" in log, log[-3000:]
