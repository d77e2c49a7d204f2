"""``TunableKernel``: a user's CUDA kernel that runs the configuration in force for it.

Calling a :class:`TunableKernel` launches the kernel once with its current configuration
(prepared beforehand: compiled, or its measured durations found). A node
(:class:`kernelstream.Node`) attaches to every kernel of the process through
:class:`KernelRunner`: each call then appends one record to the kernel's launch log (a
deque: thread-safe, never blocks), which the node drains, times and publishes on its own
thread. The node switches a kernel's configuration by swapping one reference between two
calls (the safe point), so a call never sees half a change.

A configuration that fails to compile (or, on a trace device, failed when measured) is
never launched: the call records a failed launch for it and runs the last configuration
that worked, so the node rolls the change back and the tuner marks it failed. Only the
kernel's first configuration has nothing to fall back on; that raises
:class:`KernelCompileError` with the compiler's log.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelstream.kernels.backends.base import LaunchPlan
from kernelstream.kernels.backends.user import ConfigState, KernelDevice, LaunchRecord
from kernelstream.kernels.errors import (
    KernelArgumentError,
    KernelCompileError,
    KernelDefinitionError,
)
from kernelstream.kernels.runner import LaunchChunk
from kernelstream.kernels.space import Config, ParamValue, SearchSpace
from kernelstream.kernels.workloads.user import CostModel, GridDiv, Restriction, UserWorkload

if TYPE_CHECKING:
    from kernelstream.kernels.check import CheckRow

__all__ = ["KernelRunner", "TunableKernel", "default_device", "live_kernels", "on_new_kernel"]

log = logging.getLogger("kernelstream.kernels.user")

#: Launch records a kernel keeps for a node that does not drain them (a stalled node):
#: past this, launches still run but are counted in ``dropped`` instead of logged.
MAX_PENDING = 1_000_000

_perf_counter = time.perf_counter

_LIVE: weakref.WeakValueDictionary[str, TunableKernel] = weakref.WeakValueDictionary()
_LISTENERS: list[Callable[[TunableKernel], None]] = []
_LIVE_LOCK = threading.Lock()


def live_kernels() -> list[TunableKernel]:
    """Every :class:`TunableKernel` of this process that is still referenced."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def on_new_kernel(listener: Callable[[TunableKernel], None]) -> Callable[[], None]:
    """Call ``listener`` with each kernel made from now on; returns the unsubscribe."""
    with _LIVE_LOCK:
        _LISTENERS.append(listener)
    return lambda: _LISTENERS.remove(listener) if listener in _LISTENERS else None


_DEFAULT_DEVICES: list[KernelDevice] = []


@contextmanager
def default_device(device: KernelDevice) -> Iterator[KernelDevice]:
    """Within the block, a kernel made without ``device=`` gets ``device`` instead of GPU 0.

    ``kernelstream kernels check --kernel`` imports a user's module under
    ``default_device(compile_device(...))``, so kernels written for a GPU can be made, and
    checked, on a machine without one.
    """
    with _LIVE_LOCK:
        _DEFAULT_DEVICES.append(device)
    try:
        yield device
    finally:
        with _LIVE_LOCK:
            _DEFAULT_DEVICES.remove(device)


def _default_device() -> KernelDevice:
    with _LIVE_LOCK:
        if _DEFAULT_DEVICES:
            return _DEFAULT_DEVICES[-1]
    from kernelstream.kernels.backends.user import cupy_device

    return cupy_device(0)


