"""``kernelstream bench telemetry-overhead``: kernel throughput with telemetry on vs off.

On a real GPU (cupy backend), for a short kernel (~10 µs) and a long one (>= 50
µs), both the ``reduction`` workload sized to those durations, alternating in one
run:

* **off**: the compiled kernel launched ``--batch`` times back to back on the
  stream, one synchronisation at the end; nothing recorded.
* **on**: what a node does: :meth:`CupyDevice.launch` (a CUDA event before and
  after every launch, one synchronisation per batch, elapsed times read back),
  the launches batched with the plan (occupancy from the driver, waves, bytes,
  FLOPs) and encoded in the node's wire format (binary), while the NVML sampler
  thread reads the device every 0.5 s.

Throughput is launches per wall-clock second over each batch; the report gives
the median over ``--rounds`` rounds of each mode and the overhead
``1 - on / off``. Without CuPy the command exits with the install hint.
"""

from __future__ import annotations

import datetime as dt
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from kernelstream.bench.results import write_dated

__all__ = ["command", "pick_size", "run_benchmark", "summarize"]

_WORKLOAD = "reduction"
_TARGETS_US = {"short": 10.0, "long": 100.0}
_MIN_N = 1 << 16
_MAX_N = 1 << 30


def summarize(off_rates: list[float], on_rates: list[float]) -> dict[str, float]:
    """Medians of launches/s per mode and the overhead of telemetry (a fraction).

    >>> summarize([100.0, 102.0, 98.0], [99.0, 100.0, 97.0])["overhead"]
    0.01
    """
    off, on = statistics.median(off_rates), statistics.median(on_rates)
    return {
        "off_launches_per_s": off,
        "on_launches_per_s": on,
        "ratio_on_off": on / off if off > 0 else math.nan,
        "overhead": round(1.0 - on / off, 6) if off > 0 else math.nan,
    }


def pick_size(
    measure_us: Callable[[int], float], target_us: float, *, start: int = 1 << 22, rounds: int = 4
) -> tuple[int, float]:
    """Element count whose kernel takes about ``target_us``: rescale linearly a few times.

    ``measure_us(n)`` times one launch of ``n`` elements. Sizes are multiples of
    65536 (every vector width and block count divides them).

    >>> pick_size(lambda n: n / 1e6, 10.0)
    (10027008, 10.027008)
    """
    n, t = start, measure_us(start)
    for _ in range(rounds):
        if abs(t - target_us) <= 0.1 * target_us:
            break
        scale = target_us / t if t > 0 else 2.0
        n = int(min(_MAX_N, max(_MIN_N, round(n * scale / 65536) * 65536)))
        t = measure_us(n)
    return n, t


def _good_config(workload: Any, spec_name: str) -> dict[str, Any]:
    """The sim model's fastest configuration of ``workload`` (its default if no model)."""
    from kernelstream.kernels.backends.sim import SimDevice
    from kernelstream.kernels.errors import UnknownDeviceError

    try:
        sim = SimDevice(spec_name)
    except UnknownDeviceError:
        return dict(workload.default)
    best, best_us = dict(workload.default), math.inf
    for config in workload.space:
        us = sim.predict_us(workload, config)
        if us is not None and us < best_us:
            best, best_us = dict(config), us
    return best


class _Kernel:
    """One sized workload and configuration on the device, with both launch loops."""

    def __init__(self, device: Any, n: int) -> None:
        from kernelstream.kernels import get_workload

        self.device = device
        self.workload = get_workload(_WORKLOAD, (n,))
        self.config = _good_config(self.workload, device.spec.name)
        self.fn = device.compile(self.workload, self.config)
        self.geo = self.workload.geometry(self.config)
        self.args = self.workload.kernel_args(device.arrays(self.workload))
        self.cp = device.cupy

    def run_off(self, n: int) -> float:
        """Plain launches, one sync; returns wall seconds."""
        stream = self.cp.cuda.get_current_stream()
        t0 = time.perf_counter()
        for _ in range(n):
            self.fn(
                self.geo.grid, self.geo.block, self.args, shared_mem=self.geo.dynamic_smem_bytes
            )
        stream.synchronize()
        return time.perf_counter() - t0

    def run_on(self, n: int, batcher: Any) -> tuple[float, np.ndarray]:
        """Launches with the node's telemetry; returns wall seconds and the durations."""
        from kernelstream.kernels.runner import LaunchChunk

        t0 = time.perf_counter()
        r = self.device.launch(self.workload, self.config, n)
        now = time.time()
        t_end = now - float(r.duration_us.sum()) / 1e6 + np.cumsum(r.duration_us) / 1e6
        cid = self.workload.space.config_id(self.config)
        chunk = LaunchChunk(
            _WORKLOAD, self.workload, dict(self.config), cid, 0, t_end, r.duration_us, r.ok
        )
        for batch in batcher.add(chunk, now) + batcher.flush():
            batch.wire()
        return time.perf_counter() - t0, r.duration_us

    def mean_us(self, n: int = 50) -> float:
        self.run_off(5)
        return self.run_off(n) / n * 1e6


