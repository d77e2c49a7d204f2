"""Trace-driven device: durations drawn from measured Kernel Tuner cache files.

A cache file (``.json`` or ``.json.gz``) holds every configuration of one kernel
measured on one GPU. :func:`load_cache` turns it into a :class:`TraceSpace`, a
workload whose points are the configurations the file holds (its constraints are
taken from the entries, as Kernel Tuner's simulation mode takes them).
Launching a configuration draws durations (seeded) from its measured ``times``;
a configuration that failed when measured (a string ``time``, or the ``1e20`` that
Kernel Tuner's sequential runner wrote before the strings) or was never measured fails to
launch. A cache that Kernel Tuner left open (a session still
running or stopped before its end) reads as Kernel Tuner reads it; its problem size
may be one int (a 1-D kernel) or a list.

A cache whose ``kernel_name`` is a built-in workload with the same parameters
(a ``kernelstream sweep`` file) takes that workload's default, launch geometry
and cost model, so a trace device built from a sweep reports the same bytes,
FLOPs and occupancy as the workload itself.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import warnings
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kernelstream.kernels.backends.base import LaunchPlan, LaunchResult, make_plan, well_formed
from kernelstream.kernels.devices import DeviceSpec, device_spec_for_name
from kernelstream.kernels.errors import TraceFileError, UnknownDeviceError
from kernelstream.kernels.space import Config, ParamValue, SearchSpace
from kernelstream.kernels.workloads import WORKLOAD_NAMES, CudaWorkload, get_workload
from kernelstream.kernels.workloads.base import Geometry, Traits, Workload
from kernelstream.schemas.records import MAX_DURATION_US

__all__ = [
    "LaunchNoise",
    "TraceDevice",
    "TraceSpace",
    "cache_files_in",
    "cache_kernel_name",
    "default_tuning_spaces_dir",
    "is_measured_time",
    "load_cache",
    "load_caches_in",
    "read_cache_document",
]

_ENV_DIR = "KERNELSTREAM_TUNING_SPACES_DIR"  # the settings field tuning_spaces_dir
_ENV_DIR_OLD = "KERNELSTREAM_TUNING_SPACES"  # read before; still accepted, with a warning

log = logging.getLogger("kernelstream.trace")

_UNKNOWN_WARNED: set[str] = set()


# Kernel Tuner's sequential runner stored ``time: 1e20`` for a configuration that failed
# to compile or run, in releases before its caches marked failures with a string such as
# "RuntimeFailedConfig" (kernel_tuner/runners/sequential.py, ``params.update({"time": 1e20})``).
KT_OLD_FAILURE_TIME = 1e20
# The longest launch a measurement may report, in ms: the bound of a launch batch's
# durations (an hour).
MAX_MEASURED_MS = MAX_DURATION_US / 1000.0
_NO_MEASURED_TIME = "no configuration has a measured time (ms, from 0 to an hour)"


def is_measured_time(t: Any) -> bool:
    """A cache entry's ``time`` (ms) is a measurement: a number from 0 to an hour. A
    negative, non-finite or longer one is not (Kernel Tuner's old failure marker, 1e20,
    is 3,000 years)."""
    return isinstance(t, (int, float)) and not isinstance(t, bool) and 0.0 <= t <= MAX_MEASURED_MS


def default_tuning_spaces_dir() -> Path:
    """``$KERNELSTREAM_TUNING_SPACES_DIR``, else ``<repo>/../shared/data/tuning-spaces``.

    The older name ``KERNELSTREAM_TUNING_SPACES`` is still read when the new one is
    not set, with a ``FutureWarning`` (a deprecation shown to users by default).
    """
    env = os.environ.get(_ENV_DIR)
    if env:
        return Path(env)
    old = os.environ.get(_ENV_DIR_OLD)
    if old:
        warnings.warn(
            f"{_ENV_DIR_OLD} is deprecated: set {_ENV_DIR} instead",
            FutureWarning,
            stacklevel=2,
        )
        return Path(old)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data" / "tuning-spaces"


def cache_files_in(directory: str | Path | None) -> list[Path]:
    """The Kernel Tuner cache files of a folder (``*.json``, ``*.json.gz``), by name;
    T1 files (``*.T1.json``) and declared-space files (``*.space.json``), descriptions of
    a space, not measurements, are not."""
    if directory is None or not Path(directory).is_dir():
        return []
    return sorted(
        p
        for p in Path(directory).iterdir()
        if p.name.endswith((".json", ".json.gz"))
        and not p.name.endswith((".T1.json", ".space.json"))
    )


def _read_json(path: Path) -> Any:
    """The document of a cache file: orjson where it parses it (a third of the time of
    ``json`` on the measured spaces, the same objects), else ``json``, which also takes
    the NaN and Infinity that Kernel Tuner's ``json.dumps`` may write, and what an open
    cache needs (:func:`_open_cache`)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                data = fh.read()
        else:
            data = path.read_bytes()
    except (OSError, ValueError, EOFError) as ex:
        raise TraceFileError(f"cannot read Kernel Tuner cache {path}: {ex}") from ex
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        text = data.decode("utf-8")
    except ValueError as ex:
        raise TraceFileError(f"cannot read Kernel Tuner cache {path}: {ex}") from ex
    try:
        return json.loads(text)
    except ValueError as ex:
        doc = _open_cache(text, path)
        if doc is None:
            raise TraceFileError(f"cannot read Kernel Tuner cache {path}: {ex}") from ex
        return doc


