"""Versioned record types carried on kernelstream's topics.

Every record has a ``schema`` field naming its type and version, e.g.
``"ks.launch_batch/2"``. The wire format is JSON (orjson). The pydantic models
below are the single definition of each record: the JSON Schema files under
``schemas/json/`` are generated from them (``python -m kernelstream.schemas.export``) and a
test keeps the two in sync.

Launch telemetry travels columnar: one :class:`LaunchBatch` carries many launches
of one kernel with one configuration on one device, as parallel arrays, and (from
version 2) the host-side gap before each launch and the batch's host<->device copies
(:class:`CopyColumns`). A reader of version 2 accepts version 1 messages unchanged.
"""

from __future__ import annotations

import itertools
import math
import struct
from typing import Annotated, Any, ClassVar, Literal, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernelstream.schemas.keys import stream_key

__all__ = [
    "MAX_DURATION_BITS",
    "MAX_DURATION_US",
    "MAX_LAUNCHES",
    "RECORD_TYPES",
    "Alert",
    "Classification",
    "CopyColumns",
    "CopyDirection",
    "DeadLetter",
    "DeviceSample",
    "Finding",
    "LaunchBatch",
    "Recommendation",
    "ReconfigOutcome",
    "Record",
    "RejectCode",
    "WindowAggregate",
    "record_type",
]

ParamValue = int | float | str | bool
Config = dict[str, ParamValue]
Classification = Literal[
    "memory_efficient",
    "memory_bottleneck",
    "under_utilization",
    "launch_bound",
    "compute_bound",
    "regression",
    "balanced",
    "roofline_unknown",
    # ks.finding/2: data movement and host stalls (agents.logic.transfers)
    "transfer_bound",
    "pageable_copies",
    "no_overlap",
    "host_sync",
]
CopyDirection = Literal["h2d", "d2h", "d2d"]
OutcomeStatus = Literal["applied", "kept", "rolled_back", "rejected"]
# Why a node refused a recommendation (ks.reconfig/2, status "rejected"). Only
# "outside_space" and "step_too_large" are about the configuration itself: the others say
# the message could not be trusted or came at the wrong time (the node was still
# measuring another change of the kernel, the recommendation had expired, ...), and the
# same configuration may be fine a moment later (agents.logic.tuning).
RejectCode = Literal[
    "bad_signature",
    "wrong_node",
    "wrong_device",
    "replayed",
    "expired",
    "stale",
    "unknown_kernel",
    "outside_space",
    "busy",
    "already_running",
    "step_too_large",
]
AlertState = Literal["raised", "withdrawn", "crossed"]
AlertScope = Literal["stream", "fleet_group", "device"]

_NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
_FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
_Name = Annotated[str, Field(min_length=1, max_length=200)]
# A record's id, derived from names: a finding's is its stream key (a node and a kernel
# name), configuration id and window start, and a recommendation's or an outcome's adds
# to those. Names of 200 characters each make ids of about 650.
_Id = Annotated[str, Field(min_length=1, max_length=1024)]


