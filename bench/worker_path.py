"""``kernelstream bench worker-path``: the worker's per-launch CPU cost, without Kafka.

The pipeline benchmark's (c)/(a) compares two processes on a shared broker; this
one isolates the worker's own code on the same kind of input so a change to it
can be measured in seconds and profiled. In one process, on the pipeline
benchmark's fleet batches (zstd-compressed as nodes send them), it times:

* ``ceiling``: zstd decompression + ``orjson.loads`` of every message (what the
  pipeline benchmark's ceiling does per message, minus the broker);
* ``worker``: decompression, :func:`schemas.columnar.decode_launch_columns_many`
  (parse and validation, a poll of messages at a time), :meth:`Windower.add_columns`,
  :meth:`Windower.poll_key` (closing windows) and a checkpoint snapshot
  (:func:`agents.logic.snapshot_codec.pack`) about once a second of input, as the
  window agent does.

It prints ns per launch for both and their ratio; ``--profile`` adds the top of a
cProfile of the worker path.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
from typing import Any

import click
import orjson
from aiokafka import codec

from kernelstream.agents.logic.snapshot_codec import pack
from kernelstream.agents.logic.windowing import Windower, WindowSpec
from kernelstream.bench.pipeline_input import FleetSpec, encoded, fleet_batches, recent_t0
from kernelstream.schemas.binary import encode_launch_batch
from kernelstream.schemas.columnar import decode_launch_columns_many
from kernelstream.schemas.errors import SchemaError

__all__ = ["command", "measure"]

_POLL = 128  # messages per consumer poll (agents/window_agent.py)


def _worker_pass(messages: list[bytes], per_checkpoint: int) -> int:
    windower = Windower(WindowSpec(size_s=1.0, out_of_orderness_s=0.0, allowed_lateness_s=0.05))
    windows = 0
    for at in range(0, len(messages), _POLL):
        # decoded a poll at a time, as the window agent takes them from its consumer
        poll = [codec.zstd_decode(raw) for raw in messages[at : at + _POLL]]
        for i, cols in enumerate(decode_launch_columns_many(poll), start=at):
            if isinstance(cols, SchemaError):
                raise cols
            windower.add_columns(cols, time.time())
            windows += len(windower.poll_key(cols.meta.stream_key))
            if (i + 1) % per_checkpoint == 0:
                pack(windower.snapshot(arrays=True))
    return windows


def _ceiling_pass(messages: list[bytes]) -> int:
    return sum(len(orjson.loads(codec.zstd_decode(raw))["t_end"]) for raw in messages)


def measure(
    seconds: float = 4.0,
    batch: int = 2000,
    rounds: int = 3,
    *,
    nodes: int = 16,
    rate_per_kernel: float = 20_000.0,
    wire: str = "json",
) -> dict[str, Any]:
    """Best-of-``rounds`` ns per launch of the worker path and of the ceiling path.

    ``wire="binary"`` feeds the worker path the binary layout (:mod:`schemas.binary`);
    the ceiling stays zstd + ``orjson.loads`` of the same batches as JSON.
    """
    fleet = FleetSpec(
        nodes=nodes,
        launches_per_s_per_kernel=rate_per_kernel,
        seconds=seconds,
        max_launches=batch,
        t0=recent_t0(seconds),
    )
    batches = list(fleet_batches(fleet))
    json_messages = [codec.zstd_encode(value) for _, value in encoded(batches)]
    messages = (
        [codec.zstd_encode(encode_launch_batch(b)) for b in batches]
        if wire == "binary"
        else json_messages
    )
    launches = _ceiling_pass(json_messages)
    per_checkpoint = max(1, round(len(messages) / seconds))  # ~one per second of input
    worker, ceiling = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        windows = _worker_pass(messages, per_checkpoint)
        t1 = time.perf_counter()
        _ceiling_pass(json_messages)
        t2 = time.perf_counter()
        worker.append((t1 - t0) / launches * 1e9)
        ceiling.append((t2 - t1) / launches * 1e9)
    return {
        "launches": launches,
        "messages": len(messages),
        "windows": windows,
        "worker_ns_per_launch": min(worker),
        "ceiling_ns_per_launch": min(ceiling),
        "ratio": min(ceiling) / min(worker),
        "rounds": {"worker": worker, "ceiling": ceiling},
        "_messages": messages,
        "_per_checkpoint": per_checkpoint,
    }


@click.command("worker-path")
@click.option("--seconds", type=float, default=4.0, show_default=True, help="Fleet input.")
@click.option("--batch", type=int, default=2000, show_default=True, help="Launches per batch.")
@click.option("--rounds", type=int, default=3, show_default=True)
@click.option("--nodes", type=int, default=16, show_default=True)
@click.option("--rate-per-kernel", type=float, default=20_000.0, show_default=True)
@click.option("--wire", type=click.Choice(["json", "binary"]), default="json", show_default=True)
@click.option("--profile", is_flag=True, help="Also print the top of a cProfile of the path.")
def command(
    seconds: float,
    batch: int,
    rounds: int,
    nodes: int,
    rate_per_kernel: float,
    wire: str,
    profile: bool,
) -> None:
    """Worker CPU per launch (decode, window, checkpoint) vs zstd + orjson alone."""
    r = measure(seconds, batch, rounds, nodes=nodes, rate_per_kernel=rate_per_kernel, wire=wire)
    click.echo(
        f"{r['launches']:,} launches in {r['messages']:,} messages "
        f"({wire}) -> {r['windows']} windows\n"
        f"worker path   {r['worker_ns_per_launch']:6.0f} ns/launch "
        f"({1e3 / r['worker_ns_per_launch']:.2f}M launches/s on one core)\n"
        f"zstd + orjson {r['ceiling_ns_per_launch']:6.0f} ns/launch\n"
        f"ratio (ceiling / worker) = {r['ratio']:.2f}"
    )
    if profile:
        prof = cProfile.Profile()
        prof.runcall(_worker_pass, r["_messages"], r["_per_checkpoint"])
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        click.echo(out.getvalue())
