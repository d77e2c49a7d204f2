"""The faster zstd record decoder gives aiokafka exactly what its own decoder gives."""

from __future__ import annotations

import os
from typing import Any

import cramjam
import pytest

from kernelstream.app.kafka import zstd_decode as fast

zstandard = pytest.importorskip("zstandard")


def _aiokafka_own(payload: bytes) -> Any:
    from aiokafka import codec

    try:
        return ("ok", bytes(codec.zstd_decode(payload)))
    except Exception as ex:
        return ("error", type(ex))


def _ours(payload: bytes) -> Any:
    try:
        return ("ok", fast.zstd_decode(payload))
    except Exception as ex:
        return ("error", type(ex))


def _frames() -> dict[str, bytes]:
    data = os.urandom(3000) + b"x" * 50_000
    one_shot = bytes(cramjam.zstd.compress(data))
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    return {
        "one frame, content size (aiokafka, librdkafka)": one_shot,
        "no content size (a streaming compressor)": streamed,
        "two frames": one_shot + one_shot,
        "trailing bytes": one_shot + b"\x00\x01",
        "corrupt": one_shot[:20] + bytes(b ^ 0xFF for b in one_shot[20:40]) + one_shot[40:],
        "truncated": one_shot[: len(one_shot) // 2],
        "empty content": bytes(cramjam.zstd.compress(b"")),
        "not zstd": b"plain bytes",
    }


@pytest.fixture(autouse=True)
def _installed() -> None:
    assert fast.install()


@pytest.mark.parametrize("name", list(_frames()))
def test_same_result_or_error_as_aiokafkas_decoder(name: str) -> None:
    payload = _frames()[name]
    assert _ours(payload) == _aiokafka_own(payload)


def test_aiokafkas_record_batches_decode_through_it() -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder
    from aiokafka.record.memory_records import MemoryRecords

    calls = []
    original = fast.zstd_decode

    def counting(payload: Any) -> bytes:
        calls.append(len(payload))
        return original(payload)

    values = [os.urandom(50) * 40 for _ in range(5)]
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=4,  # zstd
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i, v in enumerate(values):
        builder.append(i, timestamp=None, key=b"k", value=v, headers=[])
    raw = bytes(builder.build())
    import aiokafka.record._crecords.default_records as c_records

    c_records.zstd_decode = counting
    try:
        batch = MemoryRecords(raw).next_batch()
        assert [r.value for r in batch] == values
    finally:
        fast.install()  # back to the plain fast decoder
    assert calls, "aiokafka's record batch did not call the installed decoder"
