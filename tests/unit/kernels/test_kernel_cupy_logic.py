"""The cupy backend's own logic against a fake CuPy (no GPU here).

Checked: peaks and limits from device attributes, the driver's occupancy answer
in the plan (and the formula when the query is missing), compile caching with
``-D`` options, precompile failures, one event before and after every launch
with a single synchronisation per batch, and the runner anchoring event times
of a real device to the clock. None of this says the CuPy calls behave this way
on hardware: ``tests/gpu`` does, when a GPU session runs it.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kernelstream.kernels.backends.cupy as cupy_backend
from kernelstream.kernels import get_workload, open_device
from kernelstream.kernels.backends.cupy import CupyDevice, fp32_lanes_per_sm, spec_from_attributes
from kernelstream.kernels.runner import WorkloadRunner

H200_ATTRS = {
    "MultiProcessorCount": 132,
    "ClockRate": 1_980_000,  # kHz
    "MemoryClockRate": 3_201_000,  # kHz
    "GlobalMemoryBusWidth": 6144,
    "ComputeCapabilityMajor": 9,
    "ComputeCapabilityMinor": 0,
    "MaxThreadsPerMultiProcessor": 2048,
    "MaxBlocksPerMultiprocessor": 32,
    "MaxRegistersPerMultiprocessor": 65536,
    "MaxSharedMemoryPerMultiprocessor": 233_472,
    "MaxSharedMemoryPerBlockOptin": 232_448,
    "L2CacheSize": 52_428_800,
}


def test_spec_from_attributes_keeps_the_model_name_and_uses_measured_peaks() -> None:
    s = spec_from_attributes("NVIDIA H200", H200_ATTRS)
    assert s.name == "H200-SXM-141GB"  # same device_model as the sim and trace devices
    assert s.peak_gbs == pytest.approx(2 * 3_201_000e3 * 6144 / 8 / 1e9)  # ~4917 GB/s
    assert s.peak_gflops_fp32 == pytest.approx(132 * 128 * 2 * 1.98)  # ~66.9 TFLOP/s
    assert s.smem_per_sm_bytes == 233_472 and "datasheet" in s.source
    unknown = spec_from_attributes("NVIDIA Future GPU", {"MultiProcessorCount": 10})
    assert unknown.name == "NVIDIA Future GPU" and unknown.sms == 10
    assert unknown.peak_gbs > 0 and unknown.peak_gflops_fp32 > 0
    assert fp32_lanes_per_sm((7, 0)) == 64 and fp32_lanes_per_sm((8, 9)) == 128


def test_attributes_cupy_lacks_are_asked_of_the_runtime_by_number() -> None:
    """A CuPy whose ``Device.attributes`` omits the compute capability and the clocks
    still gives the device's own values (CuPy 14.2 gave none: the first GPU run planned
    its H100 as sm_80)."""
    numbers = {"ComputeCapabilityMajor": 75, "ComputeCapabilityMinor": 76, "ClockRate": 13}
    partial = {k: v for k, v in H200_ATTRS.items() if k not in numbers}
    asked: list[int] = []

    def get_attribute(number: int, index: int) -> int:
        asked.append(number)
        by_number = {n: H200_ATTRS[k] for k, n in numbers.items()}
        if number not in by_number:
            raise RuntimeError("cudaErrorInvalidValue")
        return by_number[number]

    fake = SimpleNamespace(
        cuda=SimpleNamespace(
            Device=lambda i: SimpleNamespace(attributes=partial, compute_capability="90"),
            runtime=SimpleNamespace(deviceGetAttribute=get_attribute),
        )
    )
    attrs = cupy_backend.device_attributes(fake, 0)  # type: ignore[arg-type]
    assert attrs == H200_ATTRS and sorted(asked) == [13, 75, 76]
    assert spec_from_attributes("NVIDIA H200", attrs).compute_capability == (9, 0)
    # no runtime answer at all: the compute capability comes from Device.compute_capability
    fake.cuda.runtime.deviceGetAttribute = None
    attrs = cupy_backend.device_attributes(fake, 0)  # type: ignore[arg-type]
    assert (attrs["ComputeCapabilityMajor"], attrs["ComputeCapabilityMinor"]) == (9, 0)
    assert "ClockRate" not in attrs


class _Log:
    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.modules = 0


class _Kernel:
    def __init__(self, log: _Log, options: tuple[str, ...]) -> None:
        self.log, self.options = log, options
        self.num_regs, self.shared_size_bytes = 40, 2048
        self.kernel = SimpleNamespace(ptr=0xBEEF)

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        self.log.entries.append(("kernel", grid, block))


class _Event:
    def __init__(self, log: _Log, n: int) -> None:
        self.log, self.n = log, n

    def record(self, stream: Any) -> None:
        self.log.entries.append(("record", self.n))

    def synchronize(self) -> None:
        self.log.entries.append(("sync", self.n))


class _Device:
    attributes = H200_ATTRS
    pci_bus_id = "0000:19:00.0"

    def __init__(self, index: int) -> None:
        self.index = index

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _fake_cupy(log: _Log, *, occupancy: bool = True, bad_option: str | None = None) -> Any:
    events = iter(range(10**6))

    def raw_module(code: str, options: tuple[str, ...]) -> Any:
        log.modules += 1
        if bad_option and bad_option in options:
            raise RuntimeError("NVRTCError: too much shared data")
        return SimpleNamespace(get_function=lambda name: _Kernel(log, options))

    def occupancy_query(ptr: int, threads: int, smem: int) -> int:
        assert ptr == 0xBEEF
        return 3

    driver = SimpleNamespace()
    if occupancy:
        driver.occupancyMaxActiveBlocksPerMultiprocessor = occupancy_query
    cuda = SimpleNamespace(
        Device=_Device,
        runtime=SimpleNamespace(getDeviceProperties=lambda i: {"name": b"NVIDIA H200"}),
        driver=driver,
        Event=lambda: _Event(log, next(events)),
        get_current_stream=lambda: "stream",
        get_elapsed_time=lambda a, b: 0.0125,  # ms
    )
    return SimpleNamespace(cuda=cuda, RawModule=raw_module, asarray=lambda x: x)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(**kw: Any) -> tuple[CupyDevice, _Log]:
        log = _Log()
        monkeypatch.setattr(cupy_backend, "import_cupy", lambda: _fake_cupy(log, **kw))
        return CupyDevice(problem_scale=0.01, nvml_interval_s=None), log

    return make


def test_one_synchronisation_per_batch_and_an_event_pair_per_launch(fake: Any) -> None:
    dev, log = fake()
    w = next(x for x in dev.workloads() if x.name == "transpose")
    r = dev.launch(w, w.default, 5)
    assert r.ok.all() and r.duration_us.tolist() == [12.5] * 5
    kinds = [e[0] for e in log.entries]
    assert kinds.count("sync") == 1 and kinds[-1] == "sync"
    assert kinds[:-1] == ["record", "kernel", "record"] * 5
    log.entries.clear()
    dev.launch(w, w.default, 3)  # events are pooled and reused; the module is compiled once
    assert log.modules == 1 and [e[0] for e in log.entries].count("sync") == 1
    assert dev.sample() is None  # no sampler thread asked for
    dev.close()


def test_plan_uses_the_driver_occupancy_and_compiled_resources(fake: Any) -> None:
    dev, _ = fake()
    w = next(x for x in dev.workloads() if x.name == "matmul")
    plan = dev.plan(w, w.default)  # 8 x 8 threads = 2 warps; the driver says 3 blocks/SM
    assert plan.resident_blocks_per_sm == 3 and plan.occupancy == pytest.approx(6 / 64)
    assert plan.registers_per_thread == 40 and dev.occupancy_source == "driver"
    assert plan.waves == pytest.approx(plan.blocks / (132 * 3))
    dev2, _ = fake(occupancy=False)
    w2 = next(x for x in dev2.workloads() if x.name == "matmul")
    plan2 = dev2.plan(w2, w2.default)
    assert dev2.occupancy_source == "formula" and plan2.resident_blocks_per_sm > 3


def test_compile_failures_are_remembered(fake: Any) -> None:
    w = get_workload("transpose", (256, 256))
    configs = list(w.space)[:6]
    bad = configs[2]
    dev, log = fake(bad_option=f"-DTILE_DIM={bad['tile_dim']}")
    errors = dev.precompile(w, configs, workers=3)
    bad_ids = {w.space.config_id(c) for c in configs if c["tile_dim"] == bad["tile_dim"]}
    assert set(errors) == bad_ids and all("NVRTCError" in e for e in errors.values())
    assert not dev.launch(w, bad, 2).ok.any()
    assert "NVRTCError" in (dev.failure_reason(w, bad) or "")
    modules = log.modules
    dev.precompile(w, configs, workers=3)  # compiled ones are not compiled again
    assert log.modules == modules + len(bad_ids)


def test_runner_anchors_a_real_devices_event_times_to_the_clock() -> None:
    sim = open_device("sim", problem_scale=0.01)
    sim.realtime = True  # type: ignore[attr-defined]
    w = sim.workloads()[0]
    runner = WorkloadRunner(sim, [w])
    start = time.time() - 30.0
    runner.tick(start)
    (chunk,) = runner.tick(start + 0.05)
    assert chunk.t_end[-1] >= start + 29.0  # shifted to when the launches really ended
    assert (chunk.t_end[1:] >= chunk.t_end[:-1]).all()


def test_a_user_kernels_plan_reads_its_loaded_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for a built-in workload: once a user kernel's configuration is compiled on the GPU,
    its plan takes the module's registers and shared memory and the driver's occupancy."""
    from kernelstream.kernels.backends.user import CupyKernelDevice
    from kernelstream.kernels.tunable import TunableKernel

    log = _Log()
    monkeypatch.setattr(cupy_backend, "import_cupy", lambda: _fake_cupy(log))
    dev = CupyKernelDevice(0)
    src = 'extern "C" __global__ void k(float *y, int n) { }'
    k = TunableKernel("k", src, 1 << 20, {"block_size_x": [64, 128]}, device=dev)
    plan = dev.plan(k.workload, k.config)  # 64 threads = 2 warps; the driver says 3 blocks/SM
    assert plan.resources_source == "cupy module" and plan.registers_per_thread == 40
    assert plan.resident_blocks_per_sm == 3 and plan.occupancy == pytest.approx(6 / 64)
    assert dev.plan(k.workload, k.config) is plan  # planned once per configuration
    other = dev.plan(k.workload, {"block_size_x": 128})  # not compiled on the GPU yet
    assert other.resources_source != "cupy module"


