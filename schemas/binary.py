"""The binary wire format of launch batches: per-batch fields as JSON, columns as raw arrays.

A JSON launch batch spends most of the worker's decode time parsing numbers (orjson
builds a Python float per launch, the worker packs them back into an array). In this
format the columns travel as little-endian arrays that the worker maps into NumPy with
``np.frombuffer`` (no parse, no copy); the per-batch fields stay JSON, so a stream that
keeps its configuration sends the same bytes batch after batch and the worker validates
them once. Layout, all integers little-endian::

    offset  size  field
    0       4     magic b"KSLB" (a JSON message starts with "{", so the two never collide)
    4       1     layout version (1); an unknown version is refused, never guessed
    5       3     zero
    8       4     n, launches in the batch
    12      8     seq_start (u64)
    20      4     m, bytes of the per-batch JSON
    24      8     zero
    32      m     per-batch fields: the ``ks.launch_batch/1`` record without its columns
                  and ``seq_start``, plus "columns": [[name, dtype], ...] in wire order;
                  padded with spaces to a multiple of 8
    ...           each column in that order: n values of its dtype ("<f8", "|u1"),
                  padded with zeros to a multiple of 8 bytes

The columns are the array fields of :class:`schemas.columnar.LaunchColumns`, read from
its type hints: a column added there (and to :class:`LaunchBatch`) travels without a
change here. Validation is the model's: the checks in :mod:`schemas.columnar` decide the
plain cases and hand anything else to pydantic, whose verdict is final.

Arrow IPC (``pyarrow``) was measured for the same job (``kernelstream bench wire``): it
carries a schema and padding per message and costs a pyarrow import (~60 MB) in every node
and worker, for columns that are three flat arrays; the raw layout above reads them with
three ``frombuffer`` calls.
"""

from __future__ import annotations

import struct
import sys
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from kernelstream.schemas.errors import SchemaError

__all__ = [
    "HEAD_RECORD",
    "MAGIC",
    "BinaryBatch",
    "encode_arrays",
    "encode_launch_batch",
    "encode_parts",
    "header_json",
    "is_binary",
    "read_launch_batch",
]

MAGIC = b"KSLB"
LAYOUT_VERSION = 1
_HEAD = struct.Struct("<4sB3xIQI8x")  # 32 bytes
HEAD_SIZE = _HEAD.size
# (magic, version, n, seq_start, m) of a message at least HEAD_SIZE bytes long
read_head = _HEAD.unpack_from
# The same head as a NumPy record: the heads of many messages read at once.
HEAD_RECORD = np.dtype(
    {
        "names": ["magic", "version", "n", "seq_start", "m"],
        "formats": ["S4", "u1", "<u4", "<u8", "<u4"],
        "offsets": [0, 4, 8, 12, 20],
        "itemsize": HEAD_SIZE,
    }
)


def is_binary(data: bytes) -> bool:
    """True when ``data`` is a binary launch batch (any layout version)."""
    return data[:4] == MAGIC


def _pad8(n: int) -> int:
    return -n % 8


class BinaryBatch:
    """A binary batch split into its parts: per-batch JSON bytes, seq_start and the columns.

    ``meta_json`` excludes ``seq_start`` and the columns, so equal bytes mean an
    unchanged stream; ``columns`` are read-only views into the message.
    """

    __slots__ = ("columns", "meta_json", "n", "seq_start")

    def __init__(
        self, meta_json: bytes, seq_start: int, n: int, columns: dict[str, npt.NDArray[Any]]
    ) -> None:
        self.meta_json = meta_json
        self.seq_start = seq_start
        self.n = n
        self.columns = columns

    def meta(self) -> dict[str, Any]:
        """The per-batch fields as a dict (``columns`` removed, ``seq_start`` added)."""
        try:
            obj = orjson.loads(self.meta_json)
        except orjson.JSONDecodeError as exc:
            raise SchemaError(
                f"binary launch batch: invalid header JSON: {exc}", "invalid_json"
            ) from exc
        if not isinstance(obj, dict):
            raise SchemaError("binary launch batch: header JSON is not an object", "not_object")
        from kernelstream.schemas.codec import check_unique_keys

        check_unique_keys(self.meta_json, obj)
        obj.pop("columns", None)
        obj["seq_start"] = self.seq_start
        return obj

    def to_wire(self) -> dict[str, Any]:
        """The whole record as its JSON form has it (columns as lists; slow)."""
        wire = self.meta()
        for name, arr in self.columns.items():
            wire[name] = arr.astype(int).tolist() if arr.dtype == np.uint8 else arr.tolist()
        return wire


