"""Exceptions of the kernels package.

Every error names what failed (workload, device, file) and what to do about it.
"""

from __future__ import annotations

from kernelstream.schemas.errors import KernelstreamError

__all__ = [
    "BackendUnavailableError",
    "CalibrationError",
    "KernelArgumentError",
    "KernelCompileError",
    "KernelDefinitionError",
    "KernelsError",
    "TraceFileError",
    "UnknownDeviceError",
    "UnknownWorkloadError",
]


class KernelsError(KernelstreamError):
    """Base of the errors raised by ``kernels``."""


class UnknownWorkloadError(KernelsError, LookupError):
    """A workload name is not registered; the message lists the names that are."""


class UnknownDeviceError(KernelsError, LookupError):
    """A GPU model or backend name is not known; the message lists the known ones."""


class BackendUnavailableError(KernelsError, RuntimeError):
    """A backend cannot run here (e.g. CuPy not installed); the message says how to fix it."""


class TraceFileError(KernelsError, ValueError):
    """A Kernel Tuner cache file is missing, unreadable or malformed; the message names it."""


class CalibrationError(KernelsError, ValueError):
    """A sweep file cannot be compared with the ``sim`` model (unknown workload or device,
    nothing measured); the message names the file and what is missing."""


class KernelDefinitionError(KernelsError, ValueError):
    """A user kernel is defined wrongly (``tune_params``, ``restrictions``, ``grid_div``,
    source, or a cache file of another kernel); the message names the argument at fault."""


class KernelCompileError(KernelsError, RuntimeError):
    """A configuration of a user kernel did not compile (or could not be launched); the
    message names the kernel, the configuration and the compiler's log."""


class KernelArgumentError(KernelsError, TypeError):
    """A user kernel was called with the wrong number of arguments; the message gives the
    kernel's signature."""
