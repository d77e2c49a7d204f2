"""Resource usage of each built-in configuration, as the compiler reported it.

``kernels/cuda/resources.json.gz`` holds, for every configuration of every built-in
workload and for sm_80 and sm_90, the registers per thread, static shared memory, stack
frame and spill bytes NVRTC reported (:mod:`kernelstream.kernels.compile`). It is written by
``kernelstream kernels check --all --table kernels/cuda/resources.json.gz`` and records the
hash of each ``.cu`` it was compiled from: when a source changes, its entries no longer
match and :func:`compiled_resources` returns None (the workload's estimate is used) until
the table is written again; a unit test fails meanwhile.

Reading the table needs no compiler, so the ``sim`` device and the occupancy model use
the compiler's numbers on every machine, deterministically.

A user's kernel (:class:`kernelstream.TunableKernel`) has no table: its configurations are
compiled with NVRTC when first planned (on the node's thread, from the on-disk compile
cache after the first time) wherever NVRTC is installed; without it, or for a
configuration that does not compile, its estimate is used.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

from kernelstream.kernels.check import compile_workload
from kernelstream.kernels.compile import CompileResult
from kernelstream.kernels.errors import BackendUnavailableError
from kernelstream.kernels.space import ParamValue
from kernelstream.kernels.workloads.base import Workload
from kernelstream.kernels.workloads.user import UserWorkload

__all__ = [
    "TABLE_PATH",
    "Resources",
    "compiled_resources",
    "load_table",
    "source_sha256",
    "table_document",
]

TABLE_PATH = Path(__file__).resolve().parent / "cuda" / "resources.json.gz"
_TABLE_VERSION = 1
_FIELDS = ("registers", "static_smem_bytes", "local_bytes", "spill_store_bytes", "spill_load_bytes")


@dataclass(frozen=True)
class Resources:
    """Per-thread and per-block resources of one compiled configuration.

    ``source`` says where the numbers came from, e.g. ``"nvrtc 12.9 sm_90"``.
    """

    registers: int
    static_smem_bytes: int
    local_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    source: str

    @property
    def spills(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @classmethod
    def from_compile(cls, result: CompileResult) -> Resources | None:
        """The resources of a successful compile, None for a failed one."""
        if not result.ok or result.registers is None:
            return None
        return cls(
            registers=result.registers,
            static_smem_bytes=result.static_smem_bytes or 0,
            local_bytes=result.local_bytes or 0,
            spill_store_bytes=result.spill_store_bytes or 0,
            spill_load_bytes=result.spill_load_bytes or 0,
            source=f"{result.compiler} {result.arch}",
        )


def source_sha256(path: Path) -> str:
    """Hex SHA-256 of a source file's bytes (what a table entry was compiled from)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def table_document(
    rows: Iterable[tuple[Workload, str, Mapping[str, ParamValue], CompileResult]],
) -> dict[str, Any]:
    """The table for ``(workload, arch, config, result)`` rows (a failed compile is null)."""
    doc: dict[str, Any] = {"version": _TABLE_VERSION, "workloads": {}}
    for workload, arch, config, result in rows:
        if workload.source is None:
            continue
        per_arch = (
            doc["workloads"]
            .setdefault(workload.name, {})
            .setdefault(
                arch,
                {
                    "source_sha256": source_sha256(workload.source),
                    "compiler": result.compiler,
                    "configs": {},
                },
            )
        )
        values = [getattr(result, f) for f in _FIELDS] if result.ok else None
        per_arch["configs"][workload.space.config_id(config)] = values
    return doc


@cache
def load_table(path: Path = TABLE_PATH) -> dict[str, Any]:
    """The table at ``path`` (empty when missing or unreadable: estimates are used)."""
    try:
        doc = orjson.loads(gzip.decompress(path.read_bytes()))
    except (OSError, EOFError, orjson.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) and doc.get("version") == _TABLE_VERSION else {}


@cache
def _current_sha(path: Path) -> str:
    return source_sha256(path)


def compiled_resources(
    workload: Workload, config: Mapping[str, ParamValue], arch: str, *, table: Path = TABLE_PATH
) -> Resources | None:
    """The compiler's resources of ``config`` for ``arch`` from the table; None when the
    table has no entry, the entry is of an older source, or the configuration failed to
    compile there. A user's kernel is compiled instead (None without NVRTC).

    >>> from kernelstream.kernels import get_workload
    >>> w = get_workload("transpose")
    >>> r = compiled_resources(w, w.default, "sm_90")
    >>> r.source.startswith("nvrtc"), r.registers > 0
    (True, True)
    """
    if isinstance(workload, UserWorkload):
        return _user_resources(workload, config, arch)
    if workload.source is None:
        return None
    entry = load_table(table).get("workloads", {}).get(workload.name, {}).get(arch)
    if not entry or entry.get("source_sha256") != _current_sha(workload.source):
        return None
    values = entry["configs"].get(workload.space.config_id(config))
    if values is None:
        return None
    regs, smem, local, stores, loads = (int(v) for v in values)
    return Resources(regs, smem, local, stores, loads, source=f"{entry['compiler']} {arch}")


# A user kernel's compiled resources, per (config id, arch), for as long as the kernel lives:
# a node plans every batch it sends, and a compile (even from the disk cache) is not free.
_USER: weakref.WeakKeyDictionary[UserWorkload, dict[tuple[str, str], Resources | None]] = (
    weakref.WeakKeyDictionary()
)
_USER_LOCK = threading.Lock()


def _user_resources(
    workload: UserWorkload, config: Mapping[str, ParamValue], arch: str
) -> Resources | None:
    key = (workload.space.config_id(config), arch)
    with _USER_LOCK:
        known = _USER.setdefault(workload, {})
        if key in known:
            return known[key]
    try:
        found = Resources.from_compile(compile_workload(workload, config, arch))
    except BackendUnavailableError:
        found = None  # no NVRTC here: the estimate, as for a built-in missing from the table
    with _USER_LOCK:
        known[key] = found
    return found
