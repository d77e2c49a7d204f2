"""Compile workloads' configurations for GPU architectures and report their resources.

The logic behind ``kernelstream kernels check`` and :meth:`TunableKernel.check
<kernelstream.kernels.tunable.TunableKernel.check>`: for each workload (a built-in one or a
user's kernel) and architecture, the default configuration and a spread sample of the space
(or every configuration) are compiled with NVRTC
(:func:`kernelstream.kernels.compile.compile_config`); each row carries the compile status
and log, registers, shared memory, spills and the theoretical occupancy on a device of that
architecture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelstream.kernels.compile import CompileResult, compile_config
from kernelstream.kernels.devices import DEVICE_SPECS, DeviceSpec, theoretical_occupancy
from kernelstream.kernels.space import Config, ParamValue
from kernelstream.kernels.workloads.base import CudaWorkload
from kernelstream.kernels.workloads.user import UserWorkload

__all__ = [
    "CheckRow",
    "Checkable",
    "check_workloads",
    "compile_workload",
    "device_for_arch",
    "report_document",
    "sample_configs",
]

#: What can be compile-checked: a built-in workload or a user's kernel.
Checkable = CudaWorkload | UserWorkload


@dataclass(frozen=True)
class CheckRow:
    """One configuration compiled for one architecture."""

    workload: Checkable
    arch: str
    config: Config
    result: CompileResult
    device: str
    occupancy: float | None

    @property
    def config_id(self) -> str:
        return self.workload.space.config_id(self.config)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able row: the compile result plus workload, config and occupancy."""
        return {
            "workload": self.workload.name,
            "arch": self.arch,
            "config_id": self.config_id,
            "config": dict(self.config),
            "device": self.device,
            "occupancy": self.occupancy,
            **self.result.to_dict(),
        }


def device_for_arch(arch: str) -> DeviceSpec | None:
    """The first known GPU model of ``arch``'s compute capability (sm_90: an H100)."""
    for spec in DEVICE_SPECS.values():
        if f"sm_{spec.compute_capability[0]}{spec.compute_capability[1]}" == arch:
            return spec
    return None


def sample_configs(workload: Checkable, n: int) -> list[Config]:
    """The default and ``n - 1`` configurations spread evenly over the space's order.

    >>> from kernelstream.kernels import get_workload
    >>> w = get_workload("transpose")
    >>> s = sample_configs(w, 4)
    >>> len(s), s[0] == w.default
    (4, True)
    """
    every = list(workload.space)
    last = len(every) - 1
    picks = [every[i * last // (n - 1)] for i in range(1, n)] if n > 1 else []
    out = [workload.default]
    for c in picks:
        if c not in out:
            out.append(c)
    return out


def compile_workload(
    workload: Checkable,
    config: Mapping[str, ParamValue],
    arch: str,
    *,
    cache_dir: Path | None = None,
) -> CompileResult:
    """Compile one configuration of ``workload`` for ``arch`` with its ``-D`` defines.

    A user's kernel is compiled from the code it was made with (what its device compiles,
    even if its file changed since), a built-in one from its ``.cu`` file.
    """
    source = workload.code if isinstance(workload, UserWorkload) else workload.source
    defines = workload.defines(config)
    return compile_config(source, workload.kernel_name, defines, arch, cache_dir=cache_dir)


def _occupancy(
    spec: DeviceSpec | None, w: Checkable, config: Config, r: CompileResult
) -> float | None:
    if spec is None or not r.ok or r.registers is None:
        return None
    geo = w.geometry(config)
    smem = geo.dynamic_smem_bytes + (r.static_smem_bytes or 0)
    return theoretical_occupancy(spec, geo.threads_per_block, r.registers, smem)[0]


def check_workloads(
    workloads: Iterable[Checkable],
    archs: Sequence[str],
    *,
    sample: int = 8,
    every: bool = False,
    cache_dir: Path | None = None,
    progress: Callable[[CheckRow], None] | None = None,
) -> list[CheckRow]:
    """Compile the sampled (or ``every``) configurations of each workload for each arch.

    Compile errors are rows with ``result.ok`` False and the compiler log; raises
    :class:`~kernelstream.kernels.errors.BackendUnavailableError` without NVRTC.
    """
    rows: list[CheckRow] = []
    for w in workloads:
        configs = list(w.space) if every else sample_configs(w, sample)
        for arch in archs:
            spec = device_for_arch(arch)
            for config in configs:
                r = compile_workload(w, config, arch, cache_dir=cache_dir)
                row = CheckRow(
                    w, arch, config, r, spec.name if spec else "", _occupancy(spec, w, config, r)
                )
                rows.append(row)
                if progress is not None:
                    progress(row)
    return rows


def report_document(rows: Sequence[CheckRow]) -> dict[str, Any]:
    """The ``--json`` document: counts and every row."""
    failed = [r for r in rows if not r.result.ok]
    compilers = sorted({r.result.compiler for r in rows})
    return {
        "compiler": compilers[0] if len(compilers) == 1 else compilers,
        "compiled": len(rows),
        "failed": len(failed),
        "rows": [r.to_dict() for r in rows],
    }
