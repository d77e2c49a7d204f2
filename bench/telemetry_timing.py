"""``kernelstream bench telemetry-timing``: where the telemetry's per-launch cost goes.

``bench telemetry-overhead`` gives the throughput lost to telemetry; this benchmark takes
the node's launch path apart on the same two ``reduction`` kernels (about 10 and 100 us),
in one run, so the cost of each part is measured side by side:

* host time per launch of: the plain launch; the launch between two CUDA event records
  (what :meth:`CupyDevice.launch` does); the two event records alone; the launch with its
  arguments packed once (``cuLaunchKernel``), alone and between an event pair; reading one
  elapsed time back; the whole :meth:`CupyDevice.launch`; the :class:`LaunchBatcher`; the
  JSON and the binary encoding of the batch. "Host" is the loop's own time, "wall" runs to the
  stream's synchronisation, so a kernel longer than its launch shows as wall > host;
* with `cupti-python <https://pypi.org/project/cupti-python/>`_ installed (it matches the
  CUDA driver's major version), the alternative to event pairs that profilers use: CUPTI's
  activity API timing every kernel on the GPU. Printed: the launch loop's wall time per
  launch with kernel activity on, the cost per record of handing the records to Python
  (``activity_flush_all``), and the median kernel duration by both methods, which shows how
  much an event pair adds to a short kernel's measured time.

Needs a GPU (the ``cupy`` backend); writes ``telemetry-timing-<date>.{json,txt}``.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from kernelstream.bench.results import write_dated
from kernelstream.bench.telemetry_overhead import _TARGETS_US, _Kernel, pick_size

__all__ = ["command", "run_benchmark"]

_ROUNDS = 5


def _per_launch(stream: Any, loop: Callable[[], None], n: int) -> tuple[float, float]:
    """Host and wall microseconds per launch of ``loop`` (``n`` launches), median of rounds."""
    rows = []
    for _ in range(_ROUNDS):
        stream.synchronize()
        t0 = time.perf_counter()
        loop()
        t1 = time.perf_counter()
        stream.synchronize()
        t2 = time.perf_counter()
        rows.append(((t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6))
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def _parts(device: Any, k: _Kernel, n: int) -> dict[str, dict[str, float]]:
    """The launch path's parts, each timed over ``n`` launches."""
    from kernelstream.kernels.runner import LaunchBatcher, LaunchChunk

    cp, geo, fn, args = k.cp, k.geo, k.fn, k.args
    stream = cp.cuda.get_current_stream()
    events = [cp.cuda.Event() for _ in range(2 * n)]

    def launch() -> None:
        fn(geo.grid, geo.block, args, shared_mem=geo.dynamic_smem_bytes)

    def plain() -> None:
        for _ in range(n):
            launch()

    def paired() -> None:
        for i in range(n):
            events[2 * i].record(stream)
            launch()
            events[2 * i + 1].record(stream)

    def records_only() -> None:
        for i in range(n):
            events[2 * i].record(stream)
            events[2 * i + 1].record(stream)

    packed = _packed_launch(k)

    def plain_packed() -> None:
        for _ in range(n):
            packed()

    def paired_packed() -> None:
        for i in range(n):
            events[2 * i].record(stream)
            packed()
            events[2 * i + 1].record(stream)

    out: dict[str, dict[str, float]] = {}
    for name, loop in (
        ("launch", plain),
        ("launch between an event pair", paired),
        ("event pair alone", records_only),
        ("packed launch", plain_packed),
        ("packed launch, event pair", paired_packed),
    ):
        loop()  # warm
        host, wall = _per_launch(stream, loop, n)
        out[name] = {"host_us": host, "wall_us": wall}
    paired()
    stream.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        cp.cuda.get_elapsed_time(events[2 * i], events[2 * i + 1])
    out["elapsed time read"] = {"host_us": (time.perf_counter() - t0) / n * 1e6}

    batcher = LaunchBatcher(device, "bench", max_launches=n)
    device.launch(k.workload, k.config, n)
    rows = []
    for _ in range(_ROUNDS):
        stream.synchronize()
        t0 = time.perf_counter()
        r = device.launch(k.workload, k.config, n)
        t1 = time.perf_counter()
        now = time.time()
        t_end = now - float(r.duration_us.sum()) / 1e6 + np.cumsum(r.duration_us) / 1e6
        cid = k.workload.space.config_id(k.config)
        chunk = LaunchChunk(
            k.workload.name, k.workload, dict(k.config), cid, 0, t_end, r.duration_us, r.ok
        )
        batches = batcher.add(chunk, now) + batcher.flush()
        t2 = time.perf_counter()
        for b in batches:
            b.wire(binary=False)
        t3 = time.perf_counter()
        for b in batches:
            b.wire(binary=True)
        t4 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    # CupyDevice.launch returns after its one synchronisation: its time is wall time
    out["CupyDevice.launch"] = {"wall_us": statistics.median(r[0] for r in rows) / n * 1e6}
    for i, name in enumerate(("batcher", "encode JSON", "encode binary"), start=1):
        out[name] = {"host_us": statistics.median(r[i] for r in rows) / n * 1e6}
    return out


