"""Schema round trips, validation errors, and JSON Schema files in sync with the models."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jsonschema
import orjson
import pytest
from pydantic import ValidationError

from kernelstream.schemas import (
    RECORD_TYPES,
    DeadLetter,
    DeviceSample,
    Finding,
    LaunchBatch,
    Recommendation,
    ReconfigOutcome,
    Record,
    SchemaError,
    WindowAggregate,
    decode,
    decode_any,
    encode,
)
from kernelstream.schemas.export import SCHEMA_DIR, json_schema_of, schema_filename


def launch_batch(**over: object) -> LaunchBatch:
    base: dict[str, object] = dict(
        node="n1",
        device_index=0,
        device_model="A100-SXM4-80GB",
        backend="sim",
        kernel="matmul",
        workload="matmul",
        problem_size=[2048],
        config={"tile": 8, "shared": 0},
        config_id="tile=8,shared=0",
        grid=[256, 256, 1],
        block=[8, 8, 1],
        dynamic_smem_bytes=0,
        registers_per_thread=32,
        bytes_moved=1e8,
        flops=1.7e10,
        occupancy=0.5,
        waves=3.2,
        peak_gbs=2039.0,
        peak_gflops=19500.0,
        seq_start=10,
        t_end=[1.0, 1.1, 1.2],
        duration_us=[100.0, 101.5, 0.0],
        ok=[1, 1, 0],
    )
    base.update(over)
    return LaunchBatch.model_validate(base)


def samples() -> list[Record]:
    b = launch_batch()
    common = dict(
        node="n1",
        device_index=0,
        device_model="A100",
        kernel="matmul",
        workload="matmul",
        problem_size=[2048],
    )
    w = WindowAggregate(
        **common,
        config={"a": 1},
        config_id="a=1",
        window_start=0.0,
        window_end=1.0,
        count=3,
        failures=0,
        duration_mean_us=1.0,
        duration_p50_us=1.0,
        duration_p95_us=1.0,
        duration_min_us=1.0,
        duration_max_us=1.0,
        duration_std_us=0.0,
        busy_fraction=0.1,
        idle_gap_mean_us=3.0,
        achieved_gbs=10.0,
        achieved_gflops=1.0,
        bw_fraction=0.1,
        flops_fraction=0.01,
        arithmetic_intensity=0.1,
        occupancy=0.5,
        waves=1.0,
        peak_gbs=1.0,
        peak_gflops=1.0,
        launch_overhead_us=3.0,
        seq_min=0,
        seq_max=2,
    )
    f = Finding(
        **common,
        id="f1",
        config={"a": 1},
        config_id="a=1",
        window_start=0.0,
        window_end=1.0,
        classification="memory_bottleneck",
        evidence={"bw_fraction": 0.1},
        summary="slow",
        count=3,
        duration_mean_us=1.0,
    )
    r = Recommendation(
        **common,
        id="r1",
        from_config_id="a=1",
        config={"a": 2},
        config_id="a=2",
        reason="why",
        evidence={},
        expected_gain=1.2,
        issued_at=0.0,
        expires_at=20.0,
    )
    o = ReconfigOutcome(
        **common,
        id="o1",
        recommendation_id="r1",
        status="kept",
        reason="ok",
        before_config={"a": 1},
        before_config_id="a=1",
        after_config={"a": 2},
        after_config_id="a=2",
        before_mean_us=2.0,
        after_mean_us=1.0,
        speedup=2.0,
        at=1.0,
    )
    d = DeadLetter(stage="window", topic="ks.launches", value_b64="AAE=", reason="bad", at=1.0)
    return [b, w, f, r, o, d]


@pytest.mark.parametrize("record", samples(), ids=lambda r: type(r).__name__)
def test_round_trip(record: Record) -> None:
    data = encode(record)
    assert decode(data, type(record)) == record
    assert decode_any(data) == record


def awkward_samples() -> list[Record]:
    """The samples with values whose JSON text two writers could spell differently."""
    out = samples()
    w, r = out[1], out[3]
    for x in (5e-324, 2.2250738585072014e-308, 1e-7, 0.1, 1e16, 1e21, 1.7976931348623157e308):
        out.append(w.model_copy(update={"achieved_gbs": x, "duration_std_us": x / 3}))
    out.append(
        r.model_copy(
            update={
                "config": {
                    "a": 2**53 + 1,
                    "b": True,
                    "c": 0.30000000000000004,
                    "d": 'é\u2028\x00"😀',
                }
            }
        )
    )
    return out


@pytest.mark.parametrize("record", awkward_samples(), ids=lambda r: type(r).__name__)
def test_encode_writes_what_orjson_writes_of_the_dump(record: Record) -> None:
    # encode() lets pydantic-core write the JSON; the wire bytes stay those of
    # orjson.dumps(model_dump(by_alias=True)), which every stored topic holds.
    assert encode(record) == orjson.dumps(record.model_dump(by_alias=True, mode="python"))


def _pydantic_json(record: Record) -> bytes:
    return record.__pydantic_serializer__.to_json(record, by_alias=True)


@pytest.mark.parametrize("record", awkward_samples(), ids=lambda r: type(r).__name__)
def test_encode_writes_what_pydantic_writes(record: Record) -> None:
    # Records of plain fields are written by orjson from their attributes; the rest
    # by pydantic-core. Both give the same bytes.
    assert encode(record) == _pydantic_json(record)


def test_derived_records_take_the_plain_path() -> None:
    from kernelstream.schemas.codec import _plain_field_count

    for cls in RECORD_TYPES.values():
        if cls is LaunchBatch:  # its device samples and copies are models
            assert _plain_field_count(cls) == 0
        else:
            assert _plain_field_count(cls) == len(cls.model_fields), cls.__name__


def test_values_orjson_does_not_write_go_to_pydantic() -> None:
    r = samples()[3]
    big = r.model_copy(update={"config": {"a": 2**70}})  # past orjson's 64-bit integers
    assert encode(big) == _pydantic_json(big)
    assert b'"a":1180591620717411303424' in encode(big)
    stray = r.model_copy(update={"colour": "red"})  # not a field: not written
    assert encode(stray) == _pydantic_json(stray) == encode(r)


@pytest.mark.parametrize("record", samples(), ids=lambda r: type(r).__name__)
def test_wire_form_validates_against_json_schema_file(record: Record) -> None:
    schema = orjson.loads((SCHEMA_DIR / schema_filename(record.SCHEMA)).read_bytes())
    jsonschema.validate(orjson.loads(encode(record)), schema)


def test_schema_files_match_models() -> None:
    for schema in RECORD_TYPES:
        path = SCHEMA_DIR / schema_filename(schema)
        assert path.read_bytes() == json_schema_of(schema), (
            f"{path.name} is stale: run python -m kernelstream.schemas.export"
        )


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d.pop("kernel"), "kernel: Field required"),
        (lambda d: d.update(device_index="zero"), "device_index"),
        (lambda d: d.update(duration_us=[1.0, -5.0, 0.0]), "duration_us.1"),
        (lambda d: d.update(t_end=[1.0, 2.0]), "columns differ in length"),
        (lambda d: d.update(schema="ks.launch_batch/9"), "unknown or unexpected schema"),
        (lambda d: d.update(extra_field=1), "extra_field"),
    ],
)
def test_invalid_batches_give_clear_errors(
    mutate: Callable[[dict[str, Any]], object], needle: str
) -> None:
    d = orjson.loads(encode(launch_batch()))
    mutate(d)
    with pytest.raises(SchemaError, match=needle.replace(".", r"\.")):
        decode(orjson.dumps(d), LaunchBatch)


def test_nan_and_garbage_are_schema_errors() -> None:
    raw = encode(launch_batch()).replace(b"100.0", b"NaN")
    with pytest.raises(SchemaError, match="invalid JSON"):
        decode(raw, LaunchBatch)
    with pytest.raises(SchemaError, match="invalid JSON"):
        decode(b"\xff\xfe", LaunchBatch)
    with pytest.raises(SchemaError, match="expected a JSON object"):
        decode(b"[1,2]", LaunchBatch)
    with pytest.raises(ValueError):
        launch_batch(duration_us=[math.inf, 1.0, 1.0])


def test_oversized_message_refused_before_parsing() -> None:
    with pytest.raises(SchemaError, match="exceeds"):
        decode(b" " * (9 * 1024 * 1024), LaunchBatch)


def test_keys() -> None:
    b = launch_batch()
    assert b.stream_key == "n1:0/matmul"
    assert b.device_key == "n1:0"


def _windows() -> list[WindowAggregate]:
    """Windows the worker's windower computes: a simulated fleet with device samples,
    and the batches whose quotients overflow (tests/bad_input.OVERFLOWING)."""
    from kernelstream.agents.logic.windowing import Windower
    from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches
    from kernelstream.schemas.columnar import LaunchColumns
    from tests.bad_input import OVERFLOWING, good_batch, overflowing

    fleet = FleetSpec(nodes=2, launches_per_s_per_kernel=200.0, seconds=3.0, t0=1.7e9)
    batches = [
        b.model_copy(
            update={
                "samples": [DeviceSample(t=b.t_end[0], sm_clock_mhz=1410.0, mem_used_bytes=4e9)]
            }
        )
        if i % 5 == 0
        else b
        for i, b in enumerate(fleet_batches(fleet))
    ]
    batches += [
        overflowing(good_batch(f"x{i}", "matmul", 1.7e9, 300, 0), changes)
        for i, changes in enumerate(OVERFLOWING.values())
    ]
    w = Windower()
    for b in batches:
        w.add_columns(LaunchColumns.from_batch(b), 0.0)
    return w.flush_all()


def _same_record(built: Record, validated: Record) -> None:
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set
    assert list(built.__dict__) == list(validated.__dict__)
    for name, value in validated.__dict__.items():
        assert type(built.__dict__[name]) is type(value), name
    assert encode(built) == encode(validated) == _pydantic_json(validated)


def test_computed_windows_and_findings_are_the_validated_records() -> None:
    from kernelstream.agents.logic.detection import Detector

    windows = _windows()
    assert any(w.device_samples for w in windows) and len(windows) > 20
    detector = Detector()
    for w in windows:
        _same_record(w, WindowAggregate(**{k: getattr(w, k) for k in w.model_fields_set}))
        f = detector.classify(w)
        _same_record(f, Finding(**{k: getattr(f, k) for k in f.model_fields_set}))


def test_computed_refuses_unknown_and_missing_fields() -> None:
    w = _windows()[0]
    fields = {k: getattr(w, k) for k in w.model_fields_set}
    with pytest.raises(TypeError, match="unknown fields \\['colour'\\]"):
        WindowAggregate.computed({**fields, "colour": "red"})
    del fields["count"]
    with pytest.raises(TypeError, match="missing \\['count'\\]"):
        WindowAggregate.computed(fields)


def test_a_finding_with_evidence_that_is_not_finite_is_refused() -> None:
    w = _windows()[0]
    for bad in (math.inf, math.nan, -math.inf):
        with pytest.raises(ValidationError):
            Finding.of_window(w, id="f", classification="balanced", evidence={"r": bad}, summary="")
    big: dict[str, float | int | str | bool] = {"a": 1.7e308, "b": 1.7e308}  # sum: inf
    f = Finding.of_window(w, id="f", classification="balanced", evidence=big, summary="")
    assert f.evidence == big


@pytest.mark.parametrize(
    "index,field,value",
    [
        (1, "duration_mean_us", 3.6e9 * 1.001),  # a window: launches are at most 1 h each
        (1, "duration_p95_us", 1e300),
        (1, "count", (1 << 53) + 1),
        (2, "duration_mean_us", 1.7e308),  # a finding: the tuner sums mean x count
        (2, "count", 1 << 60),
        (4, "after_mean_us", 1e300),  # an outcome
        (4, "after_count", 1 << 60),
    ],
)
def test_durations_and_counts_past_what_launches_can_add_up_to_are_refused(
    index: int, field: str, value: float
) -> None:
    record = samples()[index]
    wire = {**record.to_wire(), field: value}
    with pytest.raises(SchemaError) as err:
        decode(orjson.dumps(wire), type(record))
    assert err.value.code == "out_of_range"


def test_an_outcome_of_version_2_says_why_a_recommendation_was_refused() -> None:
    o = next(r for r in samples() if isinstance(r, ReconfigOutcome))
    wire = orjson.loads(encode(o))
    refused = {**wire, "status": "rejected", "reject_code": "busy"}
    assert decode(orjson.dumps(refused), ReconfigOutcome).reject_code == "busy"
    # A node of version 1 sent no code; its outcomes read unchanged, a refusal's code None.
    v1 = {**wire, "schema": "ks.reconfig/1", "status": "rejected"}
    assert decode(orjson.dumps(v1), ReconfigOutcome).reject_code is None
    for bad, needle in [
        ({**refused, "schema": "ks.reconfig/1"}, "ks.reconfig/1 has no reject_code"),
        ({**refused, "status": "kept"}, "reject_code given for status 'kept'"),
        ({**refused, "reject_code": "tired"}, "reject_code"),
    ]:
        with pytest.raises(SchemaError, match=needle):
            decode(orjson.dumps(bad), ReconfigOutcome)
