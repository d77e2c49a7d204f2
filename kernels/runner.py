"""The workload runner: launches a node's kernels on its device and batches telemetry.

The same runner drives every backend. Each tick it runs the node's workloads
round-robin (one launch of each kernel per iteration, like the steps of an
application) for the device time since the last tick, then turns what ran into
columnar batches (:class:`NodeBatch`, published as :class:`schemas.LaunchBatch`).
Tick boundaries are the safe points where the reconfiguration agent may switch a
kernel's configuration.

Event time is the node's clock at each kernel's completion: for the ``sim`` and
``trace`` devices the runner lays the modelled durations out back to back on
the wall clock; for a real device (``realtime = True``: ``cupy``) the durations
are real and the layout is shifted so the last launch of a tick ends at the
real clock when the tick returns.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from kernelstream.kernels.space import Config
from kernelstream.kernels.transfers import HostPattern, HostTimeline, simulate_host
from kernelstream.schemas import DeviceSample, LaunchBatch, encode
from kernelstream.schemas.binary import encode_arrays, encode_launch_batch, header_json
from kernelstream.schemas.records import (
    MAX_DURATION_BITS,
    MAX_DURATION_US,
    MAX_LAUNCHES,
    CopyColumns,
)

__all__ = ["BatchTemplate", "LaunchBatcher", "LaunchChunk", "NodeBatch", "WorkloadRunner"]

#: Host-side gap between consecutive launches (queueing, Python, driver), in µs.
_HOST_GAP_US = 4.0

# Wire precision of the launch columns. CUDA events resolve about 0.5 µs
# (cudaEventElapsedTime, CUDA Runtime API), so durations carry 1 ns and event
# times 1 µs: float64's shortest repr would otherwise spend ~17 digits on noise.
# Measured on the benchmark fleet's batches: 37.5 -> 27.9 JSON bytes per launch,
# 10.5 -> 5.6 zstd bytes, and faster parsing on the worker.
_T_END_DECIMALS = 6
_DURATION_DECIMALS = 3


@dataclass
class LaunchChunk:
    """Launches of one kernel with one configuration, ready to batch."""

    kernel: str
    workload: Any
    config: Config
    config_id: str
    seq_start: int
    t_end: np.ndarray
    duration_us: np.ndarray
    ok: np.ndarray
    # Host side, when the kernel runs with a host pattern: per launch, and its copies.
    host_gap_us: np.ndarray | None = None
    host_waited: np.ndarray | None = None
    copies: dict[str, list[Any]] | None = None
    # Each launch's share of the step (host gap, exposed copies, kernel): what a change
    # of the host side (pinned buffers, streams, batching) is measured by.
    step_us: np.ndarray | None = None


_add, _max = np.add.reduce, np.maximum.reduce  # what .sum() and .max() run, unwrapped
_F8 = np.dtype("<f8")  # NumPy's own instance on little-endian: ``is`` is its test

# Templates a batcher keeps, one per kernel and configuration it has batched: bounded for
# a node whose tuner walks many configurations (cleared when full, then rebuilt on use).
_TEMPLATES_MAX = 1024


@dataclass(frozen=True, slots=True)
class BatchTemplate:
    """What every batch of one kernel in one configuration on one device carries: the
    per-batch fields of :class:`LaunchBatch` (no columns, no ``seq_start``, no samples),
    validated by the model once, and their binary wire header (:mod:`schemas.binary`)."""

    fields: dict[str, Any]
    stream_key: str
    header: bytes

    @classmethod
    def of(cls, fields: dict[str, Any]) -> BatchTemplate:
        """Validate ``fields`` (raises pydantic's ValidationError) and build the header."""
        probe = LaunchBatch(**fields, seq_start=0, t_end=[0.0], duration_us=[0.0], ok=[1])
        return cls(fields, probe.stream_key, header_json(probe))


@dataclass(frozen=True, slots=True, eq=False)
class NodeBatch:
    """A closed launch batch as the node holds it: the stream's :class:`BatchTemplate` and
    the columns as the arrays the device produced.

    A node publishes it without building the record: :meth:`wire` frames the template's
    header and the arrays' bytes (binary), checking the columns with vectorized
    comparisons. :meth:`record` is the validated :class:`LaunchBatch` (lists), for the
    JSON wire format and for whoever reads the fields.
    """

    template: BatchTemplate
    seq_start: int
    t_end: np.ndarray  # float64, to 1 µs
    duration_us: np.ndarray  # float64, to 1 ns
    ok: np.ndarray  # uint8, 0 or 1; int64 when a device gave other flags (_flags)
    samples: list[DeviceSample]
    host: dict[str, Any]  # version 2 fields: host_gap_us, host_waited (lists), copies

    @property
    def stream_key(self) -> str:
        return self.template.stream_key

    @property
    def config_id(self) -> str:
        return str(self.template.fields["config_id"])

    def __len__(self) -> int:
        return len(self.t_end)

    def record(self) -> LaunchBatch:
        """The batch as a validated record (raises pydantic's ValidationError if bad)."""
        return LaunchBatch(
            **self.template.fields,
            seq_start=self.seq_start,
            t_end=self.t_end.tolist(),
            duration_us=self.duration_us.tolist(),
            ok=self.ok.tolist(),
            samples=self.samples,
            **self.host,
        )

    def wire(self, binary: bool = True) -> bytes:
        """The message: the binary layout (the default) or the record's JSON.

        The binary bytes equal ``schemas.binary.encode_launch_batch(self.record())``; a
        batch without samples and host columns is framed from the template's header and
        the arrays, a batch whose columns a check refuses goes through the record, whose
        verdict (pydantic's ValidationError) is final.
        """
        if not binary:
            return encode(self.record())
        if self.samples or self.host or not self._columns_plain():
            return encode_launch_batch(self.record())
        return encode_arrays(
            self.template.header, self.seq_start, self.t_end, self.duration_us, self.ok
        )

    def raw_json(self) -> bytes:
        """The batch as JSON whatever its values (a NaN is written as null): the value of
        the dead letter of a batch the model refused."""
        fields = {"schema": LaunchBatch.SCHEMA, **self.template.fields}
        fields |= {"seq_start": self.seq_start, "t_end": self.t_end}
        fields |= {"duration_us": self.duration_us, "ok": self.ok, "samples": self.samples}
        return orjson.dumps(
            fields | self.host,
            option=orjson.OPT_SERIALIZE_NUMPY,
            default=lambda m: m.model_dump(mode="json"),
        )

    def _columns_plain(self) -> bool:
        """True when the columns pass the model's checks; False sends them to the model.

        Two reductions, no temporaries (on a node's ~180-launch batches each NumPy call
        costs about a microsecond whatever its length, so their number is the cost): a
        sum of event times is finite only if every one is (a NaN or an infinity carries
        through), and the durations' bit patterns, read as unsigned integers, sort as
        non-negative doubles do and put every negative number and NaN above +inf, so one
        maximum checks 0 <= d <= MAX_DURATION_US and "no NaN" at once (-0.0, which the
        model takes, fails it and goes to the model).
        """
        n = len(self.t_end)
        if not 1 <= n <= MAX_LAUNCHES or len(self.duration_us) != n or len(self.ok) != n:
            return False
        if self.ok.dtype != np.uint8:  # flags other than 0 and 1 (kernels.runner._flags)
            return False
        d = self.duration_us
        if d.dtype is not _F8:
            return bool(d.min() >= 0.0 and d.max() <= MAX_DURATION_US) and math.isfinite(
                self.t_end.sum()
            )
        return math.isfinite(_add(self.t_end)) and int(_max(d.view("<u8"))) <= MAX_DURATION_BITS


@dataclass
class _KernelState:
    workload: Any
    config: Config
    config_id: str
    seq: int = 0
    mean_us: float = 0.0
    host: HostPattern | None = None


class WorkloadRunner:
    """Runs a device's workloads in real time, one tick at a time.

    ``max_launches_per_s`` caps the launch rate of the whole device so a fleet of
    simulated nodes fits on a small machine; idle time is inserted between
    iterations when kernels would run faster than that.
    """

    def __init__(
        self,
        device: Any,
        workloads: Sequence[Any],
        *,
        start_configs: Mapping[str, Config] | None = None,
        max_launches_per_s: float = 20_000.0,
        max_iterations_per_tick: int = 5_000,
        host_patterns: Mapping[str, HostPattern] | None = None,
    ) -> None:
        self.device = device
        self.max_launches_per_s = max_launches_per_s
        self.max_iterations_per_tick = max_iterations_per_tick
        self._clock: float | None = None
        self.kernels: dict[str, _KernelState] = {}
        for w in workloads:
            cfg = dict((start_configs or {}).get(w.name) or w.space.start_config())
            host = (host_patterns or {}).get(w.name)
            self.kernels[w.name] = _KernelState(w, cfg, w.space.config_id(cfg), host=host)

    def config_of(self, kernel: str) -> Config:
        return dict(self.kernels[kernel].config)

    def set_config(self, kernel: str, config: Config) -> None:
        """Switch a kernel's configuration; call only between ticks (a safe point)."""
        state = self.kernels[kernel]
        state.config = dict(config)
        state.config_id = state.workload.space.config_id(config)
        state.mean_us = 0.0

    def tick(self, now: float) -> list[LaunchChunk]:
        """Run every kernel for the device time between the last tick and ``now``."""
        if self._clock is None:
            self._clock = now
        span_s = now - self._clock
        if span_s <= 0:
            return []
        names = list(self.kernels)
        est_iter_us = sum(max(s.mean_us, 1.0) + _HOST_GAP_US for s in self.kernels.values())
        min_iter_us = len(names) * 1e6 / self.max_launches_per_s
        iter_us = max(est_iter_us, min_iter_us)
        n = max(1, min(self.max_iterations_per_tick, math.floor(span_s * 1e6 / iter_us)))
        if any(s.mean_us <= 0.0 for s in self.kernels.values()):
            # A kernel's duration is unknown (first tick, or a new configuration): one
            # iteration measures it, so the tick cannot lay out more device time than
            # the wall clock allows (which would put event times in the future).
            n = 1
        durations = np.empty((n, len(names)))
        oks = np.empty((n, len(names)), dtype=bool)
        lead = np.full((n, len(names)), _HOST_GAP_US)
        hosts: dict[str, HostTimeline] = {}
        for j, name in enumerate(names):
            s = self.kernels[name]
            res = self.device.launch(s.workload, s.config, n)
            durations[:, j] = res.duration_us
            oks[:, j] = res.ok
            if res.ok.any():
                s.mean_us = float(res.duration_us[res.ok].mean())
            if s.host is not None:
                spec = self.device.spec
                hosts[name] = simulate_host(spec, s.host.with_config(s.config), res.duration_us)
                lead[:, j] = hosts[name].lead_us
            elif res.host_gap_us is not None and res.host_waited is not None:
                hosts[name] = _measured(res.host_gap_us, res.host_waited)
        # Lay the launches out back to back: lead (host gap, exposed copies), kernel,
        # lead, kernel, ...; pad each iteration with idle time when the launch-rate cap
        # asks for it.
        step = durations + lead
        pad = np.maximum(0.0, min_iter_us - step.sum(axis=1))
        step[:, -1] += pad
        ends_us = np.cumsum(step.ravel()).reshape(n, len(names)) - (step - durations - lead)
        t_end = self._clock + ends_us / 1e6
        if getattr(self.device, "realtime", False):
            # A real GPU ran these launches just now: end the layout at the real clock
            # (host overheads make the real span longer than the laid-out one).
            lag = time.time() - float(t_end[-1, -1])
            if lag > 0:
                t_end += lag
        self._clock = max(float(t_end[-1, -1]), self._clock)
        chunks = []
        for j, name in enumerate(names):
            s = self.kernels[name]
            chunks.append(
                LaunchChunk(
                    name,
                    s.workload,
                    dict(s.config),
                    s.config_id,
                    s.seq,
                    t_end[:, j].copy(),
                    durations[:, j].copy(),
                    oks[:, j].copy(),
                    *_host_columns(hosts.get(name), t_end[:, j], durations[:, j]),
                )
            )
            s.seq += n
        return chunks

    @property
    def clock(self) -> float | None:
        """The device clock: the end of the last launch laid out (event time)."""
        return self._clock


def _measured(gap_us: np.ndarray, waited: np.ndarray) -> HostTimeline:
    """A real device's measured host gaps and waits, as a timeline with no copies."""
    n = len(gap_us)
    return HostTimeline(gap_us, waited, np.zeros(n), {}, np.empty(0, dtype=np.int64), np.empty(0))


def _host_columns(
    host: HostTimeline | None, t_end: np.ndarray, duration_us: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None, dict[str, list[Any]] | None, np.ndarray | None]:
    """A kernel's host gaps, waits, copies (with their end times) and steps for one tick."""
    if host is None:
        return None, None, None, None
    copies = None
    if len(host.copy_launch):
        ends = t_end[host.copy_launch] + host.copy_end_us / 1e6
        copies = dict(
            host.copies,
            t_end=np.round(ends, _T_END_DECIMALS).tolist(),
            launch=host.copy_launch.tolist(),
        )
    # Measured gaps are already on the device's timeline: its step is the kernel.
    step = duration_us + host.lead_us if host.lead_us.any() else None
    return host.host_gap_us.copy(), host.host_waited.copy(), copies, step


@dataclass
class _Pending:
    chunk_meta: LaunchChunk
    t_end: list[np.ndarray] = field(default_factory=list)
    duration_us: list[np.ndarray] = field(default_factory=list)
    ok: list[np.ndarray] = field(default_factory=list)
    host_gap_us: list[np.ndarray] = field(default_factory=list)
    host_waited: list[np.ndarray] = field(default_factory=list)
    copies: dict[str, list[Any]] = field(default_factory=dict)
    seq_start: int = 0
    count: int = 0
    opened_at: float = 0.0


class LaunchBatcher:
    """Turns launch chunks into batches (:class:`NodeBatch`), by size and by time.

    A batch holds one kernel and one configuration; it is closed when it reaches
    ``max_launches`` or when its first launch is ``max_delay_s`` old (bounded
    delay), whichever comes first. The per-batch fields of a kernel in a configuration
    (its launch plan, the device's peaks) are built and validated once
    (:class:`BatchTemplate`); a batch keeps its columns as arrays until it is published.
    """

    def __init__(
        self, device: Any, node: str, *, max_launches: int = 2000, max_delay_s: float = 0.1
    ) -> None:
        self.device = device
        self.node = node
        self.max_launches = max_launches
        self.max_delay_s = max_delay_s
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._samples: list[DeviceSample] = []
        self._templates: dict[tuple[str, str], tuple[Any, BatchTemplate]] = {}
        self._open: dict[str, str] = {}  # kernel -> configuration of its open batch

    def add_sample(self, sample: DeviceSample) -> None:
        self._samples.append(sample)

    def add(self, chunk: LaunchChunk, now: float) -> list[NodeBatch]:
        out: list[NodeBatch] = []
        key = (chunk.kernel, chunk.config_id)
        # A config switch closes the kernel's open batch of the old config.
        open_config = self._open.get(chunk.kernel)
        if open_config is not None and open_config != chunk.config_id:
            out.append(self._close((chunk.kernel, open_config)))
        start = 0
        total = len(chunk.t_end)
        while start < total:
            p = self._pending.get(key)
            if p is None:
                p = _Pending(chunk, seq_start=chunk.seq_start + start, opened_at=now)
                self._pending[key] = p
                self._open[chunk.kernel] = chunk.config_id
            take = min(total - start, self.max_launches - p.count)
            if take == total:  # the whole chunk: no slices
                p.t_end.append(chunk.t_end)
                p.duration_us.append(chunk.duration_us)
                p.ok.append(chunk.ok)
            else:
                p.t_end.append(chunk.t_end[start : start + take])
                p.duration_us.append(chunk.duration_us[start : start + take])
                p.ok.append(chunk.ok[start : start + take])
            if chunk.host_gap_us is not None or chunk.copies:
                _take_host(p, chunk, start, take)
            p.count += take
            start += take
            if p.count >= self.max_launches:
                out.append(self._close(key))
        return out

    def due(self, now: float) -> list[NodeBatch]:
        """Batches whose oldest launch has waited ``max_delay_s``."""
        keys = [k for k, p in self._pending.items() if now - p.opened_at >= self.max_delay_s]
        return [self._close(k) for k in keys]

    def flush(self) -> list[NodeBatch]:
        return [self._close(k) for k in list(self._pending)]

    def _close(self, key: tuple[str, str]) -> NodeBatch:
        p = self._pending.pop(key)
        del self._open[key[0]]
        samples, self._samples = self._samples, []
        return NodeBatch(
            self._template(p.chunk_meta),
            p.seq_start,
            np.round(_cat(p.t_end), _T_END_DECIMALS),
            np.round(_cat(p.duration_us), _DURATION_DECIMALS),
            _flags(_cat(p.ok)),
            samples,
            _host_fields(p),
        )

    def _template(self, c: LaunchChunk) -> BatchTemplate:
        """The per-batch fields of ``c``'s kernel in ``c``'s configuration, built and
        validated on the first batch. A device's launch plan for a configuration is fixed
        once launches of it ran: the GPU backends compile a configuration before its first
        launch and keep the module's plan (or, when it failed to compile, the estimate)."""
        key = (c.kernel, c.config_id)
        hit = self._templates.get(key)
        if hit is not None and hit[0] is c.workload:
            return hit[1]
        plan = self.device.plan(c.workload, c.config)
        spec = self.device.spec
        # A kernel without a cost model (a user kernel given no flops/bytes) has no place
        # on the roofline: its batches carry peaks of 0, as for a GPU of unknown peaks.
        placed = getattr(c.workload, "cost_model_known", True)
        template = BatchTemplate.of(
            {
                "node": self.node,
                "device_index": self.device.device_index,
                "device_model": spec.name,
                "backend": self.device.backend,
                "kernel": c.kernel,
                "workload": c.workload.name,
                "problem_size": list(c.workload.problem_size),
                "config": dict(c.config),
                "config_id": c.config_id,
                "grid": list(plan.grid),
                "block": list(plan.block),
                "dynamic_smem_bytes": plan.dynamic_smem_bytes,
                "registers_per_thread": plan.registers_per_thread,
                "bytes_moved": plan.bytes_moved,
                "flops": plan.flops,
                "occupancy": min(1.0, max(0.0, plan.occupancy)),
                "resources_source": plan.resources_source,
                "waves": plan.waves,
                "peak_gbs": spec.peak_gbs if placed else 0.0,
                "peak_gflops": spec.peak_gflops_fp32 if placed else 0.0,
                "launch_overhead_us": spec.launch_overhead_us,
            }
        )
        if len(self._templates) >= _TEMPLATES_MAX:
            self._templates.clear()
        self._templates[key] = (c.workload, template)
        return template


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _flags(ok: np.ndarray) -> np.ndarray:
    """The ok column as bytes 0 and 1, a copy (the batch owns its arrays); flags that are
    not 0 or 1 stay as they are, for the model to refuse (:meth:`NodeBatch.wire`)."""
    if ok.dtype != np.bool_ and not ((ok == 0) | (ok == 1)).all():
        return ok.astype(np.int64)
    return ok.astype(np.uint8)


def _take_host(p: _Pending, chunk: LaunchChunk, start: int, take: int) -> None:
    """Carry launches ``start:start+take`` of a chunk's host columns into a batch."""
    if chunk.host_gap_us is not None and chunk.host_waited is not None:
        p.host_gap_us.append(chunk.host_gap_us[start : start + take])
        p.host_waited.append(chunk.host_waited[start : start + take])
    if not chunk.copies:
        return
    # Copies go with the batch of the launch they served.
    pick = [i for i, j in enumerate(chunk.copies["launch"]) if start <= j < start + take]
    for name, column in chunk.copies.items():
        if name != "launch":
            p.copies.setdefault(name, []).extend(column[i] for i in pick)


def _host_fields(p: _Pending) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Gaps only when every launch of the batch has one (columns of equal length).
    if p.host_gap_us and sum(len(g) for g in p.host_gap_us) == p.count:
        out["host_gap_us"] = np.round(np.concatenate(p.host_gap_us), _DURATION_DECIMALS).tolist()
        out["host_waited"] = np.concatenate(p.host_waited).astype(int).tolist()
    if p.copies.get("t_end"):
        out["copies"] = CopyColumns(**p.copies)
    return out