def _packed_launch(k: _Kernel) -> Callable[[], None]:
    """The kernel launched through ``cuLaunchKernel`` with its arguments packed once (a
    ctypes array of pointers to them), skipping CuPy's per-call argument handling."""
    from cupy.cuda import driver

    holders: list[Any] = []
    scalars = {"int64": ctypes.c_int64, "int32": ctypes.c_int32, "float32": ctypes.c_float}
    for arg in k.args:
        if hasattr(arg, "data") and hasattr(arg.data, "ptr"):
            holders.append(ctypes.c_void_p(arg.data.ptr))
        else:
            holders.append(scalars[np.asarray(arg).dtype.name](np.asarray(arg).item()))
    params = (ctypes.c_void_p * len(holders))(
        *[ctypes.cast(ctypes.pointer(h), ctypes.c_void_p) for h in holders]
    )
    function = getattr(k.fn, "kernel", k.fn).ptr
    grid = (*k.geo.grid, 1, 1)[:3]
    block = (*k.geo.block, 1, 1)[:3]
    stream = k.cp.cuda.get_current_stream().ptr
    smem, address = k.geo.dynamic_smem_bytes, ctypes.addressof(params)

    # The default argument keeps the packed arguments alive as long as the launcher.
    def launch(_packed: tuple[Any, ...] = (holders, params)) -> None:
        driver.launchKernel(function, *grid, *block, smem, stream, address, 0)

    return launch