def read_launch_batch(data: bytes) -> BinaryBatch:
    """Split a binary launch batch; raise :class:`SchemaError` when the framing is wrong.

    Only the framing is checked here (magic, version, lengths, column names and types);
    the values are the model's business.
    """
    if len(data) < _HEAD.size:
        raise SchemaError(
            f"binary launch batch of {len(data)} bytes is shorter than its "
            f"{_HEAD.size}-byte header",
            "truncated",
        )
    magic, version, n, seq_start, m = _HEAD.unpack_from(data)
    if magic != MAGIC or version != LAYOUT_VERSION:
        raise SchemaError(
            f"binary launch batch layout version {version} is not known (this worker reads "
            f"{LAYOUT_VERSION}); upgrade the worker or send JSON",
            "unknown_schema",
        )
    pos = _HEAD.size + m + _pad8(m)
    if pos > len(data):
        raise SchemaError(
            f"binary launch batch cut off in its header: {len(data)} bytes, {pos} needed",
            "truncated",
        )
    meta_json = data[_HEAD.size : _HEAD.size + m]
    columns = _columns(data, meta_json, pos, n)
    return BinaryBatch(meta_json, seq_start, n, columns)


# Column plans by header bytes: a stream repeats its header batch after batch. Bounded.
_PLANS: dict[bytes, list[tuple[str, np.dtype[Any], int]]] = {}
_PLANS_MAX = 4096


def _plan_of(meta_json: bytes) -> list[tuple[str, np.dtype[Any], int]]:
    """The header's column plan (parsed and checked once per distinct header)."""
    hit = _PLANS.get(meta_json)
    if hit is not None:
        return hit
    plan = _plan(tuple(_declared(meta_json)))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[meta_json] = plan
    return plan


def _declared(meta_json: bytes) -> list[tuple[str, str]]:
    """The header's ``columns`` list."""
    try:
        obj = orjson.loads(meta_json)
    except orjson.JSONDecodeError as exc:
        raise SchemaError(
            f"binary launch batch: invalid header JSON: {exc}", "invalid_json"
        ) from exc
    declared = obj.get("columns") if isinstance(obj, dict) else None
    if not (isinstance(declared, list) and all(_is_pair(c) for c in declared)):
        raise SchemaError(
            "binary launch batch: header has no column list [[name, dtype], ...]", "missing_field"
        )
    return [(c[0], c[1]) for c in declared]


def _is_pair(c: object) -> bool:
    return isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)


def _columns(data: bytes, meta_json: bytes, pos: int, n: int) -> dict[str, npt.NDArray[Any]]:
    plan = _plan_of(meta_json)
    # Each column's offset, and the end of the last one, inline: this runs on every batch
    # a worker reads, and a call per column was a third of splitting a 182-launch batch.
    offsets = []
    end = pos
    for _, _, itemsize in plan:
        offsets.append(end)
        size = itemsize * n
        end += size + (-size % 8)
    if end != len(data):
        _check_lengths(data, plan, pos, n)  # raises, naming the column that is cut off
        raise SchemaError(
            f"binary launch batch has {len(data) - end} bytes after its last column", "truncated"
        )
    return {
        name: np.frombuffer(data, dtype=dtype, count=n, offset=at)
        for (name, dtype, _), at in zip(plan, offsets, strict=True)
    }


def _check_lengths(
    data: bytes, plan: list[tuple[str, np.dtype[Any], int]], pos: int, n: int
) -> None:
    for name, _, itemsize in plan:
        size = itemsize * n
        if pos + size > len(data):
            raise SchemaError(
                f"binary launch batch cut off in column {name!r}: {len(data)} bytes, "
                f"{pos + size} needed for {n} launches",
                "truncated",
            )
        pos += size + _pad8(size)


@lru_cache(maxsize=8)
def _plan(declared: tuple[tuple[str, str], ...]) -> list[tuple[str, np.dtype[Any], int]]:
    """Name, dtype and item size of each column; only the columns this version knows."""
    from kernelstream.schemas.columnar import WIRE_COLUMNS

    if list(declared) != WIRE_COLUMNS:
        raise SchemaError(
            f"binary launch batch columns {list(declared)} differ from {WIRE_COLUMNS}",
            "unknown_field",
        )
    return [(name, np.dtype(d), np.dtype(d).itemsize) for name, d in declared]


def encode_launch_batch(batch: Any) -> bytes:
    """A :class:`LaunchBatch` in the binary layout (its JSON form is ``schemas.encode``).

    >>> from kernelstream.schemas.columnar import decode_launch_columns
    >>> from kernelstream.schemas.records import LaunchBatch
    >>> b = LaunchBatch(node="n", device_index=0, device_model="A100", backend="sim",
    ...     kernel="k", workload="k", problem_size=[1], config={}, config_id="c",
    ...     grid=[1, 1, 1], block=[1, 1, 1], dynamic_smem_bytes=0, bytes_moved=1.0,
    ...     flops=1.0, occupancy=1.0, waves=1.0, peak_gbs=1.0, peak_gflops=1.0,
    ...     seq_start=7, t_end=[1.5, 2.5], duration_us=[3, 4], ok=[1, 0])
    >>> cols = decode_launch_columns(encode_launch_batch(b))
    >>> cols.meta.seq_start, cols.t_end.tolist(), cols.ok.tolist()
    (7, [1.5, 2.5], [True, False])
    """
    columns, _ = _WIRE_PLAN or _wire_plan()
    fields = batch.__dict__
    return encode_parts(header_json(batch), batch.seq_start, [fields[c] for c, _ in columns])


