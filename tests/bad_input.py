"""A catalogue of bad launch-batch messages, one or more per class of the issue.

Shared by the unit test of the edge decoder and the integration test through a
real worker. Each entry: (name, expected reason code, key, value bytes).

Duplicates (a batch whose (node, device, kernel, seq) was already counted) are not
here: deciding them needs the window agent's own state (worker-side exactly-once).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.schemas import LaunchBatch, encode

__all__ = ["BadInput", "bad_inputs", "good_batch"]

BadInput = tuple[str, str, bytes | None, bytes]
_SIZES = {"matmul": [2048], "transpose": [8192, 8192], "reduction": [1 << 20]}


def good_batch(node: str, kernel: str, t0: float, n: int, seq_start: int) -> LaunchBatch:
    """A valid batch of a built-in workload, ``n`` launches 10 ms apart from ``t0``."""
    return make_example_batch(
        [t0 + 0.01 * i for i in range(n)],
        [50.0 + (i % 7) for i in range(n)],
        [0 if i % 17 == 0 else 1 for i in range(n)],
        node=node,
        kernel=kernel,
        seq_start=seq_start,
        problem_size=_SIZES.get(kernel, [1 << 20]),
    )


def _wire(batch: LaunchBatch, **changes: Any) -> dict[str, Any]:
    obj = batch.to_wire()
    obj.update(changes)
    return obj


def bad_inputs(template: LaunchBatch, now: float, oversize_bytes: int) -> list[BadInput]:
    """Bad messages built from a valid ``template`` batch (its key is its stream key)."""
    key = template.stream_key.encode()
    good = encode(template)
    n = len(template.t_end)

    def js(obj: Any) -> bytes:
        return orjson.dumps(obj)

    without_kernel = _wire(template)
    del without_kernel["kernel"]
    return [
        ("invalid JSON", "invalid_json", key, b"{this is not json"),
        ("not UTF-8 text", "invalid_json", key, b"\xff\xfe\x00garbage"),
        ("wrong type", "wrong_type", key, js(_wire(template, node=42))),
        ("wrong column type", "wrong_type", key, js(_wire(template, ok=["yes"] * n))),
        ("missing field", "missing_field", key, js(without_kernel)),
        (
            "NaN duration",
            "non_finite",
            key,
            json.dumps(_wire(template, duration_us=[float("nan")] * n)).encode(),
        ),
        ("infinite time", "non_finite", key, good.replace(b'"t_end":[', b'"t_end":[1e999,', 1)),
        ("negative duration", "out_of_range", key, js(_wire(template, duration_us=[-5.0] * n))),
        ("absurd duration", "out_of_range", key, js(_wire(template, duration_us=[1e12] * n))),
        ("oversized", "oversized", key, good[:-1] + b',"pad":"' + b"x" * oversize_bytes + b'"}'),
        (
            "unknown schema version",
            "unknown_schema",
            key,
            js(_wire(template, schema="ks.launch_batch/2")),
        ),
        (
            "unknown kernel",
            "unknown_kernel",
            key.replace(template.kernel.encode(), b"my-secret-kernel"),
            js(_wire(template, kernel="my-secret-kernel", workload="my-secret-kernel")),
        ),
        (
            "size a known kernel refuses",
            "unknown_kernel",
            key,
            js(_wire(template, workload="transpose", problem_size=[3])),
        ),
        ("far future", "bad_timestamp", key, js(_wire(template, t_end=[now + 86_400.0] * n))),
        ("far past", "bad_timestamp", key, js(_wire(template, t_end=[1_000_000.0] * n))),
        ("truncated message", "truncated", key, good[: len(good) // 2]),
        ("truncated column", "truncated", key, js(_wire(template, duration_us=[1.0] * (n - 1)))),
        ("non-UTF-8 key", "bad_key", b"\xff\xfenode", good),
        ("key of another stream", "bad_key", b"other:0/matmul", good),
        ("not an object", "not_object", key, b"[1, 2, 3]"),
    ]