def _cupti(k: _Kernel, n: int) -> dict[str, Any] | None:
    """CUPTI kernel activity beside event pairs, or None without ``cupti-python``."""
    try:
        from cupti import cupti
    except ImportError:
        return None
    cp, geo, fn, args = k.cp, k.geo, k.fn, k.args
    stream = cp.cuda.get_current_stream()
    spans: list[tuple[int, int]] = []
    kernel_kind = cupti.ActivityKind.CONCURRENT_KERNEL

    def completed(activities: list[Any]) -> None:
        spans.extend((a.start, a.end) for a in activities if a.kind == kernel_kind)

    cupti.activity_register_callbacks(lambda: (8 * 1024 * 1024, 0), completed)
    cupti.activity_enable(kernel_kind)
    try:
        rows = []
        for _ in range(_ROUNDS + 1):
            spans.clear()
            stream.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                fn(geo.grid, geo.block, args, shared_mem=geo.dynamic_smem_bytes)
            stream.synchronize()
            t1 = time.perf_counter()
            cupti.activity_flush_all(1)
            t2 = time.perf_counter()
            durations = [(end - start) / 1000.0 for start, end in spans]
            rows.append(((t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6, len(spans), durations))
        rows = rows[1:]  # the first round warms CUPTI up
    finally:
        cupti.activity_disable(kernel_kind)
        cupti.activity_flush_all(1)
    return {
        "cupti_python": _version("cupti-python"),
        "launch_wall_us": statistics.median(r[0] for r in rows),
        "flush_per_record_us": statistics.median(r[1] for r in rows),
        "records_per_round": [r[2] for r in rows],
        "launches_per_round": n,
        "kernel_us_median": statistics.median(statistics.median(r[3]) for r in rows if r[3]),
    }


def _event_durations(device: Any, k: _Kernel, n: int) -> float:
    """Median kernel duration (us) as the node measures it (between an event pair), over
    the rounds; run before CUPTI is enabled in the process."""
    device.launch(k.workload, k.config, n)
    return statistics.median(
        float(np.median(device.launch(k.workload, k.config, n).duration_us)) for _ in range(_ROUNDS)
    )


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def run_benchmark(device_index: int, launches: int) -> dict[str, Any]:
    """Each part of the launch path, on a ~10 us and a ~100 us kernel."""
    from kernelstream.kernels.backends.cupy import CupyDevice

    device = CupyDevice(device_index=device_index, nvml_interval_s=None)
    try:
        kernels = []
        for label, target in _TARGETS_US.items():
            size, probe_us = pick_size(lambda m: _Kernel(device, m).mean_us(), target)
            k = _Kernel(device, size)
            parts = _parts(device, k, launches)
            event_us = _event_durations(device, k, launches)
            cupti = _cupti(k, launches)
            kernels.append(
                {
                    "kernel": label,
                    "problem_size": [size],
                    "config": k.config,
                    "probe_us": probe_us,
                    "event_kernel_us_median": event_us,
                    "parts": parts,
                    "cupti": cupti,
                }
            )
        return {
            "benchmark": "telemetry-timing",
            "date": dt.date.today().isoformat(),
            "device_name": device.device_name,
            "cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x") or _version("cupy"),
            "launches_per_round": launches,
            "rounds": _ROUNDS,
            "kernels": kernels,
        }
    finally:
        device.close()


def _text(report: dict[str, Any]) -> str:
    lines = [
        f"telemetry timing on {report['device_name']} ({report['date']}), "
        f"{report['launches_per_round']} launches a round, median of {report['rounds']} rounds"
    ]
    for k in report["kernels"]:
        lines.append(
            f"  {k['kernel']} reduction n={k['problem_size'][0]:,}: kernel "
            f"{k['event_kernel_us_median']:.2f} us between an event pair"
        )
        for name, t in k["parts"].items():
            times = [f"{w} {t[f'{w}_us']:7.2f}" for w in ("host", "wall") if f"{w}_us" in t]
            lines.append(f"    {name:30} {', '.join(times)} us/launch")
        c = k["cupti"]
        if c is None:
            lines.append("    CUPTI: cupti-python not installed")
        else:
            lines.append(
                f"    CUPTI kernel activity (cupti-python {c['cupti_python']}): launch wall "
                f"{c['launch_wall_us']:.2f} us/launch, handing records to Python "
                f"{c['flush_per_record_us']:.2f} us/record; kernel {c['kernel_us_median']:.2f} us"
            )
    return "\n".join(lines)


@click.command("telemetry-timing")
@click.option("--device-index", type=int, default=0, show_default=True)
@click.option("--launches", type=int, default=2000, show_default=True, help="Per round.")
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    show_default=True,
    help="Where telemetry-timing-<date>.{json,txt} go.",
)
def command(device_index: int, launches: int, results_dir: Path) -> None:
    """Each part of the per-launch telemetry cost, and CUPTI beside event pairs (GPU)."""
    from kernelstream.kernels.errors import BackendUnavailableError

    try:
        report = run_benchmark(device_index, launches)
    except BackendUnavailableError as exc:
        raise click.ClickException(f"this benchmark runs on a GPU: {exc}") from exc
    text = _text(report)
    stem = write_dated(results_dir, "telemetry-timing", report["date"], report, text)
    click.echo(text)
    click.echo(f"wrote {stem}.json and {stem}.txt")
