"""Version 2 launch batches: host gaps, host waits and copies, through both decoders."""

from __future__ import annotations

import jsonschema
import numpy as np
import orjson
import pytest

from kernelstream.schemas import LaunchBatch, SchemaError, decode, decode_any, encode
from kernelstream.schemas.columnar import decode_launch_columns
from kernelstream.schemas.export import SCHEMA_DIR
from kernelstream.schemas.records import CopyColumns
from tests.unit.schemas.test_records import launch_batch

COPIES = CopyColumns(
    t_end=[0.99, 1.05, 1.19],
    direction=["h2d", "d2h", "d2d"],
    bytes=[1 << 26, 1 << 20, 1 << 24],
    duration_us=[5200.0, 95.0, 12.0],
    pinned=[0, 1, 1],
    stream=[0, 0, 7],
)


def v2_batch() -> LaunchBatch:
    return launch_batch(host_gap_us=[4.0, 250.0, 6.5], host_waited=[0, 1, 0], copies=COPIES)


def test_v2_batch_round_trips_through_both_decoders() -> None:
    raw = encode(v2_batch())
    assert orjson.loads(raw)["schema"] == "ks.launch_batch/2"
    assert decode(raw, LaunchBatch) == v2_batch()
    cols = decode_launch_columns(raw)
    assert cols.host_gap_us is not None and cols.host_gap_us.tolist() == [4.0, 250.0, 6.5]
    assert cols.host_waited is not None and cols.host_waited.tolist() == [False, True, False]
    assert cols.copies == COPIES
    assert cols.known_t_range == (1.0, 1.2)  # the fast columnar path, not the slow one
    assert cols.to_batch() == v2_batch()


def test_dropping_launches_drops_their_gaps_and_earlier_copies() -> None:
    cols = decode_launch_columns(encode(v2_batch())).drop_first(1)
    assert cols.host_gap_us is not None and cols.host_gap_us.tolist() == [250.0, 6.5]
    assert cols.copies is not None and cols.copies.t_end == [1.05, 1.19]


def test_version_1_messages_of_old_producers_stay_valid() -> None:
    obj = launch_batch().to_wire()
    for field in ("host_gap_us", "host_waited", "copies"):
        del obj[field]
    obj["schema"] = "ks.launch_batch/1"
    raw = orjson.dumps(obj)
    v1_file = orjson.loads((SCHEMA_DIR / "ks.launch_batch.v1.schema.json").read_bytes())
    jsonschema.validate(obj, v1_file)  # the published version 1 schema, unchanged
    assert decode(raw, LaunchBatch).schema_ == "ks.launch_batch/1"
    assert isinstance(decode_any(raw), LaunchBatch)
    cols = decode_launch_columns(raw)
    assert cols.copies is None and cols.host_gap_us is None and len(cols) == 3


def test_v2_wire_form_validates_against_its_json_schema_file() -> None:
    v2_file = orjson.loads((SCHEMA_DIR / "ks.launch_batch.v2.schema.json").read_bytes())
    jsonschema.validate(orjson.loads(encode(v2_batch())), v2_file)
    bad = orjson.loads(encode(v2_batch()))
    bad["copies"]["direction"][0] = "sideways"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, v2_file)


def test_impossible_copy_names_the_copy_and_the_bound() -> None:
    obj = orjson.loads(encode(v2_batch()))
    obj["copies"]["duration_us"][0] = 0.001  # 64 MiB in 1 ns
    with pytest.raises(SchemaError, match=r"impossible copy 0: 67108864 bytes") as err:
        decode_launch_columns(orjson.dumps(obj))
    assert err.value.code == "out_of_range"


def test_copy_of_zero_bytes_in_zero_time_is_allowed() -> None:
    cols = COPIES.model_copy(update={"bytes": [0, 0, 0], "duration_us": [0.0, 0.0, 0.0]})
    assert np.sum(cols.bytes) == 0
    CopyColumns.model_validate(cols.model_dump())


def test_the_binary_wire_form_carries_gaps_waits_and_copies() -> None:
    from kernelstream.schemas.binary import encode_launch_batch

    cols = decode_launch_columns(encode_launch_batch(v2_batch()))
    assert cols.to_batch() == v2_batch()
    plain = decode_launch_columns(encode_launch_batch(launch_batch()))
    assert plain.copies is None and plain.host_gap_us is None and len(plain) == 3
    assert decode_launch_columns(encode_launch_batch(v2_batch())).known_t_range == (1.0, 1.2)
    fast = COPIES.model_copy(update={"duration_us": [0.001, 95.0, 12.0]})  # 64 MiB in 1 ns
    for bad in (
        v2_batch().model_copy(update={"host_gap_us": [-1.0, 2.0, 3.0]}),
        v2_batch().model_copy(update={"copies": fast}),
    ):
        with pytest.raises(SchemaError) as err:
            decode_launch_columns(encode_launch_batch(bad))
        assert err.value.code == "out_of_range"
