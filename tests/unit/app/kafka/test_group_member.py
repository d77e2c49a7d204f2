"""The member id a worker keeps between runs (app/kafka/group_member.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from kernelstream.app.kafka.embedded import free_port
from kernelstream.app.kafka.group_member import (
    _previous,
    faust_member_id,
    leave_previous_member,
    member_file,
    remember_member,
)


def test_the_kept_id_is_read_back_for_its_own_group_only(tmp_path: Path) -> None:
    path = member_file(tmp_path / "state")
    assert _previous(path, "ks.window") is None  # no file yet
    remember_member(path, "ks.window", "aiokafka-0.14.0-1")
    remember_member(path, "ks.window", "aiokafka-0.14.0-2")  # the latest assignment wins
    assert _previous(path, "ks.window") == "aiokafka-0.14.0-2"
    assert _previous(path, "other.window") is None  # the worker's app id changed
    path.write_bytes(b'{"group": "ks.window", "member_')  # torn by hand: not an id
    assert _previous(path, "ks.window") is None


def test_nothing_kept_means_no_request(tmp_path: Path) -> None:
    # No broker listens at this address: a request would fail, not return False at once.
    got = asyncio.run(leave_previous_member(member_file(tmp_path), "g", "127.0.0.1:1"))
    assert got is False


def test_an_unreachable_broker_leaves_the_start_as_it_was(tmp_path: Path) -> None:
    path = member_file(tmp_path)
    remember_member(path, "g", "m-1")
    got = asyncio.run(leave_previous_member(path, "g", f"127.0.0.1:{free_port()}", timeout_s=2.0))
    assert got is False
    assert _previous(path, "g") == "m-1"  # kept: a later start tries again


def test_the_two_consumers_keep_their_ids_apart(tmp_path: Path) -> None:
    assert member_file(tmp_path) != member_file(tmp_path, "faust")
    assert member_file(tmp_path, "faust").name == "faust-member.json"


def test_the_faust_member_id_is_read_where_faust_keeps_its_consumer() -> None:
    coordinator = SimpleNamespace(member_id="faust-1.0-abc")
    consumer = SimpleNamespace(_coordinator=coordinator)
    app = SimpleNamespace(
        consumer=SimpleNamespace(_thread=SimpleNamespace(_ensure_consumer=lambda: consumer))
    )
    assert faust_member_id(app) == "faust-1.0-abc"
    coordinator.member_id = ""  # not joined yet
    assert faust_member_id(app) is None

    def not_started() -> None:
        raise RuntimeError("consumer not started")

    app.consumer._thread._ensure_consumer = not_started
    assert faust_member_id(app) is None
    assert faust_member_id(SimpleNamespace()) is None  # another layout: nothing kept
