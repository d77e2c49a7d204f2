"""``kernelstream bench wire-formats``: launch-batch wire formats side by side, in one process.

On the pipeline benchmark's fleet batches, at 2,000 and at ~186 launches per batch, it
times per launch (best of ``--rounds``): a node encoding its :class:`LaunchBatch` records,
and the worker's edge turning the bytes into validated NumPy columns, for

* ``json``: :func:`schemas.encode` / :func:`schemas.columnar.decode_launch_columns`;
* ``binary``: :func:`schemas.binary.encode_launch_batch` / the same decoder;
* ``arrow``: an Arrow IPC stream (``pyarrow``, when installed) of the same columns with
  the per-batch JSON as schema metadata / reading it back to NumPy without a copy (no
  validation: a lower bound of what the worker would pay);

and the bytes per launch, raw and zstd-compressed (one message at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import click
from aiokafka import codec

from kernelstream.bench.pipeline_input import FleetSpec, fleet_batches, recent_t0
from kernelstream.schemas import LaunchBatch, encode
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.columnar import decode_launch_columns

__all__ = ["command", "measure"]

_CASES = {
    "2000": FleetSpec(seconds=2.0),
    "186": FleetSpec(nodes=128, launches_per_s_per_kernel=1000.0, seconds=2.0),
}


def _arrow() -> tuple[Callable[[LaunchBatch], bytes], Callable[[bytes], Any]] | None:
    try:
        import pyarrow as pa
    except ImportError:
        return None
    import orjson

    def enc(b: LaunchBatch) -> bytes:
        meta = b.model_dump(by_alias=True, exclude={"t_end", "duration_us", "ok"})
        batch = pa.record_batch(
            [
                pa.array(b.t_end, pa.float64()),
                pa.array(b.duration_us, pa.float64()),
                pa.array(b.ok, pa.uint8()),
            ],
            names=["t_end", "duration_us", "ok"],
        ).replace_schema_metadata({"batch": orjson.dumps(meta)})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return bytes(sink.getvalue())

    def dec(data: bytes) -> Any:
        rb = pa.ipc.open_stream(data).read_next_batch()
        return [c.to_numpy(zero_copy_only=True) for c in rb.columns], rb.schema.metadata

    return enc, dec


def _map(fn: Callable[[Any], object], items: list[Any]) -> None:
    for x in items:
        fn(x)


def _best(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(rounds: int = 5) -> dict[str, dict[str, dict[str, float]]]:
    """ns per launch to encode and decode, bytes per launch, per format and batch size."""
    formats: dict[str, tuple[Callable[[LaunchBatch], bytes], Callable[[bytes], Any]]] = {
        "json": (encode, decode_launch_columns),
        "binary": (encode_launch_batch, decode_launch_columns),
    }
    arrow = _arrow()
    if arrow is not None:
        formats["arrow"] = arrow
    out: dict[str, dict[str, dict[str, float]]] = {}
    for case, spec in _CASES.items():
        spec = FleetSpec(**(spec.__dict__ | {"t0": recent_t0(spec.seconds)}))
        batches = list(fleet_batches(spec))
        n = sum(len(b.t_end) for b in batches)
        out[case] = {}
        for name, (enc, dec) in formats.items():
            values = [enc(b) for b in batches]
            out[case][name] = {
                "encode_ns": _best(partial(_map, enc, batches), rounds) / n * 1e9,
                "decode_ns": _best(partial(_map, dec, values), rounds) / n * 1e9,
                "bytes": sum(map(len, values)) / n,
                "zstd_bytes": sum(len(codec.zstd_encode(v)) for v in values) / n,
                "launches_per_batch": n / len(batches),
            }
    return out


@click.command("wire-formats")
@click.option("--rounds", type=int, default=5, show_default=True)
def command(rounds: int) -> None:
    """Encode/decode ns per launch and bytes per launch: JSON, binary, Arrow IPC."""
    import os

    click.echo(f"load average {os.getloadavg()[0]:.1f}")
    for rows in measure(rounds).values():
        click.echo(f"batches of ~{next(iter(rows.values()))['launches_per_batch']:.0f} launches")
        for name, r in rows.items():
            click.echo(
                f"  {name:<7} encode {r['encode_ns']:6.0f} ns  decode {r['decode_ns']:6.0f} ns  "
                f"{r['bytes']:5.1f} B ({r['zstd_bytes']:4.1f} zstd) per launch"
            )