class Record(BaseModel):
    """Base of all records: strict, frozen, no unknown fields, finite numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    SCHEMA: ClassVar[str] = ""  # overridden per subclass: the ``schema`` literal value

    schema_: str = Field(alias="schema")

    def to_wire(self) -> dict[str, Any]:
        """Dict ready for orjson (aliases applied, ``schema`` field included)."""
        return self.model_dump(by_alias=True, mode="json")

    @classmethod
    def computed(cls, fields: dict[str, Any]) -> Self:
        """The record of ``fields`` (by field name) that the worker computed from records
        it validated, built without validating them again.

        Records are validated at the edge; a window or a finding the worker derives
        from validated launches would pass again, and validating its forty fields
        costs about 6 us, a fifth of publishing a window of a small stream. The caller
        guarantees what validation would check: each value of its field's type and
        within its bounds (quotients through :func:`agents.logic.ratios.finite_ratio`);
        a test holds the result equal to ``cls(**fields)``, types and fields set
        included. ``fields`` becomes the record's own: the caller does not keep it.
        Unknown and missing fields raise ``TypeError``.
        """
        plan = _COMPUTED.get(cls)
        if plan is None:
            plan = _COMPUTED[cls] = _computed_plan(cls)
        defaults, required, factories = plan
        state = defaults.copy()
        state.update(fields)
        if len(state) != len(defaults) or not required <= fields.keys():
            unknown = sorted(fields.keys() - defaults.keys())
            missing = sorted(required - fields.keys())
            raise TypeError(f"{cls.__name__}: unknown fields {unknown}, missing {missing}")
        for name, factory in factories:
            if name not in fields:
                state[name] = factory()
        return cls._of_state(state, set(fields))

    @classmethod
    def template(cls) -> dict[str, Any]:
        """A new dict of the record's fields in their order, each its default (a
        required field's a placeholder): for :meth:`computed_from`, once filled in.

        A worker that builds many records alike (a stream's windows: the same node,
        kernel, configuration and roofline every second) keeps one filled in with what
        they share and copies it per record, where :meth:`computed` checks names,
        orders and fills in forty fields a record (about 2.5 us of the 9 that building a
        window record took).
        """
        plan = _COMPUTED.get(cls)
        if plan is None:
            plan = _COMPUTED[cls] = _computed_plan(cls)
        return plan[0].copy()

    @classmethod
    def computed_from(cls, state: dict[str, Any], fields_set: set[str]) -> Self:
        """:meth:`computed` of a copy of :meth:`template` with every field filled in
        (``fields_set``: the names given, as :meth:`computed` would count them). Nothing
        is checked, names neither: the caller fills in each required field, tested as
        :meth:`computed` is. ``state`` and ``fields_set`` become the record's own."""
        return cls._of_state(state, fields_set)

    @classmethod
    def _of_state(cls, state: dict[str, Any], fields_set: set[str]) -> Self:
        out = cls.__new__(cls)
        object.__setattr__(out, "__dict__", state)
        object.__setattr__(out, "__pydantic_fields_set__", fields_set)
        object.__setattr__(out, "__pydantic_extra__", None)
        object.__setattr__(out, "__pydantic_private__", None)
        return out


# (defaults in field order, a placeholder for the required and the factory-made; the
# required fields; (name, default factory) pairs) per record type, for Record.computed
_ComputedPlan = tuple[dict[str, Any], frozenset[str], tuple[tuple[str, Any], ...]]
_COMPUTED: dict[type[Record], _ComputedPlan] = {}


def _computed_plan(cls: type[Record]) -> _ComputedPlan:
    if cls.__pydantic_post_init__ or cls.__private_attributes__:
        raise TypeError(f"{cls.__name__} has private attributes or a post-init hook")
    defaults: dict[str, Any] = {}
    required, factories = set(), []
    for name, info in cls.model_fields.items():
        defaults[name] = info.default
        if info.is_required():
            required.add(name)
        elif info.default_factory is not None:
            factories.append((name, info.default_factory))
    return defaults, frozenset(required), tuple(factories)


# No GPU clocks its SMs or memory above 10 GHz (the fastest datasheet boost clocks are
# near 3 GHz) nor holds more than 16 TiB: a sample beyond these is a unit or driver error.
_MAX_CLOCK_MHZ = 10_000.0
_MAX_DEVICE_BYTES = float(1 << 44)
_ClockMHz = Annotated[float, Field(ge=0.0, le=_MAX_CLOCK_MHZ, allow_inf_nan=False)]
_DeviceBytes = Annotated[float, Field(ge=0.0, le=_MAX_DEVICE_BYTES, allow_inf_nan=False)]