class TunableKernel:
    """A CUDA kernel under the loop, declared as for ``kernel_tuner.tune_kernel``.

    ``tune_params`` maps each parameter to its list of values; ``restrictions`` are
    Python expressions over parameter names or callables of a config dict;
    ``grid_div_x/y/z`` and ``block_size_names`` set the launch geometry as in Kernel
    Tuner; ``flops``/``bytes`` (callables of the config and the problem size) put the
    launches on the roofline. ``device`` is :func:`trace_device` or a cupy device
    (default: GPU 0). ``default`` is the configuration to start from (default: the first
    value of each parameter, or the valid configuration closest to it).

    Call it with the kernel's arguments, as a CuPy ``RawKernel`` without grid and block
    (those come from the configuration in force).
    """

    def __init__(
        self,
        name: str,
        source: str | Path,
        problem_size: int | Sequence[int],
        tune_params: Mapping[str, Sequence[ParamValue]],
        *,
        restrictions: Restriction | Sequence[Restriction] | None = None,
        grid_div_x: GridDiv | None = None,
        grid_div_y: GridDiv | None = None,
        grid_div_z: GridDiv | None = None,
        block_size_names: Sequence[str] | None = None,
        flops: CostModel | None = None,
        bytes: CostModel | None = None,
        device: KernelDevice | None = None,
        default: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.workload = UserWorkload(
            name,
            source,
            problem_size,
            tune_params,
            restrictions=restrictions,
            grid_div_x=grid_div_x,
            grid_div_y=grid_div_y,
            grid_div_z=grid_div_z,
            block_size_names=block_size_names,
            flops=flops,
            bytes=bytes,
            default=default,
        )
        self.device = device if device is not None else _default_device()
        self.device.bind(self.workload)
        first = self.device.prepare(self.workload, self.workload.default)
        if first.failure is not None:
            raise KernelCompileError(
                f"kernel {name!r}: its first configuration {first.config_id} cannot run: "
                f"{first.failure}"
            )
        self._state: ConfigState = first
        self._good: ConfigState = first
        # Every configuration prepared, by id: launch records name their configuration by
        # id. Bounded by the configurations tried, like a backend's compiled-function cache.
        self._states: dict[str, ConfigState] = {first.config_id: first}
        self._arity = self.workload.arity
        self._log: deque[LaunchRecord] | None = None
        self._copies: deque[CopyRecord] | None = None
        # Per logged launch, the host's gap before it (us) and whether the host waited
        # on the device in that gap; appended before its launch record, so a reader
        # that takes n records always finds their n entries here.
        self._host: deque[float] | None = None
        self._returned: float | None = None  # perf_counter() when the last call returned
        self._waited = 0
        self.failures: dict[str, str] = {}
        self.dropped = 0
        self._register()

    def _register(self) -> None:
        with _LIVE_LOCK:
            _LIVE[self.name] = self  # a kernel made anew under its name replaces the old
            listeners = list(_LISTENERS)
        for listener in listeners:
            listener(self)

    def __repr__(self) -> str:
        return f"TunableKernel({self.name!r}, {self.config_id!r}, device={self.device!r})"

    @property
    def name(self) -> str:
        return self.workload.name

    @property
    def space(self) -> SearchSpace:
        return self.workload.space

    @property
    def config(self) -> Config:
        """The configuration the next call runs."""
        return dict(self._state.config)

    @property
    def config_id(self) -> str:
        return self._state.config_id

    def __call__(self, *args: Any) -> None:
        if len(args) != self._arity:
            raise KernelArgumentError(
                f"kernel {self.name!r} takes {self._arity} arguments ({self.workload.signature}), "
                f"got {len(args)}"
            )
        state = self._state
        out = self._log
        if out is None:  # no node: nothing to record
            if state.failure is not None:
                state = self._fall_back(state, out)
            self.device.launch(state, args, False)
            return
        called = _perf_counter()
        if state.failure is not None:
            state = self._fall_back(state, out)
        record = self.device.launch(state, args, True)
        host = self._host
        if len(out) < MAX_PENDING and host is not None:
            last = self._returned  # _gap, inlined: this is every call's path
            if last is None or self._waited:
                host.append(self._gap(called))
            else:
                host.append((called - last) * 1e6)
            out.append(record)
        else:
            self.dropped += 1
        self._returned = _perf_counter()

    def _gap(self, called: float) -> float:
        """The host's gap before a launch called at ``called``: since the last call on this
        kernel returned (0 for the first), in us; stored as ``-gap - 1`` when
        :meth:`record_wait` was called in it (one float per launch keeps the log small)."""
        last = self._returned
        gap = 0.0 if last is None else (called - last) * 1e6
        if self._waited:
            self._waited = 0
            return -gap - 1.0
        return gap

    def record_wait(self) -> None:
        """Report that the host waited on the device since this kernel's last launch.

        Call it where your step synchronizes (``stream.synchronize()``, a blocking copy
        such as ``.get()``): the next launch is sent marked ``host_waited``, and a kernel
        whose every launch follows a wait gets the ``host_sync`` finding. The time between
        launches (``host_gap_us``) is measured without it. Without a node this does nothing.
        """
        if self._host is not None:
            self._waited = 1

    def record_copy(
        self,
        direction: str,
        nbytes: int,
        duration_us: float,
        *,
        pinned: bool,
        stream: int = 0,
        t_end: float | None = None,
    ) -> None:
        """Report a copy this kernel's step made (``h2d``, ``d2h`` or ``d2d``).

        ``duration_us`` as measured (on a GPU: CUDA events around the copy on its
        stream), ``pinned`` whether the host buffer was page-locked, ``t_end`` the
        copy's end on the host clock (now when omitted). The node sends it with the
        kernel's launches (``ks.launch_batch/2``), where the worker weighs it against the
        kernels (see docs/guide/transfers.md). Without a node this does nothing.

        """
        problem = _copy_problem(direction, nbytes, duration_us, stream)
        if problem:
            raise KernelArgumentError(f"kernel {self.name!r}: {problem}")
        out = self._copies
        if out is not None and len(out) < MAX_PENDING:
            at = time.time() if t_end is None else t_end
            out.append((at, direction, int(nbytes), float(duration_us), int(pinned), stream))

    def _fall_back(self, state: ConfigState, out: deque[LaunchRecord] | None) -> ConfigState:
        """Record a failed launch of ``state`` and run the last configuration that worked."""
        if state.config_id not in self.failures:
            self.failures[state.config_id] = state.failure or ""
            log.warning(
                "kernel %s: configuration %s cannot run, running %s instead: %s",
                self.name,
                state.config_id,
                self._good.config_id,
                state.failure,
            )
        if out is not None and self._host is not None:
            self._host.append(self._gap(_perf_counter()))
            out.append((state.config_id, time.time(), None))
        return self._good

    def use(self, config: Mapping[str, ParamValue]) -> None:
        """Run ``config`` from the next call on (without a node; with one, ``node.apply``).

        Raises :class:`SpaceError` for a config outside the space and
        :class:`KernelCompileError` when it cannot run.
        """
        if self._log is not None:
            raise KernelDefinitionError(
                f"kernel {self.name!r} is run by a node: apply a recommendation with "
                "node.apply(rec), so the node measures it and can roll it back"
            )
        state = self.device.prepare(self.workload, config)
        if state.failure is not None:
            raise KernelCompileError(f"kernel {self.name!r}: {state.config_id}: {state.failure}")
        self._states[state.config_id] = state
        self._state = self._good = state

    def check(
        self,
        arch: str | Sequence[str] = ("sm_80", "sm_90"),
        *,
        sample: int = 8,
        every: bool = False,
        cache_dir: str | Path | None = None,
    ) -> list[CheckRow]:
        """Compile this kernel for each ``arch`` with NVRTC, no GPU needed: its default
        configuration and ``sample - 1`` more spread over its space (or ``every`` one).

        Returns one :class:`~kernelstream.kernels.check.CheckRow` per (arch, configuration):
        ``row.result.ok`` and ``row.result.log`` (the compiler's log, the error of a
        configuration that does not compile), ``registers``, ``static_smem_bytes``,
        ``spills`` and ``local_bytes`` of ``row.result``, and ``row.occupancy`` on a GPU of
        that architecture. Compiles are cached on disk (``cache_dir``, default
        ``~/.cache/kernelstream/compile``). Raises ``BackendUnavailableError`` (with the
        install command) without NVRTC, ``ValueError`` for a malformed ``arch`` or
        ``sample`` < 1.

        >>> rows = kernel.check("sm_90", sample=4)               # doctest: +SKIP
        >>> [r.config_id for r in rows if not r.result.ok]       # doctest: +SKIP
        []
        """
        from kernelstream.kernels.check import check_workloads
        from kernelstream.kernels.compile import check_arch

        archs = [arch] if isinstance(arch, str) else list(arch)
        for a in archs:
            check_arch(a)
        if isinstance(sample, bool) or not isinstance(sample, int) or sample < 1:
            raise ValueError(f"sample must be an int >= 1 (the default counts), got {sample!r}")
        where = Path(cache_dir) if cache_dir is not None else None
        return check_workloads([self.workload], archs, sample=sample, every=every, cache_dir=where)

    def write_space(self, directory: str | Path) -> Path:
        """Write this kernel's declared space where workers find it (their
        ``tuning_spaces_dir``): their tuner then proposes only configurations of it."""
        from kernelstream.kernels.declared import write_space

        return write_space(self.workload, directory)

    # -- the node's side --------------------------------------------------------------
    def _attach(self) -> deque[LaunchRecord]:
        if self._log is not None:
            raise KernelDefinitionError(f"kernel {self.name!r} is already run by a node")
        self._log = deque()
        self._copies = deque()
        self._host = deque()
        self._returned, self._waited = None, 0
        return self._log

    def _detach(self) -> None:
        self._log = None
        self._copies = None
        self._host = None

    def _switch(self, config: Mapping[str, ParamValue]) -> None:
        """Prepare ``config`` (compile it) and swap it in: the next call runs it."""
        state = self.device.prepare(self.workload, config)
        self._states[state.config_id] = state
        if self._state.failure is None:
            self._good = self._state
        self._state = state


class KernelRunner:
    """The node's view of its kernels, with the interface of :class:`WorkloadRunner`.

    :meth:`tick` drains each kernel's launch log into :class:`LaunchChunk` s (one per run of
    launches with one configuration) with the kernel's sequence numbers.
    """

    def __init__(self, device: KernelDevice) -> None:
        self.device = device
        self.kernels: dict[str, _Attached] = {}

    def add(self, kernel: TunableKernel) -> None:
        if kernel.device.spec.name != self.device.spec.name:
            raise KernelDefinitionError(
                f"kernel {kernel.name!r} runs on {kernel.device.spec.name}; this node runs "
                f"{self.device.spec.name}: one node per device"
            )
        if kernel.name in self.kernels:
            raise KernelDefinitionError(
                f"this node already runs a kernel named {kernel.name!r}: kernel names key "
                "the telemetry, so the kernels of one node need names of their own"
            )
        self.kernels[kernel.name] = _Attached(kernel, kernel._attach())

    def detach_all(self) -> None:
        for a in self.kernels.values():
            a.kernel._detach()

    def config_of(self, kernel: str) -> Config:
        return self.kernels[kernel].kernel.config

    def set_config(self, kernel: str, config: Config) -> None:
        """Switch ``kernel`` to ``config`` from its next call (compiles it first)."""
        self.kernels[kernel].kernel._switch(config)

    def tick(self, now: float) -> list[LaunchChunk]:
        chunks: list[LaunchChunk] = []
        for name, a in self.kernels.items():
            popleft = a.log.popleft  # what is appended meanwhile stays for the next tick
            records = [popleft() for _ in range(len(a.log))]
            if not records:
                continue
            host = a.take_host(len(records))
            done, t_end, dur, ok = self.device.resolve(records)
            if done < len(records):  # not finished on the GPU yet: back to the front
                a.log.extendleft(reversed(records[done:]))
                a.put_back_host(host[done:])
            if not done:
                continue
            raw = np.asarray(host[:done], dtype=np.float64)
            waits = raw < 0  # a gap after record_wait() is stored as -gap - 1
            gaps = np.where(waits, -raw - 1.0, raw)
            ids = [r[0] for r in records[:done]]
            # A chunk per run of launches of one configuration (a switch starts a new run).
            cuts = [i for i in range(1, done) if ids[i] != ids[i - 1]]
            for start, stop in zip([0, *cuts], [*cuts, done], strict=True):
                state = a.kernel._states[ids[start]]
                chunks.append(
                    LaunchChunk(
                        name,
                        a.kernel.workload,
                        dict(state.config),
                        state.config_id,
                        a.seq,
                        t_end[start:stop],
                        dur[start:stop],
                        ok[start:stop],
                        host_gap_us=gaps[start:stop],
                        host_waited=waits[start:stop],
                    )
                )
                a.seq += stop - start
            _attach_copies(a.kernel._copies, chunks[-1])
        return chunks

    @property
    def clock(self) -> float | None:
        return None


CopyRecord = tuple[float, str, int, float, int, int]  # t_end, direction, bytes, us, pinned, stream
_DIRECTIONS = ("h2d", "d2h", "d2d")


def _copy_problem(direction: str, nbytes: int, duration_us: float, stream: int) -> str:
    """Why a reported copy is not a copy, or ""."""
    if direction not in _DIRECTIONS:
        return f"copy direction {direction!r} is not one of {', '.join(_DIRECTIONS)}"
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        return f"copy size {nbytes!r} is not a byte count >= 0"
    if not (isinstance(duration_us, int | float) and 0.0 <= duration_us <= 3.6e9):
        return f"copy duration {duration_us!r} us is not between 0 and one hour"
    if not isinstance(stream, int) or stream < 0:
        return f"copy stream {stream!r} is not a stream number >= 0"
    return ""


def _attach_copies(copies: deque[CopyRecord] | None, chunk: LaunchChunk) -> None:
    """Give the copies reported so far to ``chunk`` (the kernel's latest launches),
    each assigned to the launch it ended before (or the last)."""
    if not copies:
        return
    taken = [copies.popleft() for _ in range(len(copies))]
    ends = [c[0] for c in taken]
    launch = np.minimum(np.searchsorted(chunk.t_end, ends), len(chunk.t_end) - 1)
    chunk.copies = {
        "t_end": [round(t, 6) for t in ends],
        "direction": [c[1] for c in taken],
        "bytes": [c[2] for c in taken],
        "duration_us": [round(c[3], 3) for c in taken],
        "pinned": [c[4] for c in taken],
        "stream": [c[5] for c in taken],
        "launch": launch.tolist(),
    }


class _Attached:
    def __init__(self, kernel: TunableKernel, log: deque[LaunchRecord]) -> None:
        self.kernel, self.log, self.seq = kernel, log, 0

    def take_host(self, n: int) -> list[float]:
        """The host entries of the ``n`` launch records just taken (see ``_host``)."""
        host = self.kernel._host
        if host is None:
            return [0.0] * n
        popleft = host.popleft
        return [popleft() for _ in range(n)]

    def put_back_host(self, entries: list[float]) -> None:
        host = self.kernel._host
        if host is not None:
            host.extendleft(reversed(entries))

    @property
    def config_id(self) -> str:
        return self.kernel.config_id


class KernelNodeDevice:
    """The device of a node of user kernels, as the node's batcher and agent see it."""

    def __init__(self, runner: KernelRunner) -> None:
        self.runner = runner
        dev = runner.device
        self.backend, self.spec, self.device_index = dev.backend, dev.spec, dev.device_index

    def workloads(self) -> list[UserWorkload]:
        return [a.kernel.workload for a in self.runner.kernels.values()]

    def plan(self, workload: UserWorkload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        return self.runner.device.plan(workload, config)

    def sample(self) -> dict[str, float] | None:
        return self.runner.device.sample()

    def failure_reason(
        self, workload: UserWorkload, config: Mapping[str, ParamValue]
    ) -> str | None:
        """Why ``config`` of ``workload`` could not run (its compiler's log), if it failed."""
        attached = self.runner.kernels.get(workload.name)
        if attached is None:
            return None
        return attached.kernel.failures.get(workload.space.config_id(config))

    def close(self) -> None:
        self.runner.detach_all()
