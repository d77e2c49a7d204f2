"""A catalogue of bad launch-batch messages, one entry per class of bad input.

Shared by the unit test of the edge decoder, the integration test through a real
worker, and the table of docs/reliability/bad-input.md
(``python -m tests.bad_input`` prints it). Each entry: (name, expected reason code,
key, value bytes).

:func:`bad_inputs` are refused by the edge decoder alone; :func:`sequence_inputs`
(duplicates, implausible sequence numbers) need the window agent's state of the
stream. :data:`ACCEPTED` lists what is deliberately accepted, and why.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from kernelstream.agents.logic.windowing import make_example_batch
from kernelstream.kernels import get_workload
from kernelstream.schemas import LaunchBatch, encode

__all__ = [
    "ACCEPTED",
    "OVERFLOWING",
    "OVERSIZE_BYTES",
    "BadInput",
    "bad_inputs",
    "good_batch",
    "overflowing",
    "sequence_inputs",
]

BadInput = tuple[str, str, bytes | None, bytes | None]
# A built-in workload run under a host pattern names these in its configuration.
_HOST_KNOBS = {"pinned": 0, "streams": 1, "batch": 1, "sync_every": 0}
_SIZES = {"matmul": [2048], "transpose": [8192, 8192], "reduction": [1 << 20]}


def good_batch(node: str, kernel: str, t0: float, n: int, seq_start: int) -> LaunchBatch:
    """A valid batch of a built-in workload, ``n`` launches 10 ms apart from ``t0``,
    running the workload's default configuration."""
    size = _SIZES.get(kernel, [1 << 20])
    space = get_workload(kernel, tuple(size)).space
    return make_example_batch(
        [t0 + 0.01 * i for i in range(n)],
        [50.0 + (i % 7) for i in range(n)],
        [0 if i % 17 == 0 else 1 for i in range(n)],
        node=node,
        kernel=kernel,
        seq_start=seq_start,
        problem_size=size,
        config=dict(space.default),
        config_id=space.config_id(space.default),
    )


def _wire(batch: LaunchBatch, **changes: Any) -> dict[str, Any]:
    obj = batch.to_wire()
    obj.update(changes)
    return obj


#: Larger than the worker's default ``max_message_bytes`` (8 MiB): refused before parsing.
OVERSIZE_BYTES = 9 * 1024 * 1024
#: Larger than a dead letter can carry whole, and than the producer's default
#: ``max_request_size`` (1,000,000 bytes) once base64-encoded.
POISON_BYTES = 900_000