class DeviceSample(BaseModel):
    """A device sample taken off the hot path (NVML on real GPUs, modelled on sim)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    t: _FiniteFloat
    sm_util_pct: _NonNegFloat | None = None
    mem_used_bytes: _DeviceBytes | None = None
    power_w: _NonNegFloat | None = None
    sm_clock_mhz: _ClockMHz | None = None
    mem_clock_mhz: _ClockMHz | None = None
    sm_occupancy_pct: _NonNegFloat | None = None
    dram_bw_util_pct: _NonNegFloat | None = None


def _flags(v: Any) -> Any:
    """A 0/1 column as numbers: Literal[0, 1] takes True as 1 even in strict mode."""
    if isinstance(v, list) and any(type(x) is bool for x in v):
        raise ValueError("the column holds booleans; it must be the numbers 0 and 1")
    return v


# No copy moves data faster than the fastest memory it touches: HBM3e peaks at 8 TB/s
# (NVIDIA B200 datasheet) and NVLink 5 at 1.8 TB/s per GPU (NVIDIA Blackwell datasheet).
# A copy reported faster than 20 TB/s is a clock or unit error, not a measurement.
_MAX_COPY_GBS = 20_000.0
_MAX_COPY_BYTES = 1 << 44  # 16 TiB: more than any GPU's memory
#: The longest duration a record may carry (an hour, in us) and the most launches one
#: launch batch may hold: the model's bounds, which the vectorized checks of a batch's
#: columns (schemas.columnar on the worker, kernels.runner on the node) also apply.
MAX_DURATION_US = 3.6e9
#: The bit pattern of MAX_DURATION_US read as an unsigned little-endian integer. Bit
#: patterns of non-negative doubles sort as the doubles do, and every negative number and
#: NaN has a larger pattern than +inf: one unsigned maximum of a column's patterns checks
#: 0 <= d <= MAX_DURATION_US and "no NaN" at once (-0.0, which the model takes, fails it
#: and is left to the model).
MAX_DURATION_BITS: int = struct.unpack("<Q", struct.pack("<d", MAX_DURATION_US))[0]
MAX_LAUNCHES = 100_000
_Duration = Annotated[float, Field(ge=0.0, le=MAX_DURATION_US, allow_inf_nan=False)]
# Launches counted in a window, a finding or an outcome: at most 2^53, where every count
# is still exact as a double (a tuner's sum of durations stays finite).
_Count = Annotated[int, Field(ge=0, le=1 << 53)]
_Flag = Literal[0, 1]


class CopyColumns(BaseModel):
    """Host<->device (and device-to-device) copies of one stream, columnar.

    Per copy: the node's clock at its completion (``t_end``), its ``direction``
    (``h2d``, ``d2h`` or ``d2d``), ``bytes``, ``duration_us`` (CUDA events on a GPU),
    ``pinned`` (1 when the host buffer was page-locked; 1 for ``d2d``) and the CUDA
    ``stream`` it was queued on (0 is the legacy default stream).
    """

    # Strict, as the launch batch: ``true`` is not 1, ``"5"`` is not 5.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    t_end: list[_FiniteFloat] = Field(min_length=1, max_length=MAX_LAUNCHES)
    direction: list[CopyDirection]
    bytes: list[Annotated[int, Field(ge=0, le=_MAX_COPY_BYTES)]]
    duration_us: list[_Duration]
    pinned: list[_Flag]
    stream: list[Annotated[int, Field(ge=0, le=(1 << 63) - 1)]]

    def __len__(self) -> int:
        return len(self.t_end)

    @field_validator("pinned", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any) -> Any:
        return _flags(v)

    @model_validator(mode="after")
    def _possible(self) -> CopyColumns:
        n = len(self.t_end)
        lengths = {
            name: len(getattr(self, name))
            for name in ("direction", "bytes", "duration_us", "pinned", "stream")
        }
        if any(v != n for v in lengths.values()):
            shown = ", ".join(f"{k}={v}" for k, v in lengths.items())
            raise ValueError(f"columns differ in length: t_end={n}, {shown}")
        for i, (b, d) in enumerate(zip(self.bytes, self.duration_us, strict=True)):
            if b > 0 and (d <= 0.0 or b / (d * 1e3) > _MAX_COPY_GBS):
                raise ValueError(
                    f"impossible copy {i}: {b} bytes in {d} us is faster than "
                    f"{_MAX_COPY_GBS:.0f} GB/s, above any GPU link or memory"
                )
        return self


class LaunchBatch(Record):
    """Many launches of one kernel, one config, one device; columnar.

    ``t_end`` is the node's clock (Unix seconds) at kernel completion, the event
    time. ``duration_us`` is the measured kernel duration; ``ok`` is 1 for a
    launch that ran and 0 for a launch failure (its duration is 0). Nodes send
    ``t_end`` to 1 µs and ``duration_us`` to 1 ns (finer than CUDA events resolve).
    """

    # Strict: numbers must be JSON numbers (``true`` is not 1, ``"5"`` is not 5).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    SCHEMA: ClassVar[str] = "ks.launch_batch/2"
    schema_: Literal["ks.launch_batch/1", "ks.launch_batch/2"] = Field(
        default="ks.launch_batch/2", alias="schema"
    )

    node: _Name
    device_index: int = Field(ge=0, le=1024)
    device_model: _Name
    backend: Literal["sim", "trace", "cupy"]
    kernel: _Name
    workload: _Name
    problem_size: list[int] = Field(min_length=1, max_length=4)
    config: Config
    config_id: _Name
    grid: list[int] = Field(min_length=3, max_length=3)
    block: list[int] = Field(min_length=3, max_length=3)
    dynamic_smem_bytes: int = Field(ge=0)
    registers_per_thread: int | None = Field(default=None, ge=0)
    bytes_moved: _NonNegFloat
    flops: _NonNegFloat
    occupancy: float = Field(ge=0.0, le=1.0)
    # Where registers and shared memory behind ``occupancy`` came from: "estimate", the
    # compiler ("nvrtc 12.9 sm_90") or the GPU's loaded module ("cupy module").
    resources_source: _Name | None = None
    waves: _NonNegFloat
    # 0: the GPU model's peaks are not known (kernels.devices.DeviceSpec.unknown), so the
    # launches are not placed on a roofline.
    peak_gbs: _NonNegFloat
    peak_gflops: _NonNegFloat
    launch_overhead_us: _NonNegFloat = 3.0
    seq_start: int = Field(ge=0)
    t_end: list[_FiniteFloat] = Field(min_length=1, max_length=MAX_LAUNCHES)
    duration_us: list[_Duration]
    ok: list[Literal[0, 1]]
    samples: list[DeviceSample] = Field(default_factory=list, max_length=1000)
    # Version 2: per launch, the host's time between the previous launch on this stream
    # returning and this one being queued, and 1 when the host waited on the device
    # (a synchronize, a blocking copy) in that gap; the stream's copies.
    host_gap_us: list[_Duration] | None = None
    host_waited: list[_Flag] | None = None
    copies: CopyColumns | None = None

    @property
    def device_key(self) -> str:
        """``node:device_index``, the unit a partition owns together with the kernel."""
        return f"{self.node}:{self.device_index}"

    @property
    def stream_key(self) -> str:
        """Kafka key of launches and windows: ``device_key/kernel``."""
        return stream_key(self.node, self.device_index, self.kernel)

    @field_validator("ok", "host_waited", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any) -> Any:
        # Literal[0, 1] takes True as 1 even in strict mode: the column is numbers.
        return _flags(v)

    @model_validator(mode="after")
    def _columns_agree(self) -> LaunchBatch:
        n = len(self.t_end)
        if len(self.duration_us) != n or len(self.ok) != n:
            raise ValueError(
                f"columns differ in length: t_end={n}, duration_us={len(self.duration_us)}, "
                f"ok={len(self.ok)}"
            )
        ts = [s.t for s in self.samples]
        if any(b < a for a, b in itertools.pairwise(ts)):
            raise ValueError("device samples are not in time order (t goes backwards)")
        for name in _V2_COLUMNS:
            column = getattr(self, name)
            if column is not None and len(column) != n:
                raise ValueError(f"columns differ in length: t_end={n}, {name}={len(column)}")
        if self.schema_ == "ks.launch_batch/1":
            extra = [f for f in (*_V2_COLUMNS, "copies") if getattr(self, f) is not None]
            if extra:
                raise ValueError(f"ks.launch_batch/1 has no {', '.join(extra)} (added in /2)")
        return self


_V2_COLUMNS = ("host_gap_us", "host_waited")


class WindowAggregate(Record):
    """One closed event-time window of one (device, kernel, config).

    Version 2 adds what the device samples that arrived with the window's batches say
    (absent when none did): how many, their mean SM clock and their largest memory
    used. A reader of version 2 accepts version 1 messages unchanged.
    """

    SCHEMA: ClassVar[str] = "ks.window/2"
    schema_: Literal["ks.window/1", "ks.window/2"] = Field(default="ks.window/2", alias="schema")

    node: _Name
    device_index: int = Field(ge=0)
    device_model: _Name
    kernel: _Name
    workload: _Name
    problem_size: list[int]
    config: Config
    config_id: _Name
    window_start: _FiniteFloat
    window_end: _FiniteFloat
    count: _Count
    failures: _Count
    late_accepted: _Count = 0
    duration_mean_us: _Duration  # of launches of at most 3.6e9 us each
    duration_p50_us: _Duration
    duration_p95_us: _Duration
    duration_min_us: _Duration
    duration_max_us: _Duration
    duration_std_us: _Duration
    busy_fraction: _NonNegFloat
    idle_gap_mean_us: _NonNegFloat
    achieved_gbs: _NonNegFloat
    achieved_gflops: _NonNegFloat
    bw_fraction: _NonNegFloat
    flops_fraction: _NonNegFloat
    arithmetic_intensity: _NonNegFloat
    occupancy: _NonNegFloat
    resources_source: _Name | None = None
    waves: _NonNegFloat
    peak_gbs: _NonNegFloat
    peak_gflops: _NonNegFloat
    launch_overhead_us: _NonNegFloat
    seq_min: int = Field(ge=0)
    seq_max: int = Field(ge=0)
    # Version 2: the device samples of the window (see the class docstring).
    device_samples: int | None = Field(default=None, ge=1)
    sm_clock_mean_mhz: _ClockMHz | None = None
    mem_used_max_bytes: _DeviceBytes | None = None

    @model_validator(mode="after")
    def _known_in_version(self) -> WindowAggregate:
        if self.schema_ == "ks.window/1":
            extra = [f for f in _WINDOW_V2_FIELDS if getattr(self, f) is not None]
            if extra:
                raise ValueError(f"ks.window/1 has no {', '.join(extra)} (added in /2)")
        return self

    @property
    def device_key(self) -> str:
        return f"{self.node}:{self.device_index}"

    @property
    def stream_key(self) -> str:
        return stream_key(self.node, self.device_index, self.kernel)

    @property
    def roofline_known(self) -> bool:
        """False when the GPU model's peaks are not known (reported as 0: a GPU missing
        from kernels/devices.py), so the window has no roofline to be placed on."""
        return self.peak_gbs > 0 and self.peak_gflops > 0


_WINDOW_V2_FIELDS = ("device_samples", "sm_clock_mean_mhz", "mem_used_max_bytes")


class Finding(Record):
    """A classification of one window aggregate, with its evidence."""

    SCHEMA: ClassVar[str] = "ks.finding/2"
    schema_: Literal["ks.finding/1", "ks.finding/2"] = Field(default="ks.finding/2", alias="schema")

    id: _Id
    node: _Name
    device_index: int = Field(ge=0)
    device_model: _Name
    kernel: _Name
    workload: _Name
    problem_size: list[int]
    config: Config
    config_id: _Name
    window_start: _FiniteFloat
    window_end: _FiniteFloat
    classification: Classification
    evidence: dict[str, float | int | str | bool]
    summary: str
    # The window's measurement, so the tuner (keyed by fleet group) learns from
    # findings alone without re-reading the windows topic.
    count: _Count = 0
    failures: _Count = 0
    duration_mean_us: _Duration = 0.0

    @model_validator(mode="after")
    def _known_in_version(self) -> Finding:
        if self.schema_ == "ks.finding/1" and self.classification in _FINDING_V2_CLASSES:
            raise ValueError(
                f"ks.finding/1 has no classification {self.classification!r} (added in /2)"
            )
        return self

    @classmethod
    def of_window(
        cls,
        agg: WindowAggregate,
        *,
        id: str,
        classification: Classification,
        evidence: dict[str, float | int | str | bool],
        summary: str,
    ) -> Finding:
        """The finding ``classification`` of window ``agg``: its identity and measurement.

        ``agg`` is a record (valid), so only ``evidence`` is checked: numbers finite. Their
        sum is finite when they are (where the sum overflows, validation decides).
        """
        fields = _finding_fields(agg, id, classification, evidence, summary)
        del fields["schema"]  # (the record's default)
        if _finite_evidence(evidence):
            return cls.computed(fields)
        return cls(**fields)  # raises on a number that is not finite

    @classmethod
    def wire_of_window(
        cls,
        agg: WindowAggregate,
        *,
        id: str,
        classification: Classification,
        evidence: dict[str, float | int | str | bool],
        summary: str,
    ) -> bytes:
        """``encode(Finding.of_window(...))``: the same bytes, the record not built.

        The record's JSON is its fields in their order under the ``schema`` key first
        (``schemas.codec.encode``); written here from the same fields. Anything else
        (a number that is not finite: raises; a value orjson does not write as
        pydantic does) goes through the record. Held equal by
        ``tests/unit/agents/test_logic_detection.py``.
        """
        if _finite_evidence(evidence):
            fields = _finding_fields(agg, id, classification, evidence, summary, copy=False)
            try:
                return orjson.dumps(fields)
            except TypeError:  # a value orjson does not write as pydantic does
                pass
        # (imported here, off the path above: codec imports this module, and an import
        # statement costs ~0.6 us a call, a tenth of writing the finding)
        from kernelstream.schemas.codec import encode

        # through the record: raises on a number that is not finite
        record = cls.of_window(
            agg, id=id, classification=classification, evidence=evidence, summary=summary
        )
        return encode(record)


def _finite_evidence(evidence: dict[str, float | int | str | bool]) -> bool:
    """Whether every float of ``evidence`` is finite: their sum is when they are (where
    the sum overflows, the record's validation decides)."""
    return math.isfinite(sum([v for v in evidence.values() if type(v) is float]))


def _finding_fields(
    agg: WindowAggregate,
    id: str,
    classification: Classification,
    evidence: dict[str, float | int | str | bool],
    summary: str,
    *,
    copy: bool = True,
) -> dict[str, Any]:
    """The fields of a finding of ``agg`` under their wire names, in the record's order
    (``copy``: the window's list and dict copied, for a record of its own)."""
    return {
        "schema": Finding.SCHEMA,
        "id": id,
        "node": agg.node,
        "device_index": agg.device_index,
        "device_model": agg.device_model,
        "kernel": agg.kernel,
        "workload": agg.workload,
        "problem_size": list(agg.problem_size) if copy else agg.problem_size,
        "config": dict(agg.config) if copy else agg.config,
        "config_id": agg.config_id,
        "window_start": agg.window_start,
        "window_end": agg.window_end,
        "classification": classification,
        "evidence": evidence,
        "summary": summary,
        "count": agg.count,
        "failures": agg.failures,
        "duration_mean_us": agg.duration_mean_us,
    }


_FINDING_V2_CLASSES = ("transfer_bound", "pageable_copies", "no_overlap", "host_sync")


class Recommendation(Record):
    """A new configuration for one kernel on one node's device.

    Keyed by node id on the wire so each node reads only its own partition.
    """

    SCHEMA: ClassVar[str] = "ks.recommendation/1"
    schema_: Literal["ks.recommendation/1"] = Field(default="ks.recommendation/1", alias="schema")

    id: _Id
    node: _Name
    device_index: int = Field(ge=0)
    device_model: _Name
    kernel: _Name
    workload: _Name
    problem_size: list[int]
    from_config_id: _Name
    config: Config
    config_id: _Name
    reason: str
    evidence: dict[str, float | int | str | bool]
    # current / expected duration - 1: above -1; negative for a step the recommender
    # expects to be slower (an exploration step).
    expected_gain: Annotated[float, Field(gt=-1.0, allow_inf_nan=False)]
    issued_at: _FiniteFloat
    expires_at: _FiniteFloat
    # Ed25519 signature (base64) by the recommender over every other field
    # (see app.signing); ``key_id`` names the signing key. Absent when signing is off.
    signature: str | None = Field(default=None, max_length=200)
    key_id: str | None = Field(default=None, max_length=200)

    @field_validator("expires_at")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("expires_at must be finite")
        return v


class ReconfigOutcome(Record):
    """What a node did with a recommendation, with before/after measurements.

    Version 2 adds ``reject_code`` to a refusal: why, as a :data:`RejectCode` (the
    ``reason`` says it in words). A reader of version 2 accepts version 1 messages
    unchanged; a refusal without a code is one whose reason is not known.
    """

    SCHEMA: ClassVar[str] = "ks.reconfig/2"
    schema_: Literal["ks.reconfig/1", "ks.reconfig/2"] = Field(
        default="ks.reconfig/2", alias="schema"
    )

    id: _Id
    recommendation_id: _Id
    node: _Name
    device_index: int = Field(ge=0)
    device_model: _Name
    kernel: _Name
    workload: _Name
    problem_size: list[int]
    status: OutcomeStatus
    reason: str
    before_config: Config
    before_config_id: _Name
    after_config: Config
    after_config_id: _Name
    before_mean_us: _Duration | None = None
    after_mean_us: _Duration | None = None
    before_count: _Count = 0
    after_count: _Count = 0
    speedup: _NonNegFloat | None = None
    at: _FiniteFloat
    reject_code: RejectCode | None = None

    @model_validator(mode="after")
    def _code_of_a_refusal(self) -> ReconfigOutcome:
        if self.reject_code is not None:
            if self.schema_ == "ks.reconfig/1":
                raise ValueError("ks.reconfig/1 has no reject_code (added in /2)")
            if self.status != "rejected":
                raise ValueError(f"reject_code given for status {self.status!r}")
        return self


class DeadLetter(Record):
    """Input a stage could not accept: the original bytes (base64) and why."""

    SCHEMA: ClassVar[str] = "ks.deadletter/1"
    schema_: Literal["ks.deadletter/1"] = Field(default="ks.deadletter/1", alias="schema")

    stage: _Name
    topic: _Name
    partition: int | None = None
    offset: int | None = None
    key_b64: str | None = None
    value_b64: str
    reason: str
    # Machine-readable class of the reason (invalid_json, wrong_type, ...), for counters.
    reason_code: str | None = Field(default=None, max_length=64)
    at: _FiniteFloat
    # An original too large to carry whole is stored by reference: ``value_b64`` holds
    # its first bytes only, and the full message stays at (topic, partition, offset),
    # identified by its size and SHA-256.
    value_truncated: bool = False
    key_truncated: bool = False
    value_bytes: int | None = Field(default=None, ge=0)
    value_sha256: str | None = Field(default=None, max_length=64)


class Alert(Record):
    """A forecast that a series will cross a threshold: raised, withdrawn or come true.

    ``scope`` names what is forecast: ``stream`` is one kernel on one device (key
    ``node:device/kernel``), ``fleet_group`` the same kernel and configuration on every
    device of a fleet group (key ``device_model/workload/size``), both with ``metric``
    ``duration_mean_us``; ``device`` (version 2) is one device whatever it runs (key
    ``node:device``), with ``metric`` ``sm_clock_mean_mhz`` (the SM clock sagging below
    ``threshold``) or ``mem_used_max_bytes`` (memory filling toward ``threshold``, the
    device's total); a device alert names no kernel, workload or configuration. A
    ``raised`` alert says the fitted trend reaches ``threshold`` ``lead_s`` seconds after
    ``at`` (at ``predicted_at``) with probability ``confidence`` within the forecast
    horizon; ``withdrawn`` says the trend no longer supports it (reversed, flattened, or
    the series stopped); ``crossed`` says the fitted level reached the threshold (for a
    duration, the detector's ``regression`` takes over). ``id`` is shared by the three
    states of one alert. A reader of version 2 accepts version 1 messages unchanged.
    """

    SCHEMA: ClassVar[str] = "ks.alert/2"
    schema_: Literal["ks.alert/1", "ks.alert/2"] = Field(default="ks.alert/2", alias="schema")

    id: _Id
    state: AlertState
    scope: AlertScope
    key: _Name
    metric: _Name
    node: _Name | None = None
    device_index: int | None = Field(default=None, ge=0)
    device_model: _Name
    kernel: _Name | None = None
    workload: _Name | None = None
    problem_size: list[int] = Field(default_factory=list)
    config_id: _Name | None = None
    baseline: _NonNegFloat
    threshold: _NonNegFloat
    level: _NonNegFloat
    slope_per_h: _FiniteFloat
    lead_s: _NonNegFloat | None = None
    predicted_at: _FiniteFloat | None = None
    confidence: float = Field(ge=0.0, le=1.0)
    points: int = Field(ge=0)
    at: _FiniteFloat
    summary: str

    @model_validator(mode="after")
    def _names_its_series(self) -> Alert:
        if self.schema_ == "ks.alert/1" and self.scope == "device":
            raise ValueError("ks.alert/1 has no scope 'device' (added in /2)")
        if self.scope != "device" and (
            self.kernel is None or self.workload is None or self.config_id is None
        ):
            raise ValueError(f"a {self.scope} alert names its kernel, workload and config_id")
        return self


RECORD_TYPES: dict[str, type[Record]] = {
    cls.SCHEMA: cls
    for cls in (
        LaunchBatch,
        WindowAggregate,
        Finding,
        Recommendation,
        ReconfigOutcome,
        DeadLetter,
        Alert,
    )
}

# Older versions a current model still reads unchanged; their JSON Schema files stay in
# schemas/json/ as they were published.
_OLDER_VERSIONS: dict[str, type[Record]] = {
    "ks.launch_batch/1": LaunchBatch,
    "ks.finding/1": Finding,
    "ks.window/1": WindowAggregate,
    "ks.alert/1": Alert,
    "ks.reconfig/1": ReconfigOutcome,
}


def record_type(schema: object) -> type[Record] | None:
    """The model that reads records of ``schema`` (a current or an older version)."""
    key = str(schema)
    return RECORD_TYPES.get(key) or _OLDER_VERSIONS.get(key)