def test_host_gaps_are_timed_on_the_host_clock_without_another_synchronisation(fake: Any) -> None:
    dev, log = fake()
    w = next(x for x in dev.workloads() if x.name == "transpose")
    first = dev.launch(w, w.default, 4)
    second = dev.launch(w, w.default, 3)
    assert [e[0] for e in log.entries].count("sync") == 2  # still one per batch
    assert first.host_gap_us is not None and first.host_waited is not None
    assert second.host_gap_us is not None and second.host_waited is not None
    assert len(first.host_gap_us) == 4 and len(second.host_gap_us) == 3
    assert (first.host_gap_us >= 0).all() and (second.host_gap_us >= 0).all()
    # the stream's first launch follows nothing; a batch's first follows a synchronisation
    assert first.host_gap_us[0] == 0.0 and first.host_waited.tolist() == [False] * 4
    assert second.host_waited.tolist() == [True, False, False]
    dev.close()


class _GpuClock:
    """A stand-in GPU for a user kernel's events: each event gets the next sequence
    number when recorded, and is done once ``lag`` later events were recorded."""

    def __init__(self, lag: int) -> None:
        self.recorded, self.lag, self.created = 0, lag, 0
        self.guard = threading.Lock()

    def event(self) -> Any:
        self.created += 1
        gpu = self

        class Event:
            seq = -1

            def record(self, stream: Any = None) -> None:
                with gpu.guard:
                    gpu.recorded += 1
                    self.seq = gpu.recorded

            @property
            def done(self) -> bool:
                return self.seq <= gpu.recorded - gpu.lag

        return Event()


