"""The worker's edge decoder: every class of bad input is dead-lettered, coded and counted."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from types import SimpleNamespace
from typing import Any

import pytest

from kernelstream.agents.context import DEAD_LETTER_INLINE_BYTES, WorkerContext
from kernelstream.app.settings import Settings
from kernelstream.schemas import DeadLetter, LaunchBatch, decode
from tests.bad_input import bad_inputs, good_batch


class FakeTopic:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes]] = []

    async def send(
        self, key: bytes | None = None, value: bytes = b"", partition: int | None = None
    ) -> None:
        self.sent.append((key, value))


def event(key: bytes | None, value: bytes | None, offset: int = 0) -> Any:
    msg = SimpleNamespace(topic="ks.launches", partition=0, offset=offset)
    return SimpleNamespace(message=msg, key=key, value=value)


def context() -> tuple[WorkerContext, FakeTopic]:
    dlq = FakeTopic()
    return WorkerContext(Settings(), {"deadletter": dlq}), dlq  # the default limits


NOW = time.time()
TEMPLATE = good_batch("n1", "matmul", NOW - 1.0, 20, 0)
CASES = bad_inputs(TEMPLATE, NOW)


def test_at_least_thirty_classes_are_covered() -> None:
    codes = {code for _, code, _, _ in CASES}
    assert len(CASES) >= 30 and len(codes) >= 16  # + the window agent's sequence rules


def original(dl: DeadLetter) -> bytes:
    """The original bytes a dead letter carries (the head of a truncated one)."""
    return base64.b64decode(dl.value_b64)


@pytest.mark.parametrize(("name", "code", "key", "value"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_dead_lettered_with_original_bytes_reason_and_code(
    name: str, code: str, key: bytes | None, value: bytes
) -> None:
    ctx, dlq = context()
    for decoder in (ctx.decode_launches, lambda s, e: ctx.decode(s, e, LaunchBatch)):
        dlq.sent.clear()
        assert asyncio.run(decoder("window", event(key, value, offset=7))) is None
        [(dl_key, dl_value)] = dlq.sent
        assert len(dl_value) < 1_000_000  # the producer's default max_request_size
        dl = decode(dl_value, DeadLetter)
        value = value or b""
        assert dl.value_bytes == len(value) and dl.value_sha256 == hashlib.sha256(value).hexdigest()
        if dl.value_truncated:
            assert len(value) > DEAD_LETTER_INLINE_BYTES and value.startswith(original(dl))
        else:
            assert original(dl) == value
        assert dl_key == key
        assert dl.reason_code == code, f"{name}: {dl.reason}"
        assert dl.reason and dl.stage == "window" and dl.offset == 7
    assert ctx.counters[f"deadletter.window.{code}"] == 2
    assert ctx.dead_letter_counts() == {f"window.{code}": 2}


def test_good_batch_passes_both_decoders() -> None:
    ctx, dlq = context()
    ev = event(TEMPLATE.stream_key.encode(), TEMPLATE.model_dump_json(by_alias=True).encode())
    cols = asyncio.run(ctx.decode_launches("window", ev))
    assert cols is not None and len(cols) == 20
    assert asyncio.run(ctx.decode("window", ev, LaunchBatch)) == TEMPLATE
    assert not dlq.sent and not ctx.dead_letter_counts()


class RefusingTopic(FakeTopic):
    async def send(
        self, key: bytes | None = None, value: bytes = b"", partition: int | None = None
    ) -> None:
        raise RuntimeError("MessageSizeTooLargeError: the broker refused it")


def test_a_dead_letter_that_cannot_be_published_is_counted_and_skipped() -> None:
    """The stage goes on (and commits the offset) instead of failing on the message."""
    ctx = WorkerContext(Settings(), {"deadletter": RefusingTopic()})
    cols = asyncio.run(ctx.decode_launches("window", event(b"k", b"{not json")))
    assert cols is None
    assert ctx.counters["deadletter.window.invalid_json"] == 1
    assert ctx.counters["deadletter.window.unpublished"] == 1


def test_an_oversize_original_is_kept_by_reference_within_the_producer_limit() -> None:
    ctx, dlq = context()
    value = b"\x00" * (9 * 1024 * 1024)
    key = b"k" * 5000
    asyncio.run(ctx.decode_launches("window", event(key, value, offset=42)))
    [(dl_key, dl_value)] = dlq.sent
    dl = decode(dl_value, DeadLetter)
    assert len(dl_value) < 10_000 and dl_key == key[:1024]
    assert dl.value_truncated and dl.key_truncated and dl.value_bytes == len(value)
    assert dl.value_sha256 == hashlib.sha256(value).hexdigest() and dl.offset == 42
    assert dl.reason_code == "oversized"


def test_a_header_that_passed_once_still_gets_every_check_with_another_key_or_time() -> None:
    """A poll checks a header's key, workload and configuration once per message key;
    the event times of every batch, and a batch under another key, are checked anew."""
    from kernelstream.schemas.binary import encode_launch_batch

    def shifted(by_s: float, seq: int) -> bytes:
        t = [x + by_s for x in TEMPLATE.t_end]
        return encode_launch_batch(TEMPLATE.model_copy(update={"t_end": t, "seq_start": seq}))

    key = TEMPLATE.stream_key.encode()
    poll = [
        event(key, shifted(0.0, 0), 0),
        event(b"n9:0/matmul", shifted(0.1, 20), 1),  # bad_key
        event(key, shifted(-30 * 86400.0, 40), 2),  # too old: bad_timestamp
        event(key, shifted(3600.0, 60), 3),  # ahead of the clock: bad_timestamp
        event(key, shifted(0.2, 80), 4),
    ]
    ctx, dlq = context()
    got = asyncio.run(ctx.decode_launches_many("window", poll))
    assert [c is not None for c in got] == [True, False, False, False, True]
    codes = [decode(v, DeadLetter).reason_code for _, v in dlq.sent]
    assert codes == ["bad_key", "bad_timestamp", "bad_timestamp"]
    for ev, cols in zip(poll, got, strict=True):  # the verdicts of each message alone
        alone, _ = context()
        assert (asyncio.run(alone.decode_launches("window", ev)) is None) == (cols is None)
