"""Find a user's :class:`kernelstream.TunableKernel` objects from the command line.

A spec is ``module:attribute`` (``mykernels:saxpy``), ``path/to/file.py:attribute``, or a
module or file alone (every ``TunableKernel`` at its top level). The module is imported
as Python imports a script's neighbours: the current folder (for a module) or the file's
folder comes first on ``sys.path``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from kernelstream.kernels.errors import KernelsError
from kernelstream.kernels.tunable import TunableKernel

__all__ = ["KernelSpecError", "load_kernels"]


class KernelSpecError(KernelsError, ValueError):
    """A ``--kernel`` spec names no module, file or TunableKernel; the message says which."""


def _split(spec: str) -> tuple[str, str | None]:
    where, sep, attr = spec.rpartition(":")
    if sep and attr.isidentifier() and where:
        return where, attr
    return spec, None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise KernelSpecError(f"--kernel {path}: no such Python file")
    name = f"_kernelstream_user_{abs(hash(path.resolve()))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise KernelSpecError(f"--kernel {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(path.resolve().parent))
    return module


def _import(where: str) -> ModuleType:
    if where.endswith(".py") or os.sep in where or "/" in where:
        return _import_file(Path(where))
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as ex:
        if ex.name and where.startswith(ex.name):
            raise KernelSpecError(f"--kernel {where}: no module named {ex.name!r}") from ex
        raise


def load_kernels(spec: str) -> list[TunableKernel]:
    """The TunableKernel(s) ``spec`` names; :class:`KernelSpecError` when there are none.

    Errors the module itself raises on import (a kernel whose first configuration does
    not compile, say) propagate unchanged.
    """
    where, attr = _split(spec)
    module = _import(where)
    if attr is not None:
        if not hasattr(module, attr):
            raise KernelSpecError(f"--kernel {spec}: {where} has no attribute {attr!r}")
        found = getattr(module, attr)
        if not isinstance(found, TunableKernel):
            raise KernelSpecError(
                f"--kernel {spec}: {attr} is a {type(found).__name__}, not a "
                "kernelstream.TunableKernel"
            )
        return [found]
    kernels = [v for v in vars(module).values() if isinstance(v, TunableKernel)]
    if not kernels:
        raise KernelSpecError(f"--kernel {spec}: {where} defines no kernelstream.TunableKernel")
    return list({id(k): k for k in kernels}.values())
