"""Devices that run a user's own kernel one call at a time: ``trace`` and ``cupy``, and
``compile``, which compiles each configuration for an architecture and runs none.

A built-in device runs ``n`` launches of a workload when the runner asks; a user kernel
is launched by the user's code, one call at a time, so these devices split the work:
:meth:`prepare` does everything a configuration needs before its first launch (compile it
through NVRTC, or find its measured durations), off the hot path, and returns a
:class:`ConfigState`; :meth:`launch` runs one call of a prepared state and returns a
record; :meth:`resolve` turns finished records into event times and durations later, on
the node's thread. The cupy device never synchronises the user's stream: each call reads
the CUDA events of up to two earlier launches the GPU has finished, and the node's thread
reads only those no call has read (when the caller stops calling).

The trace device keeps a device clock: each launch ends its measured duration after the
later of the previous launch's end and the call, as on a GPU's stream, and a call that
runs ``queue_s`` ahead of the wall clock waits (a full launch queue), so event times are
real and a trace kernel runs at the speed of the GPU it was measured on.

The compile device is for machines without a GPU (CI): a kernel made on it is compiled
with NVRTC from PyPI, configuration by configuration, exactly as a GPU node would compile
it, so its declaration and its compile errors can be checked anywhere.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kernelstream.kernels.backends.base import LaunchPlan, make_plan, well_formed
from kernelstream.kernels.backends.trace import TraceSpace, load_cache
from kernelstream.kernels.check import compile_workload, device_for_arch
from kernelstream.kernels.compile import check_arch
from kernelstream.kernels.devices import DeviceSpec, device_spec_for_name
from kernelstream.kernels.errors import KernelDefinitionError, UnknownDeviceError
from kernelstream.kernels.space import Config, ParamValue
from kernelstream.kernels.workloads.user import UserWorkload

__all__ = [
    "CompileKernelDevice",
    "ConfigState",
    "CupyKernelDevice",
    "KernelDevice",
    "LaunchRecord",
    "TraceKernelDevice",
    "compile_device",
    "cupy_device",
    "trace_device",
]

log = logging.getLogger("kernelstream.kernels.user")

_DRAW = 4096  # durations a trace state draws at a time (one RNG call per 4096 launches)
_now = time.time
# Finished launches a cupy kernel's call reads back besides its own launch: more than
# one, so the caller drains what it adds even when some launches are untimed.
_RETIRE_PER_CALL = 2


@dataclass(eq=False)
class ConfigState:
    """A configuration of one kernel, prepared for launching (or why it cannot run)."""

    config: Config
    config_id: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    failure: str | None = None
    function: Any = None  # cupy: the compiled function
    times_us: np.ndarray | None = None  # trace: the measured durations
    rng: np.random.Generator | None = None
    _drawn: list[float] = field(default_factory=list)

    def draw(self) -> float:
        """Draw the next :data:`_DRAW` durations; returns one of them."""
        assert self.rng is not None and self.times_us is not None
        self._drawn.extend(self.rng.choice(self.times_us, size=_DRAW).tolist())
        return self._drawn.pop()


# (config id, time, device payload): trace (end time, duration in us), cupy (host time
# of the call, (start event, end event)); a failed launch (host time, None). The config
# id, not the state: a tuple of a str and floats leaves the garbage collector's lists
# after its first collection, so the records waiting for the node cost no GC walks.
LaunchRecord = tuple[str, float, Any]


class KernelDevice(Protocol):
    """What :class:`kernels.tunable.TunableKernel` needs of a device."""

    backend: str
    spec: DeviceSpec
    device_index: int

    def bind(self, workload: UserWorkload) -> None: ...
    def prepare(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> ConfigState: ...
    def launch(self, state: ConfigState, args: tuple[Any, ...], timed: bool) -> LaunchRecord: ...
    def resolve(
        self, records: Sequence[LaunchRecord]
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]: ...
    def plan(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> LaunchPlan: ...
    def sample(self) -> dict[str, float] | None: ...


def _state(workload: UserWorkload, config: Mapping[str, ParamValue]) -> ConfigState:
    cfg = workload.space.check(config)
    geo = workload.geometry(cfg)
    return ConfigState(cfg, workload.space.config_id(cfg), geo.grid, geo.block)


class TraceKernelDevice:
    """A GPU replayed from a Kernel Tuner cache file of the user's kernel."""

    backend = "trace"
    realtime = False

    def __init__(
        self, path: str | Path, *, seed: int = 0, queue_s: float = 0.02, pace: bool = True
    ) -> None:
        self.path = Path(path)
        self.trace: TraceSpace = load_cache(self.path)
        try:
            self.spec = device_spec_for_name(self.trace.device_name)
        except UnknownDeviceError:
            self.spec = DeviceSpec.unknown(self.trace.device_name)
        self.device_index = 0
        self.seed, self.queue_s, self.pace = seed, queue_s, pace
        self._clock = 0.0
        self._times: dict[str, np.ndarray] = {}
        self._failed: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"trace_device({str(self.path)!r})"

    def bind(self, workload: UserWorkload) -> None:
        """Check the cache is for ``workload``; narrow its space to the configs measured."""
        t, where = self.trace, f"cache file {self.path.name}"
        if t.kernel_name != workload.name:
            raise KernelDefinitionError(
                f"{where} holds kernel {t.kernel_name!r}, not {workload.name!r}: give the "
                "cache file measured for this kernel"
            )
        ours, theirs = set(workload.space.names), set(t.space.names)
        if ours != theirs:
            raise KernelDefinitionError(
                f"{where} tunes {sorted(theirs)}; kernel {workload.name!r} declares "
                f"{sorted(ours)} (missing: {sorted(theirs - ours)}, extra: {sorted(ours - theirs)})"
            )
        if tuple(t.problem_size) != workload.problem_size:
            raise KernelDefinitionError(
                f"{where} was measured on problem size {t.problem_size}, kernel "
                f"{workload.name!r} declares {workload.problem_size}"
            )
        space = workload.space
        for config in t.space:  # every point the cache lists, failed ones included
            problems = space.violations(config)
            if problems and not problems[0].startswith("constraint"):
                continue  # a value the user does not declare (value problems come first)
            cid = space.config_id(config)
            times = t.times_us.get(t.space.config_id(config))
            if times is not None:
                self._times[cid] = times
            else:
                self._failed[cid] = t.failed.get(t.space.config_id(config), "not measured")
        allowed = frozenset(self._times) | frozenset(self._failed)
        narrowed = replace(space, allowed=allowed)
        default = workload.default
        if space.config_id(default) not in self._times and not workload.explicit_default:
            # No default was asked for: start from a measured one, as a trace space does.
            fine = [c for c in narrowed if space.config_id(c) in self._times]
            if not fine:
                raise KernelDefinitionError(
                    f"{where}: no configuration of kernel {workload.name!r} that the "
                    "restrictions allow was measured successfully"
                )
            default = min(fine, key=lambda c: sum(c[p] != default[p] for p in space.names))
        workload.restrict(narrowed, default)

    def prepare(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> ConfigState:
        st = _state(workload, config)
        times = self._times.get(st.config_id)
        if times is None:
            st.failure = self._failed.get(st.config_id, "not in the cache file")
            return st
        words = [self.seed, zlib.crc32(workload.name.encode()), zlib.crc32(st.config_id.encode())]
        st.times_us, st.rng = times, np.random.default_rng(np.random.SeedSequence(words))
        return st

    def launch(self, state: ConfigState, args: tuple[Any, ...], timed: bool) -> LaunchRecord:
        drawn = state._drawn
        d = drawn.pop() if drawn else state.draw()
        now = _now()
        end = (self._clock if self._clock > now else now) + d * 1e-6
        self._clock = end
        if self.pace and end - now > self.queue_s:
            time.sleep(end - now - self.queue_s)
        return (state.config_id, end, d)

    def resolve(
        self, records: Sequence[LaunchRecord]
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """(records done, end times, durations in us, ok) of the leading finished records."""
        n = len(records)
        t_end = np.fromiter((r[1] for r in records), dtype=np.float64, count=n)
        payload = [r[2] for r in records]
        if None not in payload:  # no failed launch: the common case, one pass in C
            return n, t_end, np.asarray(payload, dtype=np.float64), np.ones(n, dtype=bool)
        ok = np.fromiter((d is not None for d in payload), dtype=bool, count=n)
        dur = np.fromiter((d or 0.0 for d in payload), dtype=np.float64, count=n)
        return n, t_end, dur, ok

    def plan(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        return make_plan(self.spec, workload, well_formed(workload.space, config))

    def sample(self) -> dict[str, float] | None:
        return None


def trace_device(path: str | Path, *, seed: int = 0, pace: bool = True) -> TraceKernelDevice:
    """A device that draws each launch's duration from a Kernel Tuner cache file.

    The cache must be for the kernel it is given to (same name, parameters and problem
    size); the kernel's space becomes the configurations the file measured. With
    ``pace=False`` calls never wait (their event times may run ahead of the clock:
    benchmarks only).
    """
    return TraceKernelDevice(path, seed=seed, pace=pace)


class CupyKernelDevice:
    """A real GPU through CuPy: NVRTC compiles, CUDA events time each launch."""

    backend = "cupy"
    realtime = True

    def __init__(self, device_index: int = 0) -> None:
        from kernelstream.kernels.backends.cupy import CupyDevice

        self._gpu = CupyDevice(device_index=device_index, problem_scale=0.0625)
        self._cp = self._gpu.cupy
        self.spec = self._gpu.spec
        self.device_index = device_index
        self._events: list[Any] = []
        # Timed launches not read back yet, in launch order, each [start, end, us]. The
        # caller's thread reads the finished ones as it launches (_retire); the node's
        # thread reads only what the caller left (resolve). Reading an event is a CUDA call
        # that lets go of the GIL, so a node thread reading every launch's events made
        # the two threads hand the GIL to each other at every call: on an H100, 11 us a
        # launch on the node's thread against 1.1 on the caller's (docs/guide/own-kernels.md).
        self._pending: deque[list[Any]] = deque()
        self._reading = threading.Lock()  # one reader of the events at a time
        self._lock = threading.Lock()  # NVRTC compiles of one device, one at a time
        # (kernel code, config id) -> compiled function / plan: the plan reads the loaded
        # module's registers and shared memory, as the built-in cupy backend does.
        self._functions: dict[tuple[str, str], Any] = {}
        self._plans: dict[tuple[str, str], LaunchPlan] = {}

    def __repr__(self) -> str:
        return f"cupy_device({self.device_index})"

    def bind(self, workload: UserWorkload) -> None:
        return None  # every declared configuration is a candidate

    def prepare(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> ConfigState:
        st = _state(workload, config)
        options = ("-std=c++14", *(f"-D{k}={v}" for k, v in workload.defines(st.config).items()))
        try:
            with self._lock, self._gpu._device:
                module = self._cp.RawModule(code=workload.code, options=options)
                st.function = module.get_function(workload.kernel_name)
                _ = st.function.num_regs  # compile and load now, not at the first launch
        except Exception as ex:  # NVRTC's log is in the message
            st.failure = f"{type(ex).__name__}: {ex}".strip()
        else:
            self._functions[(workload.code, st.config_id)] = st.function
        return st

    def launch(self, state: ConfigState, args: tuple[Any, ...], timed: bool) -> LaunchRecord:
        if not timed:
            state.function(state.grid, state.block, args)
            return (state.config_id, 0.0, None)
        events = self._events
        start = events.pop() if events else self._cp.cuda.Event()
        end = events.pop() if events else self._cp.cuda.Event()
        start.record()
        state.function(state.grid, state.block, args)
        end.record()
        timing = [start, end, None]
        self._pending.append(timing)
        self._retire(_RETIRE_PER_CALL)
        return (state.config_id, _now(), timing)

    def _retire(self, most: int) -> None:
        """Read the durations of up to ``most`` of the oldest timed launches the GPU has
        finished, on the caller's thread; skipped while the node's thread reads."""
        if not self._reading.acquire(blocking=False):
            return
        try:
            pending, elapsed = self._pending, self._cp.cuda.get_elapsed_time
            while pending and most > 0:
                timing = pending[0]
                if timing[2] is None:
                    if not timing[1].done:  # in launch order: the rest are not done either
                        break
                    self._read(timing, elapsed)
                    most -= 1
                pending.popleft()
        finally:
            self._reading.release()

    def _read(self, timing: list[Any], elapsed: Any) -> None:
        """Store a finished launch's duration (us) and give its events back to the pool."""
        timing[2] = elapsed(timing[0], timing[1]) * 1000.0
        self._events += timing[:2]
        timing[0] = timing[1] = None

    def resolve(
        self, records: Sequence[LaunchRecord]
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        with self._reading:
            n = 0
            for _, _, timing in records:  # only what the GPU finished: never wait for it
                if timing is not None and timing[2] is None and not timing[1].done:
                    break
                n += 1
            t_end, dur, ok = np.empty(n), np.zeros(n), np.ones(n, dtype=bool)
            elapsed = self._cp.cuda.get_elapsed_time
            for i, (_, t, timing) in enumerate(records[:n]):
                t_end[i] = t
                if timing is None:
                    ok[i] = False
                    continue
                if timing[2] is None:  # the caller has not read it (it stopped calling)
                    self._read(timing, elapsed)
                dur[i] = timing[2]
        return n, t_end, dur, ok

    def plan(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        """The plan of ``config``: once it is compiled, with the module's registers and
        static shared memory and the driver's resident blocks per SM ("cupy module")."""
        cfg = well_formed(workload.space, config)
        key = (workload.code, workload.space.config_id(cfg))
        if (cached := self._plans.get(key)) is not None:
            return cached
        fn = self._functions.get(key)
        if fn is None:  # not compiled (yet), or it failed: the compiler's table or estimate
            return make_plan(self.spec, workload, cfg)
        geo = workload.geometry(cfg)
        plan = self._plans[key] = make_plan(
            self.spec,
            workload,
            cfg,
            registers_per_thread=int(fn.num_regs),
            static_smem_bytes=int(fn.shared_size_bytes),
            resident_blocks_per_sm=self._gpu._resident_blocks(
                fn, geo.threads_per_block, geo.dynamic_smem_bytes
            ),
            resources_source="cupy module",
        )
        return plan

    def sample(self) -> dict[str, float] | None:
        return self._gpu.sample()


_CUPY: dict[int, CupyKernelDevice] = {}


def cupy_device(index: int = 0) -> CupyKernelDevice:
    """The real GPU ``index`` (one device object per GPU in the process)."""
    if index not in _CUPY:
        _CUPY[index] = CupyKernelDevice(index)
    return _CUPY[index]


class CompileKernelDevice:
    """No GPU: NVRTC compiles each configuration for ``arch`` when it is prepared; no
    configuration is launched.

    The device's model is the first known GPU of ``arch`` (sm_80: an A100, sm_90: an
    H100), whose limits the occupancy of each configuration is computed against.
    """

    backend = "compile"
    realtime = False

    def __init__(self, arch: str = "sm_90") -> None:
        self.arch = check_arch(arch)
        self.spec = device_for_arch(arch) or DeviceSpec.unknown(f"a GPU of {arch}")
        self.device_index = 0

    def __repr__(self) -> str:
        return f"compile_device({self.arch!r})"

    def bind(self, workload: UserWorkload) -> None:
        return None  # every declared configuration is a candidate

    def prepare(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> ConfigState:
        st = _state(workload, config)
        result = compile_workload(workload, st.config, self.arch)
        if not result.ok:
            st.failure = f"NVRTC ({self.arch}): {result.log}"
        return st

    def launch(self, state: ConfigState, args: tuple[Any, ...], timed: bool) -> LaunchRecord:
        raise KernelDefinitionError(
            f"{self!r} compiles kernels and runs none ({state.config_id} compiled): "
            "make the kernel with device=cupy_device() or trace_device(path) to call it"
        )

    def resolve(
        self, records: Sequence[LaunchRecord]
    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        return 0, np.empty(0), np.empty(0), np.empty(0, dtype=bool)  # it launches nothing

    def plan(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        return make_plan(self.spec, workload, well_formed(workload.space, config))

    def sample(self) -> dict[str, float] | None:
        return None


def compile_device(arch: str = "sm_90") -> CompileKernelDevice:
    """A device without a GPU that compiles each configuration of a kernel with NVRTC for
    ``arch`` and runs none: a kernel made on it can be checked (``kernel.check()``, its
    space, its first configuration compiled) on any machine, e.g. in CI. Calling the
    kernel raises :class:`KernelDefinitionError`.
    """
    return CompileKernelDevice(arch)
