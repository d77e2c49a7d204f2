"""The worker's stop does not wait on a Faust consumer stuck in a group join, and its
process exits even where a thread of it does not."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

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


_SCRIPT = """
import logging, sys, threading, time
from kernelstream.app.worker.start import exit_without_stuck_threads
logging.basicConfig()
hold = float(sys.argv[1])  # how long the thread runs; < 0: until the process ends
threading.Thread(
    target=(lambda: threading.Event().wait()) if hold < 0 else (lambda: time.sleep(hold)),
    name="faust-consumer-thread",
).start()
why = RuntimeError("takeover failed") if len(sys.argv) > 2 else None
exit_without_stuck_threads(3, 1.0, why)
print("returned")
"""


def _run(hold_s: float, *why: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(hold_s), *why],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_thread_stuck_after_the_stop_does_not_keep_the_process_alive() -> None:
    done = _run(-1)  # without the check this process would never exit
    assert done.returncode == 3, done
    assert "returned" not in done.stdout
    [line] = [ln for ln in done.stderr.splitlines() if "did not" in ln]
    assert "faust-consumer-thread" in line and "exiting without them" in line


def test_threads_that_end_are_waited_for_and_nothing_is_said() -> None:
    done = _run(0.2)
    assert done.returncode == 0 and done.stdout.strip() == "returned", done
    assert "did not" not in done.stderr


def test_a_crash_with_a_stuck_thread_still_says_why() -> None:
    done = _run(-1, "crash")
    assert done.returncode == 3, done
    [line] = [ln for ln in done.stderr.splitlines() if "did not" in ln]
    assert "stopped (takeover failed)" in line, line
