"""``kernelstream bench api-overhead``: host cost per call of a TunableKernel vs a bare call.

Per backend, alternating in one run, ``--rounds`` rounds of ``--calls`` calls each, timed
on the caller's thread (what the user's loop pays):

* **bare**: the launch with nothing of kernelstream around it. On ``cupy`` the compiled
  ``RawKernel`` called with its grid and block; on ``trace`` the trace device's own work
  for one launch (drawing the duration, advancing its clock), which stands in for the
  driver call a real device makes.
* **api**: the :class:`kernelstream.TunableKernel` call with no node: argument check and
  config lookup.
* **api+node**: the call with a node attached (its launch log recording; on ``cupy`` a
  CUDA event before and after the launch), while a thread drains the log every 50 ms as
  the node's does (its time per launch is reported apart; the caller pays for the GIL
  it holds, as with a real node).

The report gives the median ns per call of each mode and what the API adds to bare.
The trace device runs with ``pace=False`` (no waiting for the measured durations).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import orjson

from kernelstream.bench.results import dated_stem
from kernelstream.kernels.backends.trace import default_tuning_spaces_dir
from kernelstream.kernels.tunable import KernelRunner, TunableKernel

__all__ = ["command", "run_benchmark"]

_TICK_S = 0.05  # the node's tick (app/node/runtime.py)

_VADD = """
extern "C" __global__ void vadd(float *c, const float *a, const float *b, int n) {
    int i = blockIdx.x * block_size_x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def _time_ns(fn: Callable[[], None], calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


class _Drainer:
    """Drains the launch log every 50 ms on a thread of its own, as a node does (the
    caller pays the GIL it takes, as with a real node); counts its time per launch."""

    def __init__(self, drain: Callable[[], int]) -> None:
        self.drain, self.ns, self.launches = drain, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(_TICK_S):
            self._once()

    def _once(self) -> None:
        t0 = time.perf_counter_ns()
        n = self.drain()
        self.ns += time.perf_counter_ns() - t0
        self.launches += n

    def __enter__(self) -> _Drainer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._once()


def _rounds(modes: dict[str, Callable[[], None]], calls: int, rounds: int, drain: Any) -> dict:
    per: dict[str, list[float]] = {m: [] for m in modes}
    drain_ns: list[float] = []
    for _ in range(rounds):
        for mode, fn in modes.items():
            if mode != "api+node":
                per[mode].append(_time_ns(fn, calls))
                continue
            with _Drainer(drain) as d:
                per[mode].append(_time_ns(fn, calls))
            drain_ns.append(d.ns / max(1, d.launches))
    med = {m: statistics.median(v) for m, v in per.items()}
    return {
        "ns_per_call": med,
        "added_ns": {m: med[m] - med["bare"] for m in med if m != "bare"},
        "node_drain_ns_per_launch": statistics.median(drain_ns) if drain_ns else None,
        "rounds": per,
    }


_TRACE_FILE = "convolution_RTX_3090.json.gz"


def _trace_case(path: Path, calls: int, rounds: int) -> dict[str, Any]:
    import kernelstream

    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    src = "__global__ void convolution_kernel(float *o, float *i, float *f) {}"

    def make() -> TunableKernel:
        return TunableKernel(
            "convolution_kernel",
            src,
            tuple(doc["problem_size"]),
            doc["tune_params"],
            grid_div_x=["block_size_x", "tile_size_x"],
            grid_div_y=["block_size_y", "tile_size_y"],
            device=kernelstream.trace_device(path, pace=False),
        )

    free, attached = make(), make()
    runner = KernelRunner(attached.device)
    runner.add(attached)
    dev, state, args = free.device, free._state, (None, None, None)

    def drain() -> int:
        return sum(len(c.ok) for c in runner.tick(time.time()))

    modes = {
        "bare": lambda: dev.launch(state, args, False),
        "api": lambda: free(None, None, None),
        "api+node": lambda: attached(None, None, None),
    }
    return _rounds(modes, calls, rounds, drain)  # type: ignore[arg-type]


def _cupy_case(calls: int, rounds: int, device_index: int) -> dict[str, Any]:
    import numpy as np

    from kernelstream.kernels.backends.user import cupy_device

    dev = cupy_device(device_index)
    cp = dev._cp
    n = 1 << 20
    a, b, c = (cp.ones(n, dtype=cp.float32) for _ in range(3))
    params = {"block_size_x": [128, 256, 512]}

    def make(name: str) -> TunableKernel:
        return TunableKernel(name, _VADD.replace("vadd", name), n, params, device=dev)

    free, attached = make("vadd_free"), make("vadd_node")
    runner = KernelRunner(dev)
    runner.add(attached)
    fn, grid, block = free._state.function, free._state.grid, free._state.block
    args = (c, a, b, np.int32(n))

    def drain() -> int:
        # as the node's thread does: only what the GPU has finished, never a synchronise
        # (with one here the caller paid 28 us a call on an H100 instead of 21)
        return sum(len(ch.ok) for ch in runner.tick(time.time()))

    modes = {
        "bare": lambda: fn(grid, block, args),
        "api": lambda: free(*args),
        "api+node": lambda: attached(*args),
    }
    out = _rounds(modes, calls, rounds, drain)
    out["device"] = dev.spec.name
    return out


def run_benchmark(calls: int, rounds: int, device_index: int | None) -> dict[str, Any]:
    """Every case this machine can run (cupy only with CuPy and a GPU)."""
    result: dict[str, Any] = {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "load_average_1m": os.getloadavg()[0],  # the machine is shared: context for figures
        "calls": calls,
        "rounds": rounds,
        "cases": {},
    }
    trace = default_tuning_spaces_dir() / _TRACE_FILE
    if trace.is_file():
        result["cases"]["trace"] = _trace_case(trace, calls, rounds)
    else:  # a GPU machine may have no data folder: the cupy case still runs
        result["trace_skipped"] = (
            f"no {trace} (set KERNELSTREAM_TUNING_SPACES_DIR to the tuning-spaces folder)"
        )
    if device_index is not None:
        try:
            result["cases"]["cupy"] = _cupy_case(calls, rounds, device_index)
        except Exception as ex:  # no CuPy or no GPU here: say so, keep the trace figures
            result["cupy_skipped"] = f"{type(ex).__name__}: {ex}"
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"TunableKernel host cost per call ({result['calls']} calls x {result['rounds']} "
        f"rounds, medians; load average {result['load_average_1m']:.1f})",
        f"{'backend':8} {'bare ns':>10} {'api ns':>10} {'api+node ns':>12} "
        f"{'added ns':>10} {'node drain ns':>14}",
    ]
    for name, case in result["cases"].items():
        ns, added = case["ns_per_call"], case["added_ns"]
        lines.append(
            f"{name:8} {ns['bare']:10.0f} {ns['api']:10.0f} {ns['api+node']:12.0f} "
            f"{added['api+node']:10.0f} {case['node_drain_ns_per_launch'] or 0:14.0f}"
        )
    for name in ("trace", "cupy"):
        if f"{name}_skipped" in result:
            lines.append(f"{name}: not run ({result[f'{name}_skipped']})")
    lines.append("added = api+node - bare: the API's and the telemetry's cost on the caller")
    return "\n".join(lines)


@click.command("api-overhead")
@click.option("--calls", type=int, default=200_000, show_default=True)
@click.option("--rounds", type=int, default=7, show_default=True)
@click.option("--device-index", type=int, default=0, show_default=True)
@click.option("--no-cupy", is_flag=True, help="Only the trace case.")
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    show_default=True,
)
def command(calls: int, rounds: int, device_index: int, no_cupy: bool, results_dir: Path) -> None:
    """Host ns per call of a TunableKernel (with and without a node) vs a bare call."""
    result = run_benchmark(calls, rounds, None if no_cupy else device_index)
    if not result["cases"]:
        skipped = "; ".join(result.get(f"{n}_skipped", "--no-cupy") for n in ("trace", "cupy"))
        raise click.ClickException(f"no case could run here: {skipped}")
    text = render(result)
    click.echo(text)
    results_dir.mkdir(parents=True, exist_ok=True)
    stem = dated_stem(results_dir, "api-overhead", result["when"][:10])
    stem.with_suffix(".json").write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    stem.with_suffix(".txt").write_text(text + "\n", encoding="utf-8")
    click.echo(f"wrote {stem}.json")