def _measure(device: Any, label: str, target_us: float, batch: int, rounds: int) -> dict[str, Any]:
    from kernelstream.kernels.backends.nvml import NvmlSampler
    from kernelstream.kernels.runner import LaunchBatcher

    n, probe_us = pick_size(lambda k: _Kernel(device, k).mean_us(), target_us)
    k = _Kernel(device, n)
    k.run_off(batch)  # warm-up, both paths
    batcher = LaunchBatcher(device, "bench", max_launches=batch)
    k.run_on(batch, batcher)
    off_rates: list[float] = []
    on_rates: list[float] = []
    durations: list[float] = []
    samples = 0
    for _ in range(rounds):
        off_rates.append(batch / k.run_off(batch))
        sampler = NvmlSampler(device.device_index, interval_s=0.5)
        sampler.start()
        try:
            seconds, dur = k.run_on(batch, batcher)
        finally:
            samples += sampler.samples
            sampler.stop()
        on_rates.append(batch / seconds)
        durations.extend(dur.tolist())
    plan = device.plan(k.workload, k.config)
    return {
        "kernel": label,
        "workload": _WORKLOAD,
        "problem_size": [n],
        "config": k.config,
        "target_us": target_us,
        "probe_mean_us": probe_us,
        "event_duration_us_median": statistics.median(durations),
        "launches_per_batch": batch,
        "rounds": rounds,
        "occupancy": plan.occupancy,
        "occupancy_source": getattr(device, "occupancy_source", "formula"),
        "nvml_samples_during_on_rounds": samples,
        "off_rates": off_rates,
        "on_rates": on_rates,
        **summarize(off_rates, on_rates),
    }


def run_benchmark(device_index: int, batch: int, rounds: int) -> dict[str, Any]:
    from kernelstream.kernels.backends.cupy import CupyDevice

    device = CupyDevice(device_index=device_index, nvml_interval_s=None)
    try:
        kernels = [
            _measure(
                device, label, target, batch if label == "short" else max(50, batch // 5), rounds
            )
            for label, target in _TARGETS_US.items()
        ]
        return {
            "benchmark": "telemetry-overhead",
            "date": dt.date.today().isoformat(),
            "device_name": device.device_name,
            "device_model": device.spec.name,
            "peak_gbs_from_attributes": device.spec.peak_gbs,
            "peak_gflops_fp32_from_attributes": device.spec.peak_gflops_fp32,
            "host": platform.node(),
            "kernels": kernels,
        }
    finally:
        device.close()


def _text(report: dict[str, Any]) -> str:
    lines = [f"telemetry overhead on {report['device_name']} ({report['date']})"]
    for k in report["kernels"]:
        lines.append(
            f"  {k['kernel']:5} {k['workload']} n={k['problem_size'][0]:>11,} "
            f"~{k['event_duration_us_median']:.1f} us/launch: "
            f"off {k['off_launches_per_s']:,.0f}/s, on {k['on_launches_per_s']:,.0f}/s, "
            f"on/off {k['ratio_on_off']:.4f}, "
            f"overhead {k['overhead']:.2%}"
        )
    return "\n".join(lines)


@click.command("telemetry-overhead")
@click.option("--device-index", type=int, default=0, show_default=True)
@click.option(
    "--batch", type=int, default=2000, show_default=True, help="Launches per round (short)."
)
@click.option("--rounds", type=int, default=9, show_default=True, help="Rounds of each mode.")
@click.option(
    "--results-dir",
    type=click.Path(path_type=Path),
    default=Path("bench/results"),
    show_default=True,
    help="Where telemetry-overhead-<date>.{json,txt} go.",
)
def command(device_index: int, batch: int, rounds: int, results_dir: Path) -> None:
    """Kernel throughput with telemetry on vs off, short and long kernels (needs a GPU)."""
    from kernelstream.kernels.errors import BackendUnavailableError

    try:
        report = run_benchmark(device_index, batch, rounds)
    except BackendUnavailableError as exc:
        raise click.ClickException(f"this benchmark runs on a GPU: {exc}") from exc
    text = _text(report)
    stem = write_dated(results_dir, "telemetry-overhead", report["date"], report, text)
    click.echo(text)
    click.echo(f"wrote {stem}.json and {stem}.txt")