def header_json(batch: Any) -> bytes:
    """The per-batch JSON of ``batch`` in the binary layout: every field but the columns
    and ``seq_start``, and the ``columns`` list. Batches of a stream that differ only in
    those carry the same bytes (a node can build them once: ``kernels.runner.NodeBatch``)."""
    columns, skip = _WIRE_PLAN or _wire_plan()
    meta = {"schema": batch.SCHEMA}
    for k, v in batch.__dict__.items():  # what model_dump would give, without its cost
        if k not in skip:
            meta[k] = v
    meta["columns"] = columns
    return orjson.dumps(meta, default=_dump_model)


# The wire columns and the fields the header leaves out, built on first use (the columns
# are read from schemas.columnar, which imports this module): a node encodes a batch every
# few milliseconds per stream, and with ~180-launch batches the per-batch Python work, not
# the columns, is most of the encoding (11.5 us a batch, 63 ns a launch, before this plan
# and the framing below were kept; ``bench pipeline-peers`` prints the cost per launch).
_WIRE_PLAN: tuple[list[tuple[str, str]], frozenset[str]] | None = None


def _wire_plan() -> tuple[list[tuple[str, str]], frozenset[str]]:
    global _WIRE_PLAN
    from kernelstream.schemas.columnar import WIRE_COLUMNS

    skip = frozenset({name for name, _ in WIRE_COLUMNS} | {"seq_start", "schema_"})
    _WIRE_PLAN = (WIRE_COLUMNS, skip)
    return _WIRE_PLAN


def _dump_model(obj: Any) -> Any:
    """orjson's fallback for nested models (device samples)."""
    dump = getattr(obj, "model_dump", None)
    if dump is None:
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")
    return dump(mode="python")


def encode_parts(meta_json: bytes, seq_start: int, columns: list[Any]) -> bytes:
    """Frame already-encoded per-batch JSON (with its ``columns`` list) and the column values.

    ``columns`` follow :data:`schemas.columnar.WIRE_COLUMNS`; each may be a list or an array.
    A node that keeps the header bytes of a stream pays only for the columns per batch.
    """
    wire, _ = _WIRE_PLAN or _wire_plan()
    n = len(columns[0])
    m = len(meta_json)
    parts = [_HEAD.pack(MAGIC, LAYOUT_VERSION, n, seq_start, m), meta_json, _SPACES[-m % 8]]
    for (_, dtype), values in zip(wire, columns, strict=True):
        raw = _column_bytes(values, dtype, n)
        parts.append(raw)
        parts.append(_ZEROS[-len(raw) % 8])
    return b"".join(parts)


def encode_arrays(
    meta_json: bytes,
    seq_start: int,
    t_end: npt.NDArray[np.float64],
    duration_us: npt.NDArray[np.float64],
    ok: npt.NDArray[np.uint8],
) -> bytes:
    """:func:`encode_parts` of the three wire columns as arrays of their wire types
    (``<f8``, ``<f8``, ``|u1``, of one length): the same bytes, framed directly.

    What a node pays per batch beyond the arrays' bytes: one header, one join. Both
    double columns are whole 8-byte words, so only the flags need padding. Columns of
    other types go through :func:`encode_parts`, which converts them.
    """
    n = t_end.size
    if not (
        t_end.dtype is _F8 is duration_us.dtype  # identity: a dtype's == costs ~0.3 us
        and ok.dtype is _U1
        and duration_us.size == ok.size == n
    ):
        return encode_parts(meta_json, seq_start, [t_end, duration_us, ok])
    m = len(meta_json)
    return b"".join(
        (
            _HEAD.pack(MAGIC, LAYOUT_VERSION, n, seq_start, m),
            meta_json,
            _SPACES[-m % 8],
            t_end.tobytes(),
            duration_us.tobytes(),
            ok.tobytes(),
            _ZEROS[-n % 8],
        )
    )


_F8, _U1 = np.dtype("<f8"), np.dtype("|u1")  # NumPy's own instances (on little-endian)
_SPACES = [b" " * i for i in range(8)]  # padding by length, built once
_ZEROS = [b"\0" * i for i in range(8)]


_LITTLE = sys.byteorder == "little"


def _column_bytes(values: Any, dtype: str, n: int) -> bytes:
    """One column's bytes. From a list, ``struct`` packs doubles at ~9 ns a value against
    ~25 for ``np.asarray`` (see :func:`schemas.columnar._floats`), and ``bytes`` takes 0/1
    flags in one C pass."""
    if type(values) is list and _LITTLE:
        if dtype == "<f8":
            return _doubles(n).pack(*values)
        if dtype == "|u1":
            return bytes(values)
    elif type(values) is np.ndarray and values.dtype.str == dtype:
        return values.tobytes()  # a node's arrays (kernels.runner.NodeBatch): a copy
    return np.asarray(values, dtype=dtype).tobytes()


@lru_cache(maxsize=64)
def _doubles(n: int) -> struct.Struct:
    return struct.Struct(f"@{n}d")  # native order, little-endian here: no byte swapping