# Where an open cache's entries begin: the header's last key (Kernel Tuner writes the
# header with ``json.dumps(..., indent="")``, so the key and its brace share a line).
_OPEN_CACHE = re.compile(r'"cache"\s*:\s*\{')


def _open_cache(text: str, path: Path) -> dict[str, Any] | None:
    """An *open* Kernel Tuner cache file as Kernel Tuner reads it, or None if not one.

    Kernel Tuner writes a cache as it tunes: the header up to ``"cache": {``, then one
    line per measured configuration, ``"key": {...},``, and closes the document only
    when the session ends. A session that was stopped (a job's time ran out, a crash)
    or is still running leaves the file open, and Kernel Tuner's documentation says
    such a file works as if closed (its ``correct_open_cache`` drops the trailing comma
    and adds the two closing braces). Here too; and a last line cut off in the middle
    of its write is left out (with a warning) instead of making the whole file unreadable.
    """
    head = _OPEN_CACHE.search(text)
    if head is None:
        return None
    try:
        doc = json.loads(text[: head.start()] + '"cache": {}}')
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    entries = text[head.end() :].strip()
    if entries.endswith(("}}", "}\n}")):
        return None  # closed, so malformed elsewhere: let the caller report json's error
    lines = [ln for ln in entries.splitlines() if ln.strip()]
    for keep in (len(lines), len(lines) - 1):
        body = "\n".join(lines[:keep]).rstrip().rstrip(",")
        try:
            cache = json.loads("{" + body + "}")
        except ValueError:
            continue
        if keep < len(lines):
            log.warning(
                "%s: open Kernel Tuner cache whose last line was cut off mid-write; "
                "read without it: %.80s",
                path,
                lines[-1],
            )
        doc["cache"] = cache
        return doc
    return None


def _t1_default(directory: Path, kernel_name: str, params: Sequence[str]) -> dict[str, Any] | None:
    """``Default`` values from a T1 file next to the cache describing the same kernel."""
    for t1 in sorted(directory.glob("*.T1.json")):
        try:
            doc = json.loads(t1.read_text(encoding="utf-8"))
            if doc["KernelSpecification"]["KernelName"] != kernel_name:
                continue
            tps = doc["ConfigurationSpace"]["TuningParameters"]
            default = {tp["Name"]: tp["Default"] for tp in tps}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if set(default) == set(params):
            return default
    return None


def _prod(xs: Sequence[int]) -> int:
    return math.prod(int(x) for x in xs)


def _problem_size(raw: Any, path: Path) -> tuple[int, ...]:
    """The cache's ``problem_size`` as a tuple of 1 to 3 positive ints.

    Kernel Tuner stores the problem size as it was given to ``tune_kernel``: one int
    (a 1-D kernel), a list of ints, or, when the size depends on the configuration,
    strings (expressions of tunable parameters) or ``"callable"``. Measurements are
    grouped by one problem size per workload, so the last two cannot be replayed.
    """
    items = raw if isinstance(raw, list) else [raw]
    size: list[int] = []
    for x in items:
        if isinstance(x, str) and x.strip().isdigit():
            x = int(x)
        if isinstance(x, float) and x.is_integer():
            x = int(x)
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            break
        size.append(x)
    if len(size) != len(items) or not 1 <= len(size) <= 3:
        raise TraceFileError(
            f"{path}: problem_size {raw!r} is not 1 to 3 positive integers: a size that "
            "depends on the configuration (Kernel Tuner writes expressions of tunable "
            "parameters or 'callable') cannot be replayed, because measurements are "
            "grouped by one fixed problem size"
        )
    return tuple(size)


