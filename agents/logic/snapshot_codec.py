"""A compact, exact binary form of JSON-like state holding NumPy arrays.

Window state is mostly float64/int64 columns (event times, durations, sequence
numbers). Written as JSON text they cost a float formatting per launch and round
trips only by luck; here every array travels as its raw bytes after a JSON header,
so a checkpoint of a million launches is a memory copy and restores bit for bit.
Unlike pickle, decoding runs no code from the data (state is read from a topic
other workers write).

>>> import numpy as np
>>> data = unpack(pack({"a": np.arange(3, dtype=np.int64), "b": [1.5, None]}))
>>> data["a"].tolist(), data["b"]
([0, 1, 2], [1.5, None])
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import orjson

from kernelstream.agents.logic.errors import SnapshotError

__all__ = ["pack", "pack_parts", "unpack"]

_MAGIC = b"KSS1"
_HEADER = struct.Struct(">4sI")
_DTYPES = {"f8": np.float64, "i8": np.int64, "b1": np.bool_}
_TAG = "__nd__"


def pack(obj: Any) -> bytes:
    """``obj`` (dicts, lists, str, numbers, None, 1-d NumPy arrays) as bytes."""
    return b"".join(pack_parts(obj))


def pack_parts(obj: Any) -> list[bytes | memoryview]:
    """:func:`pack`'s bytes as consecutive parts: the header, then each array's own
    buffer (not copied; a file write of the parts is the only copy). The arrays must not
    change until the parts are written.

    >>> import numpy as np
    >>> parts = pack_parts({"a": np.arange(3, dtype=np.int64)})
    >>> b"".join(parts) == pack({"a": np.arange(3, dtype=np.int64)}), len(parts)
    (True, 2)
    """
    buffers: list[bytes | memoryview] = []
    offset = 0

    def default(value: Any) -> Any:
        nonlocal offset
        if isinstance(value, np.ndarray):
            arr = np.ascontiguousarray(value)
            code = arr.dtype.str[1:]
            if code not in _DTYPES or arr.ndim != 1:
                raise TypeError(f"cannot pack array of dtype {arr.dtype} and shape {arr.shape}")
            raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).data.cast("B")
            buffers.append(raw)
            offset += raw.nbytes
            return {_TAG: [offset - raw.nbytes, raw.nbytes, code]}
        if isinstance(value, np.integer | np.floating | np.bool_):
            return value.item()
        raise TypeError(f"cannot pack {type(value).__name__}")

    header = orjson.dumps(obj, default=default)
    return [_HEADER.pack(_MAGIC, len(header)) + header, *buffers]


def unpack(data: bytes) -> Any:
    """The object :func:`pack` wrote; arrays come back as (read-only) NumPy arrays."""
    try:
        magic, n = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        body = memoryview(data)[_HEADER.size + n :]
        return _arrays(orjson.loads(data[_HEADER.size : _HEADER.size + n]), body)
    except (struct.error, ValueError, KeyError, TypeError) as ex:
        raise SnapshotError(
            f"not a packed snapshot ({ex}); discard it and replay the launches topic"
        ) from ex


def _arrays(node: Any, body: memoryview) -> Any:
    if isinstance(node, dict):
        spec = node.get(_TAG)
        if spec is not None and len(node) == 1:
            start, length, code = spec
            if start < 0 or start + length > len(body):
                raise ValueError("array outside the data")
            return np.frombuffer(
                body[start : start + length], dtype=np.dtype(code).newbyteorder("<")
            )
        return {k: _arrays(v, body) for k, v in node.items()}
    if isinstance(node, list):
        return [_arrays(v, body) for v in node]
    return node