def _user_device(monkeypatch: pytest.MonkeyPatch, gpu: _GpuClock, reads: list[str]) -> Any:
    from kernelstream.kernels.backends.user import CupyKernelDevice

    fake = _fake_cupy(_Log())
    fake.cuda.Event = gpu.event

    def elapsed(start: Any, end: Any) -> float:
        reads.append(threading.current_thread().name)
        assert end.seq == start.seq + 1, "a launch's own two events"
        return start.seq / 1000.0  # ms: each launch its own duration, seq us

    fake.cuda.get_elapsed_time = elapsed
    monkeypatch.setattr(cupy_backend, "import_cupy", lambda: fake)
    return CupyKernelDevice(0)


def test_a_user_kernels_calls_read_back_finished_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's thread reads the events of finished launches as it launches; the
    node's thread reads only what is left, and each pair of events goes back to the pool
    once (the node reading every launch made the two threads trade the GIL per call)."""
    from kernelstream.kernels.tunable import KernelRunner, TunableKernel

    gpu, reads = _GpuClock(lag=6), list[str]()  # a launch is done 3 launches (6 events) later
    dev = _user_device(monkeypatch, gpu, reads)
    src = 'extern "C" __global__ void k(float *y, int n) { }'
    k = TunableKernel("k", src, 1 << 20, {"block_size_x": [64, 128]}, device=dev)
    runner = KernelRunner(dev)
    runner.add(k)
    for _ in range(10):
        k(None, 1)
    assert reads and set(reads) == {threading.current_thread().name}
    assert len(reads) == 7  # launches 1-7 are done by the 10th call
    (chunk,) = runner.tick(time.time())  # the node takes the 7 finished ones
    assert len(chunk.duration_us) == 7 and len(reads) == 7  # no event read again
    assert chunk.duration_us.tolist() == [float(2 * i + 1) for i in range(7)]
    gpu.lag = 0  # the GPU catches up; the caller stopped calling
    (chunk,) = runner.tick(time.time())  # the node reads what the caller left
    assert chunk.duration_us.tolist() == [15.0, 17.0, 19.0] and len(reads) == 10
    pool = dev._events
    assert len(pool) == gpu.created < 20  # pairs were reused; every one is back
    assert len({id(e) for e in pool}) == len(pool)  # and back once
    created = gpu.created
    k(None, 1)
    assert gpu.created == created  # the next call reuses pooled events


def test_caller_and_node_threads_read_each_launch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelstream.kernels.tunable import KernelRunner, TunableKernel

    gpu, reads = _GpuClock(lag=40), list[str]()
    dev = _user_device(monkeypatch, gpu, reads)
    src = 'extern "C" __global__ void k(float *y, int n) { }'
    k = TunableKernel("k", src, 1 << 20, {"block_size_x": [64, 128]}, device=dev)
    runner = KernelRunner(dev)
    runner.add(k)
    got: list[np.ndarray] = []
    stop = threading.Event()

    def node() -> None:
        while not stop.is_set():
            got.extend(c.duration_us for c in runner.tick(time.time()))
            time.sleep(0.001)

    thread = threading.Thread(target=node, name="node")
    thread.start()
    calls = 20_000
    for _ in range(calls):
        k(None, 1)
    gpu.lag = 0
    time.sleep(0.02)
    stop.set()
    thread.join()
    got.extend(c.duration_us for c in runner.tick(time.time()))
    durations = np.concatenate(got)
    assert len(durations) == calls == len(reads)  # each launch read once, by one thread
    assert np.allclose(durations, 2 * np.arange(calls) + 1)  # in order, each its own pair
    assert len({id(e) for e in dev._events}) == len(dev._events)  # no event pooled twice
    assert gpu.created < calls  # events are reused (a pair per call without the pool)