def _what_else(doc: Mapping[str, Any], ex: Exception) -> str:
    """What a JSON document that is not a Kernel Tuner cache looks like, for the error."""
    if "schema_version" in doc and "results" in doc:
        # Kernel Tuner's ``store_output_file`` (and the autotuning methodology's T4
        # format) keeps results without the search space or the device: the cache file
        # written beside it (``tune_kernel(cache=...)``) holds both.
        return "a T4 results file; give the Kernel Tuner cache file of the same run"
    if "schema_version" in doc and "environment" in doc:
        return "a T4 metadata file; give the Kernel Tuner cache file of the same run"
    return f"missing or malformed {ex!r}"


def _device_name(raw: Any, path: Path) -> str:
    """The cache's ``device_name``, or a name made from the file's when it has none.

    Some real caches store an empty ``device_name`` (or null). Every launch record
    names its device model, so an empty one would fail each record's validation; the
    file name keeps two unnamed GPUs apart instead of pooling their measurements.
    """
    name = str(raw).strip() if isinstance(raw, (str, int, float)) else ""
    return name[:200] if name else f"unknown GPU ({path.name})"[:200]


class TraceSpace:
    """A measured search space, usable wherever a :class:`Workload` is.

    ``start_note`` says where the starting configuration came from (and why it is
    not the declared default when that default is invalid).
    """

    source: Path | None = None

    def __init__(self, path: Path, doc: Mapping[str, Any]) -> None:
        try:
            self.kernel_name: str = str(doc["kernel_name"])
            self.device_name: str = _device_name(doc["device_name"], path)
            self.problem_size: tuple[int, ...] = _problem_size(doc["problem_size"], path)
            keys: list[str] = list(doc["tune_params_keys"])
            tune_params: dict[str, list[ParamValue]] = {
                k: list(doc["tune_params"][k]) for k in keys
            }
            cache: Mapping[str, Mapping[str, Any]] = doc["cache"]
        except (KeyError, TypeError, ValueError) as ex:
            raise TraceFileError(
                f"{path}: not a Kernel Tuner cache file ({_what_else(doc, ex)})"
            ) from ex
        self.name = self.kernel_name
        self.path = path
        self.builtin: CudaWorkload | None = _builtin(self.kernel_name, keys, self.problem_size)
        self.times_us: dict[str, np.ndarray] = {}
        self.failed: dict[str, str] = {}
        first_valid: Config | None = None
        probe = SearchSpace(
            self.name, tune_params, default={k: v[0] for k, v in tune_params.items()}
        )
        for rec in cache.values():
            config = {k: rec[k] for k in keys}
            cid = probe.config_id(config)
            t = rec.get("time")
            times = rec.get("times")
            if is_measured_time(t):
                # The runs' times when every one is a measurement, else their mean.
                runs = isinstance(times, list) and times and all(map(is_measured_time, times))
                values = times if runs else [t]
                self.times_us[cid] = np.asarray(values, dtype=np.float64) * 1000.0
                first_valid = first_valid or config
            elif isinstance(t, (int, float)) and t == KT_OLD_FAILURE_TIME:
                self.failed[cid] = "time 1e20, Kernel Tuner's old failure marker"
            elif isinstance(t, (int, float)) and not isinstance(t, bool):
                self.failed[cid] = f"time {t} ms is not a measurement (negative or over an hour)"
            else:
                self.failed[cid] = str(t)
        declared = _t1_default(path.parent, self.kernel_name, keys)
        origin = "the T1 file's Default"
        if self.builtin is not None:
            declared, origin = self.builtin.default, f"the built-in {self.name!r} default"
        if declared is None:
            if first_valid is None:
                raise TraceFileError(f"{path}: {_NO_MEASURED_TIME}")
            declared, origin = dict(first_valid), "the first valid cache entry (no T1 file)"
        # The space is every configuration the cache holds, the ones that failed when
        # measured included (as Kernel Tuner's own simulation mode has it): a tuner
        # learns that they fail by launching them, not from the table.
        self._space = SearchSpace(
            self.name,
            tune_params,
            default=declared,
            allowed=frozenset(self.times_us) | frozenset(self.failed),
        )
        self._default = self._start(declared, [{k: r[k] for k in keys} for r in cache.values()])
        problems = self._space.violations(declared)
        if not problems and self._space.config_id(declared) in self.failed:
            problems = [f"it failed when measured ({self.failed[self._space.config_id(declared)]})"]
        if not problems:
            self.start_note = f"starting from {origin}"
        else:
            self.start_note = (
                f"default from {origin} is not valid "
                f"({'; '.join(problems)}); starting from the valid measured "
                f"configuration closest to it: {self._space.config_id(self._default)}"
            )

    def _start(self, declared: Mapping[str, ParamValue], entries: list[Config]) -> Config:
        """The declared default when it was measured fine, else the measured-fine config
        differing from it in the fewest parameters (ties: first in cache-key order)."""
        if self._space.is_valid(declared) and self._space.config_id(declared) in self.times_us:
            return dict(declared)
        best: Config | None = None
        best_diff = len(self._space.names) + 1
        for config in entries:
            if self._space.config_id(config) not in self.times_us:
                continue
            diff = sum(config[p] != declared.get(p) for p in self._space.names)
            if diff < best_diff:
                best, best_diff = dict(config), diff
        if best is None:
            raise TraceFileError(f"{self.path}: {_NO_MEASURED_TIME}")
        return best

    def __repr__(self) -> str:
        return f"TraceSpace({self.kernel_name!r}, {self.device_name!r}, {self.path.name!r})"

    @property
    def space(self) -> SearchSpace:
        return self._space

    @property
    def default(self) -> Config:
        return dict(self._default)

    def _kind(self) -> str:
        """``convolution`` or ``dedispersion`` (the kernels whose bytes and FLOPs are
        modelled; both need a 2-D problem size), else ``""``."""
        kind = self.kernel_name.split("_")[0]
        if kind in ("convolution", "dedispersion") and len(self.problem_size) >= 2:
            return kind
        return ""

    def _p(self, config: Mapping[str, ParamValue], name: str, fallback: int = 1) -> int:
        return int(config.get(name, fallback))

    def flops(self, config: Mapping[str, ParamValue]) -> float:
        """Convolution: ``2 W H fw fh``. Dedispersion: one add per (sample, DM, channel),
        ``samples * DMs * 1536`` (1536 channels: the count the benchmark's own ``GB/s``
        column implies). Other kernels, or a 1-D problem size: 0."""
        if self.builtin is not None:
            return self.builtin.flops(config)
        kind = self._kind()
        if kind == "convolution":
            w, h = self.problem_size[:2]
            fw, fh = self._p(config, "filter_width", 15), self._p(config, "filter_height", 15)
            return 2.0 * w * h * fw * fh
        if kind == "dedispersion":
            return float(_prod(self.problem_size)) * _DEDISP_CHANNELS
        return 0.0

    def bytes_moved(self, config: Mapping[str, ParamValue]) -> float:
        """Convolution: input (with filter halo) + output + filter floats, each once.
        Dedispersion: float32 output ``4 * samples * DMs`` plus the 8-bit input
        ``samples * 1536`` channels read once from DRAM (the per-DM re-reads that the
        benchmark's own ``GB/s`` column counts are served by caches; counting them
        would exceed the A4000's DRAM peak). Other kernels, or a 1-D problem size: 0."""
        if self.builtin is not None:
            return self.builtin.bytes_moved(config)
        kind = self._kind()
        if kind == "convolution":
            w, h = self.problem_size[:2]
            fw, fh = self._p(config, "filter_width", 15), self._p(config, "filter_height", 15)
            return 4.0 * ((w + fw - 1) * (h + fh - 1) + w * h + fw * fh)
        if kind == "dedispersion":
            samples, dms = self.problem_size[0], self.problem_size[1]
            return 4.0 * samples * dms + float(samples) * _DEDISP_CHANNELS
        return 0.0

    def geometry(self, config: Mapping[str, ParamValue]) -> Geometry:
        """Block from ``block_size_x/y/z``; grid = problem size / (block * tile) per axis."""
        if self.builtin is not None:
            return self.builtin.geometry(config)
        block = (
            self._p(config, "block_size_x"),
            self._p(config, "block_size_y"),
            self._p(config, "block_size_z"),
        )
        tiles = (self._p(config, "tile_size_x"), self._p(config, "tile_size_y"), 1)
        size = (*self.problem_size, 1, 1)[:3]
        grid = (
            max(1, math.ceil(size[0] / (block[0] * tiles[0]))),
            max(1, math.ceil(size[1] / (block[1] * tiles[1]))),
            max(1, math.ceil(size[2] / block[2])),
        )
        return Geometry(grid, block, 0, None)

    def traits(self, config: Mapping[str, ParamValue]) -> Traits:
        if self.builtin is not None:
            return self.builtin.traits(config)
        smem = 0
        if self.kernel_name.startswith("convolution") and self._p(config, "use_shmem", 0):
            fw, fh = self._p(config, "filter_width", 15), self._p(config, "filter_height", 15)
            bx = self._p(config, "block_size_x") * self._p(config, "tile_size_x")
            by = self._p(config, "block_size_y") * self._p(config, "tile_size_y")
            smem = 4 * (bx + fw - 1) * (by + fh - 1)
        return Traits(static_smem_bytes=smem)


