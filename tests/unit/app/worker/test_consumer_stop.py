"""The worker's stop does not wait on a Faust consumer stuck in a group join."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kernelstream.app.worker.faust_app import CONSUMER_STOP_S, stop_within


def test_a_stop_that_finishes_is_awaited_whole() -> None:
    done: list[str] = []

    async def stopping() -> None:
        await asyncio.sleep(0.05)
        done.append("stopped")

    assert asyncio.run(stop_within(stopping(), CONSUMER_STOP_S)) is True
    assert done == ["stopped"]


def test_a_stop_stuck_in_a_join_is_given_up_and_said(caplog: pytest.LogCaptureFixture) -> None:
    cancelled: list[bool] = []

    async def joining_forever() -> None:  # what aiokafka's stop() waits on mid-join
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with caplog.at_level(logging.WARNING, logger="kernelstream.worker"):
        assert asyncio.run(stop_within(joining_forever(), 0.2)) is False
    assert cancelled == [True], "the stuck stop is cancelled, not left running"
    [message] = [r.getMessage() for r in caplog.records]
    assert "did not stop within" in message and "without leaving its group" in message
