"""Compile a CUDA kernel with NVRTC and read its real resource usage, without a GPU.

NVRTC is the runtime compiler CuPy's ``RawKernel``/``RawModule`` call, so a configuration
that compiles here compiles the same way on a GPU node. It comes from PyPI
(``nvidia-cuda-nvrtc-cu12``, reached through NVIDIA's ``cuda-bindings``; the ``compile``
extra) and needs neither a device nor a system CUDA toolkit. Compiling straight to a cubin
for one architecture with ``--ptxas-options=-v`` makes NVRTC report, per kernel, the
registers per thread, static shared memory, stack frame (local memory) and spill bytes;
:func:`compile_config` parses that report.

Results are cached on disk, one JSON file per (source hash, kernel, arch, defines, options,
compiler version), so a second ``kernelstream kernels check`` or a sim run reads them back
instead of compiling again.

>>> r = compile_config(                                        # doctest: +SKIP
...     "extern \\"C\\" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }",
...     "k", {}, "sm_90")
>>> r.ok, r.registers                                          # doctest: +SKIP
(True, 8)
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from kernelstream.kernels.errors import BackendUnavailableError

__all__ = [
    "DEFAULT_OPTIONS",
    "CompileResult",
    "arch_for",
    "check_arch",
    "compile_config",
    "compiler_version",
    "default_cache_dir",
    "parse_ptxas_info",
]

# The options the cupy backend hands RawModule (kernels/backends/cupy.py), so what is
# compiled here is what runs there.
DEFAULT_OPTIONS: tuple[str, ...] = ("-std=c++14",)
_INSTALL_HINT = (
    "NVRTC is not installed: pip install 'kernelstream[compile]' "
    "(cuda-bindings and nvidia-cuda-nvrtc-cu12 from PyPI; no GPU needed)"
)
_ARCH = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")
_CACHE_VERSION = 1
# ptxas -v, as NVRTC relays it: "Function properties for NAME", then
# "N bytes stack frame, N bytes spill stores, N bytes spill loads", then
# "Used N registers, ... N bytes smem, ...".
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FUNC = re.compile(r"Function properties for (\S+)")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class CompileResult:
    """One kernel compiled for one architecture and configuration.

    ``ok`` is False when the compiler rejected the source (``log`` says why) or the kernel
    is not in the compiled module. The resource fields are None unless ``ok``.
    ``local_bytes`` is the stack frame per thread (local memory, spills included).
    """

    kernel_name: str
    arch: str
    ok: bool
    log: str
    registers: int | None = None
    static_smem_bytes: int | None = None
    local_bytes: int | None = None
    spill_store_bytes: int | None = None
    spill_load_bytes: int | None = None
    compiler: str = ""
    cached: bool = False

    @property
    def spills(self) -> int | None:
        """Spill stores plus spill loads in bytes per thread (None unless ``ok``)."""
        if self.spill_store_bytes is None or self.spill_load_bytes is None:
            return None
        return self.spill_store_bytes + self.spill_load_bytes

    def to_dict(self) -> dict[str, Any]:
        """JSON-able fields (``cached`` left out: it describes this read, not the result)."""
        out = asdict(self)
        out.pop("cached")
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompileResult:
        """The inverse of :meth:`to_dict`."""
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "cached"}
        return cls(**fields)


def arch_for(compute_capability: tuple[int, int]) -> str:
    """The NVRTC architecture of a compute capability.

    >>> arch_for((9, 0))
    'sm_90'
    """
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def check_arch(arch: str) -> str:
    """``arch`` when it names an NVRTC architecture (``sm_80``...), else ``ValueError``."""
    if not isinstance(arch, str) or not _ARCH.match(arch):
        raise ValueError(f"architecture {arch!r} is not of the form sm_XY (e.g. sm_80, sm_90)")
    return arch


def default_cache_dir() -> Path:
    """Where compile results are cached: ``$KERNELSTREAM_COMPILE_CACHE``, else
    ``$XDG_CACHE_HOME/kernelstream/compile`` (``~/.cache/kernelstream/compile``)."""
    explicit = os.environ.get("KERNELSTREAM_COMPILE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernelstream" / "compile"


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc  # optional: the `compile` extra
    except ImportError as ex:
        raise BackendUnavailableError(_INSTALL_HINT) from ex
    return nvrtc


def compiler_version() -> str:
    """``"nvrtc 12.9"``; raises :class:`BackendUnavailableError` with an install hint."""
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except RuntimeError as ex:  # the bindings load libnvrtc on first use
        raise BackendUnavailableError(f"{_INSTALL_HINT}: {ex}") from ex
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BackendUnavailableError(f"{_INSTALL_HINT}: nvrtcVersion returned {err}")
    return f"nvrtc {major}.{minor}"


def _source_bytes(source: str | Path) -> bytes:
    if isinstance(source, Path):
        return source.read_bytes()
    return source.encode()


def _cache_key(
    code: bytes, kernel_name: str, arch: str, defines: Sequence[str], options: Sequence[str]
) -> str:
    h = hashlib.sha256()
    h.update(hashlib.sha256(code).digest())
    for part in (kernel_name, arch, *sorted(defines), "|", *options):
        h.update(part.encode() + b"\0")
    return h.hexdigest()


def _read_cache(path: Path) -> CompileResult | None:
    try:
        data = orjson.loads(path.read_bytes())
        if data.get("cache_version") != _CACHE_VERSION:
            return None
        return replace(CompileResult.from_dict(data["result"]), cached=True)
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None  # missing or unreadable: compile again and rewrite it


def _write_cache(path: Path, result: CompileResult) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps({"cache_version": _CACHE_VERSION, "result": result.to_dict()}))
    tmp.replace(path)  # atomic: concurrent compilers never read half a file


def parse_ptxas_info(log: str, kernel_name: str) -> dict[str, int] | None:
    """Registers, static shared memory, stack frame and spills of ``kernel_name`` from a
    ``ptxas -v`` report; None when the report has no such kernel.

    A C++ kernel's name is mangled; a report entry matches when it equals
    ``kernel_name`` or is a mangled name holding it as an identifier (``_Z5scale...``
    for ``scale``).

    >>> log = '''ptxas info    : Compiling entry function 'k' for 'sm_90'
    ... ptxas info    : Function properties for k
    ... ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
    ... ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem'''
    >>> parse_ptxas_info(log, "k")["registers"], parse_ptxas_info(log, "other")
    (40, None)
    """
    entries: dict[str, dict[str, int]] = {}
    props: dict[str, int] | None = None  # "Function properties for NAME" (stack, spills)
    entry: dict[str, int] | None = None  # "Compiling entry function 'NAME'" (registers)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = entries.setdefault(m.group(1), {})
        elif m := _FUNC.search(line):
            props = entries.setdefault(m.group(1), {})
        elif (s := _STACK.search(line)) and props is not None:
            props["local_bytes"] = int(s.group(1))
            props["spill_store_bytes"] = int(s.group(2))
            props["spill_load_bytes"] = int(s.group(3))
        elif (u := _USED.search(line)) and entry is not None:
            entry["registers"] = int(u.group(1))
            sm = _SMEM.search(line)
            entry["static_smem_bytes"] = int(sm.group(1)) if sm else 0
    for name, info in entries.items():
        mangled = name.startswith("_Z") and f"{len(kernel_name)}{kernel_name}" in name
        named = name == kernel_name or mangled
        if named and "registers" in info:
            return {
                "local_bytes": 0,
                "spill_store_bytes": 0,
                "spill_load_bytes": 0,
                **info,
            }
    return None


def _program_log(nvrtc: Any, prog: Any) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return buf.rstrip(b"\0 ").decode(errors="replace")


def _run_nvrtc(
    code: bytes, name: str, kernel_name: str, arch: str, args: Sequence[str], version: str
) -> CompileResult:
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(code, name.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return CompileResult(
            kernel_name, arch, False, f"nvrtcCreateProgram: {err}", compiler=version
        )
    try:
        opts = [a.encode() for a in (*args, f"--gpu-architecture={arch}", "--ptxas-options=-v")]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _program_log(nvrtc, prog)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return CompileResult(kernel_name, arch, False, log or str(err), compiler=version)
    info = parse_ptxas_info(log, kernel_name)
    if info is None:
        why = f'kernel {kernel_name!r} is not in the compiled module (is it extern "C" __global__?)'
        return CompileResult(kernel_name, arch, False, f"{why}\n{log}", compiler=version)
    return CompileResult(
        kernel_name,
        arch,
        True,
        log,
        registers=info["registers"],
        static_smem_bytes=info["static_smem_bytes"],
        local_bytes=info["local_bytes"],
        spill_store_bytes=info["spill_store_bytes"],
        spill_load_bytes=info["spill_load_bytes"],
        compiler=version,
    )


def compile_config(
    source: str | Path,
    kernel_name: str,
    defines: Mapping[str, int | str],
    arch: str = "sm_90",
    *,
    options: Sequence[str] = DEFAULT_OPTIONS,
    cache_dir: Path | None = None,
    use_cache: bool = True,
) -> CompileResult:
    """Compile ``kernel_name`` from ``source`` (a path, or the CUDA code itself) with NVRTC
    for ``arch`` (``"sm_80"``, ``"sm_90"``...), each define passed as ``-DNAME=value``.

    Returns a :class:`CompileResult`; a compile error is a result with ``ok=False`` and the
    compiler's log, never an exception. Raises :class:`BackendUnavailableError` (with the
    install command) when NVRTC is not installed, ``ValueError`` for a malformed ``arch``
    or define name, ``OSError`` when ``source`` is a path that cannot be read.
    Results are cached under ``cache_dir`` (:func:`default_cache_dir` when None).
    """
    check_arch(arch)
    bad = [k for k in defines if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ValueError(f"define names {bad} are not C identifiers")
    code = _source_bytes(source)
    name = source.name if isinstance(source, Path) else f"{kernel_name}.cu"
    flags = [f"-D{k}={v}" for k, v in defines.items()]
    version = compiler_version()
    key = _cache_key(code, kernel_name, arch, flags, (*options, version))
    path = (cache_dir or default_cache_dir()) / key[:2] / f"{key}.json"
    if use_cache and (hit := _read_cache(path)) is not None:
        return hit
    result = _run_nvrtc(code, name, kernel_name, arch, (*options, *flags), version)
    if use_cache:
        try:
            _write_cache(path, result)
        except OSError:
            pass  # a read-only cache costs a recompile next time, nothing else
    return result