def _builtin(name: str, keys: Sequence[str], size: tuple[int, ...]) -> CudaWorkload | None:
    """The built-in workload a cache was swept from (same name and parameters), or None."""
    if name not in WORKLOAD_NAMES:
        return None
    try:
        w = get_workload(name, size)
    except ValueError:  # a problem size of another shape: not ours
        return None
    return w if list(w.space.params) == list(keys) else None


# Input channels of the dedispersion benchmark, inferred from its GB/s column:
# GB/s * time / (samples * DMs) = 1536 for every entry of the cache files.
_DEDISP_CHANNELS = 1536


def read_cache_document(path: str | Path) -> Any:
    """The parsed JSON of a Kernel Tuner cache file (``.json`` or ``.json.gz``)."""
    return _read_json(Path(path))


# A cache header's kernel name, before its entries begin (Kernel Tuner writes the header's
# fields first, ``"cache"`` last); a name with an escape is left to the full read.
_HEADER_KERNEL = re.compile(rb'"kernel_name"\s*:\s*"([^"\\]*)"')
_HEADER_BYTES = 1 << 16


def cache_kernel_name(path: str | Path) -> str | None:
    """The kernel a cache file's header names, read from its first 64 KiB only; None
    when that is not plainly there (the full read then decides).

    For choosing which of a folder's caches to load: loading one parses every measured
    configuration (0.1-0.5 s for each of the measured spaces on a 2-core machine).
    """
    p = Path(path)
    try:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rb") as fh:
                head = fh.read(_HEADER_BYTES)
        else:
            with p.open("rb") as fh:
                head = fh.read(_HEADER_BYTES)
    except (OSError, ValueError, EOFError):
        return None
    entries = head.find(b'"cache"')
    if entries < 0:
        return None
    found = _HEADER_KERNEL.search(head, 0, entries)
    if found is None:
        return None
    try:
        return found.group(1).decode("utf-8")
    except ValueError:
        return None