def bad_inputs(template: LaunchBatch, now: float) -> list[BadInput]:
    """Bad messages built from a valid ``template`` batch (its key is its stream key).

    Every size is real: the worker's default limits, the producer's default
    ``max_request_size`` for the dead letter, the record model's own bounds.
    """
    key = template.stream_key.encode()
    good = encode(template)
    n = len(template.t_end)

    def js(obj: Any) -> bytes:
        return orjson.dumps(obj)

    def without(field: str) -> dict[str, Any]:
        obj = _wire(template)
        del obj[field]
        return obj

    big = _wire(template, t_end=[now - 1.0] * 100_001, duration_us=[1.0] * 100_001)
    big["ok"] = [1] * 100_001
    config = dict(template.config)
    first_param = next(iter(config))
    t_back = [now - 2.0 + 0.01 * i for i in range(n)]
    t_back[-1] = now - 30.0
    dup_key = good.replace(b'"kernel":', b'"kernel":"other-kernel","kernel":', 1)
    nested = b"[" * 5000 + b"]" * 5000
    return [
        ("invalid JSON", "invalid_json", key, b"{this is not json"),
        ("not UTF-8 text", "invalid_json", key, b"\xff\xfe\x00garbage"),
        ("900 KB of non-JSON (poison pill)", "invalid_json", key, b"\x00" * POISON_BYTES),
        ("nesting 5000 deep", "invalid_json", key, nested),
        ("tombstone (no value)", "invalid_json", key, None),
        ("wrong type", "wrong_type", key, js(_wire(template, node=42))),
        ("wrong column type", "wrong_type", key, js(_wire(template, ok=["yes"] * n))),
        ("boolean duration", "wrong_type", key, js(_wire(template, duration_us=[True] * n))),
        ("boolean ok flag", "wrong_type", key, js(_wire(template, ok=[True] * n))),
        ("boolean device index", "wrong_type", key, js(_wire(template, device_index=True))),
        ("number as text", "wrong_type", key, js(_wire(template, seq_start="5"))),
        ("missing field", "missing_field", key, js(without("kernel"))),
        ("unknown field", "unknown_field", key, js(_wire(template, pad="x"))),
        ("duplicate JSON key", "duplicate_key", key, dup_key),
        (
            "NaN duration",
            "non_finite",
            key,
            json.dumps(_wire(template, duration_us=[float("nan")] * n)).encode(),
        ),
        ("infinite time", "non_finite", key, good.replace(b'"t_end":[', b'"t_end":[1e999,', 1)),
        ("negative duration", "out_of_range", key, js(_wire(template, duration_us=[-5.0] * n))),
        ("absurd duration", "out_of_range", key, js(_wire(template, duration_us=[1e12] * n))),
        ("negative sequence number", "out_of_range", key, js(_wire(template, seq_start=-1))),
        ("empty batch", "out_of_range", key, js(_wire(template, t_end=[], duration_us=[], ok=[]))),
        ("100,001 launches (2.5 MB)", "out_of_range", key, js(big)),
        ("occupancy above 1", "out_of_range", key, js(_wire(template, occupancy=1.5))),
        ("201-character name", "out_of_range", key, js(_wire(template, device_model="m" * 201))),
        ("9 MiB record", "oversized", key, good[:-1] + b',"pad":"' + b"x" * OVERSIZE_BYTES + b'"}'),
        ("no schema field", "unknown_schema", key, js(without("schema"))),
        (
            "unknown schema version",
            "unknown_schema",
            key,
            js(_wire(template, schema="ks.launch_batch/9")),
        ),
        ("empty object", "unknown_schema", key, b"{}"),
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
        (
            "problem size no GPU kernel runs",
            "unknown_kernel",
            key,
            js(_wire(template, problem_size=[1 << 40] * len(template.problem_size))),
        ),
        (
            "configuration outside the space",
            "bad_config",
            key,
            js(_wire(template, config={**config, first_param: 100_000})),
        ),
        (
            "unknown tunable parameter",
            "bad_config",
            key,
            js(_wire(template, config={**config, "block_size_x": 128})),
        ),
        (
            "host knob at a value no node declares (pinned 2, batch 3)",
            "bad_config",
            key,
            js(_wire(template, config={**config, **_HOST_KNOBS, "pinned": 2, "batch": 3})),
        ),
        (
            'host knob of the wrong type (streams "two")',
            "bad_config",
            key,
            js(_wire(template, config={**config, **_HOST_KNOBS, "streams": "two"})),
        ),
        ("end times out of order", "unordered", key, js(_wire(template, t_end=t_back))),
        ("far future", "bad_timestamp", key, js(_wire(template, t_end=[now + 86_400.0] * n))),
        ("far past", "bad_timestamp", key, js(_wire(template, t_end=[1_000_000.0] * n))),
        ("truncated message", "truncated", key, good[: len(good) // 2]),
        ("truncated column", "truncated", key, js(_wire(template, duration_us=[1.0] * (n - 1)))),
        ("non-UTF-8 key", "bad_key", b"\xff\xfenode", good),
        ("key of another stream", "bad_key", b"other:0/matmul", good),
        ("no key", "bad_key", None, good),
        ("not an object", "not_object", key, b"[1, 2, 3]"),
        ("JSON null", "not_object", key, b"null"),
        *_bad_transfers(template, key, n),
    ]


def _copies(t: float, **changes: Any) -> dict[str, Any]:
    cols: dict[str, Any] = {
        "t_end": [t],
        "direction": ["h2d"],
        "bytes": [1 << 20],
        "duration_us": [80.0],
        "pinned": [0],
        "stream": [0],
    }
    cols.update(changes)
    return cols


def _bad_transfers(template: LaunchBatch, key: bytes, n: int) -> list[BadInput]:
    """Bad copy and host-gap telemetry (version 2 fields)."""
    t = template.t_end[0]

    def js(obj: Any) -> bytes:
        return orjson.dumps(obj)

    return [
        (
            "negative copy bytes",
            "out_of_range",
            key,
            js(_wire(template, copies=_copies(t, bytes=[-4096]))),
        ),
        (
            "copy bytes beyond any memory",
            "out_of_range",
            key,
            js(_wire(template, copies=_copies(t, bytes=[1 << 50]))),
        ),
        (
            "negative copy duration",
            "out_of_range",
            key,
            js(_wire(template, copies=_copies(t, duration_us=[-1.0]))),
        ),
        (
            "copy of unknown direction",
            "wrong_type",
            key,
            js(_wire(template, copies=_copies(t, direction=["sideways"]))),
        ),
        # 1 GiB in 1 us is 1,074 TB/s: no link or memory moves data that fast.
        (
            "impossible copy bandwidth",
            "out_of_range",
            key,
            js(_wire(template, copies=_copies(t, bytes=[1 << 30], duration_us=[1.0]))),
        ),
        (
            "copy bytes in no time",
            "out_of_range",
            key,
            js(_wire(template, copies=_copies(t, duration_us=[0.0]))),
        ),
        (
            "copy columns differ",
            "truncated",
            key,
            js(_wire(template, copies=_copies(t, pinned=[0, 1]))),
        ),
        ("negative host gap", "out_of_range", key, js(_wire(template, host_gap_us=[-3.0] * n))),
        (
            "host gap column short",
            "truncated",
            key,
            js(_wire(template, host_gap_us=[3.0] * (n - 1))),
        ),
        (
            "copy pinned as booleans",
            "wrong_type",
            key,
            js(_wire(template, copies=_copies(t, pinned=[True]))),
        ),
        ("host waited not a flag", "wrong_type", key, js(_wire(template, host_waited=[2] * n))),
        (
            "transfer fields on version 1",
            "unknown_field",
            key,
            js(_wire(template, schema="ks.launch_batch/1", host_gap_us=[3.0] * n)),
        ),
        *_bad_samples(template, key),
    ]


def _bad_samples(template: LaunchBatch, key: bytes) -> list[BadInput]:
    """Device samples no GPU can report (they feed the device alerts)."""
    t = template.t_end[0]

    def sample(**changes: float) -> dict[str, float]:
        return {"t": t, "sm_clock_mhz": 1410.0, "mem_used_bytes": float(8 << 30), **changes}

    def js(*samples: dict[str, float]) -> bytes:
        return orjson.dumps(_wire(template, samples=list(samples)))

    return [
        (
            "negative memory used in a device sample",
            "out_of_range",
            key,
            js(sample(mem_used_bytes=-1.0)),
        ),
        (
            "device sample with an SM clock of 1e12 MHz",
            "out_of_range",
            key,
            js(sample(sm_clock_mhz=1e12)),
        ),
        (
            "device sample with more memory than any GPU (1e18 bytes)",
            "out_of_range",
            key,
            js(sample(mem_used_bytes=1e18)),
        ),
        (
            "device samples whose time goes backwards",
            "unordered",
            key,
            js(sample(), sample(t=t - 5.0)),
        ),
    ]


def sequence_inputs(template: LaunchBatch, now: float) -> list[BadInput]:
    """Batches of ``template``'s stream sent *after* it, refused by the window agent's
    sequence rules (agents/logic/sequencing.py); the decoders accept them."""
    key = template.stream_key.encode()
    n = len(template.t_end)
    last_t = max(template.t_end)
    after = [last_t + 0.001 * (i + 1) for i in range(n)]
    return [
        ("resent copy", "duplicate", key, encode(template)),
        (
            "sequence number past the bound (2**53)",
            "implausible_seq",
            key,
            orjson.dumps(_wire(template, seq_start=2**53, t_end=after)),
        ),
        (
            "sequence jump the stream's rate rules out",
            "implausible_seq",
            key,
            orjson.dumps(_wire(template, seq_start=template.seq_start + 10**9, t_end=after)),
        ),
    ]


#: Valid batches whose derived ratios overflow a double: every field is within its schema,
#: only the quotients a window and its finding compute are not (name -> changed fields).
OVERFLOWING: dict[str, dict[str, Any]] = {
    "a device peak of 1e-300 GB/s (ridge point, bandwidth fraction)": {
        "peak_gbs": 1e-300,
        "peak_gflops": 1e300,
    },
    "1e308 bytes per launch in 1e-4 us (achieved GB/s)": {
        "bytes_moved": 1e308,
        "duration_us": 1e-4,
    },
    "1e308 FLOPs over 1e-300 bytes (arithmetic intensity)": {
        "flops": 1e308,
        "bytes_moved": 1e-300,
    },
    "launches of 5e-324 us, the smallest double": {"duration_us": 5e-324},
}


def overflowing(batch: LaunchBatch, changes: dict[str, Any]) -> LaunchBatch:
    """``batch`` with an :data:`OVERFLOWING` entry's fields (a duration: every launch's)."""
    over = dict(changes)
    if "duration_us" in over:
        over["duration_us"] = [over["duration_us"]] * len(batch.t_end)
    return LaunchBatch.model_validate({**batch.to_wire(), **over})


#: What happens to input that is *not* refused, and why (docs/reliability/bad-input.md).
ACCEPTED = [
    (
        "a device sample reporting more memory in use than its GPU model has",
        "windowed (the launch schema does not know the model's memory); the alert stage "
        "dead-letters the findings of its windows as `out_of_range` and forecasts nothing "
        "from them.",
    ),
    (
        "a forged batch that is valid, correctly keyed, in the workload's space and "
        "numbered within the stream's rate bound",
        "windowed: indistinguishable from a node's own; its launches count in the windows of "
        "that stream. Limit who can write to the launches topic (Kafka ACLs).",
    ),
    (
        "a batch numbered at or below what was counted, but newer than every counted launch",
        "windowed: not a copy (a copy carries event times already passed); the stream's "
        "numbering was pushed up by a forgery or reset by the node.",
    ),
    (
        "a built-in workload's configuration with host knobs (pinned, streams, batch, "
        "sync_every) at declared values",
        "windowed: a node run under a host pattern declares them; the worker reads the "
        "same space off the configuration (docs/guide/transfers.md).",
    ),
    (
        "end times going back by up to max_event_disorder_s (1 s)",
        "windowed: two CUDA streams of one device finish out of order by milliseconds; "
        "launches behind the watermark go to the late topic.",
    ),
    (
        "valid numbers whose quotients overflow a double (a peak of 1e-300 GB/s, launches "
        "of 5e-324 us moving 1e308 bytes)",
        "windowed: a rate, fraction or ratio that would be infinite is the largest double "
        "(1.8e308) in the window and its finding (agents/logic/ratios.py).",
    ),
    (
        "node, kernel and configuration names at their 200-character limit",
        "windowed: the ids derived from them (a finding's, a recommendation's, an "
        "outcome's, an alert's) may be up to 1,024 characters.",
    ),
    (
        "launches timed at 0 us (below the timer's resolution)",
        "windowed; the tuner counts a mean below 1 ns as 1 ns, so the gains it states and "
        "the logarithms its model takes stay finite (agents/logic/tuning.py MIN_MEAN_US).",
    ),
    (
        "launches older than their window's close (allowed lateness passed)",
        "late topic (ks.late), with their sequence numbers: never windowed, never dropped.",
    ),
]


def markdown_table() -> str:
    """The catalogue as the Markdown table of docs/reliability/bad-input.md."""
    template = good_batch("node-a", "matmul", 1.0e9, 20, 0)
    rows = ["| # | Input | Outcome: dead letter with reason code |", "|---|---|---|"]
    cases = bad_inputs(template, 1.0e9) + sequence_inputs(template, 1.0e9)
    for i, (name, code, _, _) in enumerate(cases, 1):
        rows.append(f"| {i} | {name} | `{code}` |")
    rows += ["", "| Input | Outcome: accepted |", "|---|---|"]
    rows += [f"| {what} | {why} |" for what, why in ACCEPTED]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
