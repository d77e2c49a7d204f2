"""kernelstream: a stream-processing pipeline that tunes GPU kernels while they run.

The installed distribution has one top-level import package, ``kernelstream``. The
repository keeps the design's folders at its top level (``app/``, ``agents/``,
``kernels/``, ``schemas/``, ``bench/``); ``kernelstream/app`` and its siblings are relative
symlinks to them, so they import as ``kernelstream.app``, ``kernelstream.agents`` and so on
(from a checkout, an editable install or a wheel alike), and nothing of ours lands beside a
user's own ``app`` or ``kernels`` package.

The library API (``TunableKernel``, ``trace_device``, ``cupy_device``, ``compile_device``,
``Node``, ...) is imported on first use: the CLI and the worker import this package first
and need none of it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelstream.app.sdk.node import Node
    from kernelstream.kernels.backends.user import compile_device, cupy_device, trace_device
    from kernelstream.kernels.errors import (
        KernelArgumentError,
        KernelCompileError,
        KernelDefinitionError,
    )
    from kernelstream.kernels.space import SpaceError
    from kernelstream.kernels.tunable import TunableKernel
    from kernelstream.schemas import Recommendation

__all__ = [
    "KernelArgumentError",
    "KernelCompileError",
    "KernelDefinitionError",
    "Node",
    "Recommendation",
    "SpaceError",
    "TunableKernel",
    "__version__",
    "compile_device",
    "cupy_device",
    "trace_device",
]

__version__ = "0.1.0"

_LAZY = {
    "Node": "kernelstream.app.sdk.node",
    "TunableKernel": "kernelstream.kernels.tunable",
    "trace_device": "kernelstream.kernels.backends.user",
    "compile_device": "kernelstream.kernels.backends.user",
    "cupy_device": "kernelstream.kernels.backends.user",
    "KernelArgumentError": "kernelstream.kernels.errors",
    "KernelCompileError": "kernelstream.kernels.errors",
    "KernelDefinitionError": "kernelstream.kernels.errors",
    "SpaceError": "kernelstream.kernels.space",
    "Recommendation": "kernelstream.schemas",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