def load_cache(path: str | Path) -> TraceSpace:
    """Load a Kernel Tuner cache file (``.json`` or ``.json.gz``) as a :class:`TraceSpace`."""
    p = Path(path)
    if not p.is_file():
        raise TraceFileError(f"Kernel Tuner cache {p} does not exist")
    doc = _read_json(p)
    if not isinstance(doc, dict):
        raise TraceFileError(f"{p}: top level is not a JSON object")
    return TraceSpace(p, doc)


def load_caches_in(directory: str | Path | None) -> tuple[list[TraceSpace], dict[Path, str]]:
    """Every readable Kernel Tuner cache file of a folder, and why each other one was not.

    A folder of measured spaces often holds other JSON beside the caches (the autotuning
    benchmark hub ships a T4 results file and metadata next to each cache; a cache may be
    cut short). Those are skipped, each with its reason logged and returned, instead of
    one of them stopping everything; the caller decides whether none readable is an error.
    """
    spaces: list[TraceSpace] = []
    skipped: dict[Path, str] = {}
    for path in cache_files_in(directory):
        try:
            spaces.append(load_cache(path))
        except TraceFileError as ex:
            skipped[path] = str(ex)
            log.warning("skipped (not read as a Kernel Tuner cache): %s", ex)
    return spaces, skipped


class LaunchNoise:
    """Where a trace device's launch durations come from: one stream per configuration.

    The k-th launch of a configuration is the k-th draw of a stream seeded by
    (``seed``, kernel, configuration), whatever was launched before it, in whichever
    calls. Trace devices that share one :class:`LaunchNoise` (the nodes of one
    simulated fleet) draw from the same streams: two runs of the same seed, one node or
    four, see the same durations for the same launches of a configuration (common random
    numbers), so a paired comparison of the two measures the tuner, not the draws. Each
    draw is still an independent, uniform pick of one of the configuration's measured
    times.
    """

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._rngs: dict[tuple[str, str], np.random.Generator] = {}

    def draw(self, kernel: str, config_id: str, times: np.ndarray, n: int) -> np.ndarray:
        """The next ``n`` durations of ``config_id`` (of ``kernel``), from its ``times``."""
        key = (kernel, config_id)
        rng = self._rngs.get(key)
        if rng is None:
            words = [self.seed, zlib.crc32(kernel.encode()), zlib.crc32(config_id.encode())]
            rng = self._rngs[key] = np.random.default_rng(np.random.SeedSequence(words))
        return rng.choice(times, size=max(n, 0))

    def clear(self) -> None:
        """Forget every stream (a later draw starts its configuration's stream again)."""
        self._rngs.clear()


class TraceDevice:
    """A device replaying one or more cache files measured on the same GPU model.

    Launch durations come from ``noise`` when given (shared by the nodes of one
    simulated fleet, see :class:`LaunchNoise`), else from a source of its own seeded by
    ``seed``.
    """

    backend = "trace"

    def __init__(
        self,
        trace_files: str | Path | Sequence[str | Path],
        *,
        device_index: int = 0,
        seed: int = 0,
        noise: LaunchNoise | None = None,
    ) -> None:
        files = [trace_files] if isinstance(trace_files, (str, Path)) else list(trace_files)
        if not files:
            raise TraceFileError("trace device needs at least one cache file")
        self._spaces = [load_cache(f) for f in files]
        names = {s.device_name for s in self._spaces}
        if len(names) != 1:
            raise TraceFileError(f"trace files were measured on different GPUs: {sorted(names)}")
        name = names.pop()
        try:
            self.spec: DeviceSpec = device_spec_for_name(name)
        except UnknownDeviceError:
            # Durations are all a trace replays; without a datasheet the roofline is
            # unknown, and telemetry and findings say so (DeviceSpec.unknown).
            if name not in _UNKNOWN_WARNED:  # once per process, not once per node
                _UNKNOWN_WARNED.add(name)
                log.warning(
                    "trace device: GPU %r is not in kernels/devices.py; its durations "
                    "replay, but without peaks its windows are not placed on a roofline",
                    name,
                )
            self.spec = DeviceSpec.unknown(name)
        self.device_index = device_index
        self._owns_noise = noise is None
        self._noise = LaunchNoise(seed) if noise is None else noise

    def workloads(self) -> list[Workload]:
        return list(self._spaces)

    def plan(self, workload: Workload, config: Mapping[str, ParamValue]) -> LaunchPlan:
        return make_plan(self.spec, workload, well_formed(workload.space, config))

    def _times(self, workload: Workload, config: Mapping[str, ParamValue]) -> np.ndarray | None:
        if not isinstance(workload, TraceSpace) or workload.space.violations(config):
            return None
        return workload.times_us.get(workload.space.config_id(config))

    def launch(self, workload: Workload, config: Mapping[str, ParamValue], n: int) -> LaunchResult:
        times = self._times(workload, config)
        if times is None:
            return LaunchResult.failed(max(n, 0))
        durations = self._noise.draw(workload.name, workload.space.config_id(config), times, n)
        return LaunchResult(durations, np.ones(max(n, 0), dtype=bool))

    def sample(self) -> dict[str, float] | None:
        return None  # cache files carry no device samples

    def close(self) -> None:
        if self._owns_noise:  # a shared source is the fleet's, not this node's, to reset
            self._noise.clear()
