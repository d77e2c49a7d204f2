"""The window stage's compiled passes, where the install built them.

``kernelstream._native`` (``native/``, Rust with PyO3, built by setuptools-rust at install
time) holds two passes the worker makes on every poll and every closing window:

* ``plain_many(t, d, ok, max_duration_bits)``: the value checks of a poll's binary launch
  batches, batch by batch (:func:`schemas.columnar._plain_binary_many`);
* ``window_stats(t_chunks, d_chunks, qs)``: a closing window's duration statistics
  (:func:`agents.logic.windowing.duration_stats`).

Each gives exactly what its NumPy code gives (the tests compare them bit for bit on the
same inputs), and returns None where it cannot promise that; the NumPy code then decides.
:data:`core` is the module, or None where the install has none (no Rust toolchain when it
was built) or ``KERNELSTREAM_NATIVE=0`` is set; code reads it at each call, so a
benchmark can set it to None to time the NumPy passes in the same process.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["core", "describe"]


def _load() -> ModuleType | None:
    if os.environ.get("KERNELSTREAM_NATIVE", "1") == "0":
        return None
    try:
        # by name: `from kernelstream import _native` would make the lowest layer import
        # the package's top (kernelstream/__init__.py) in the import contracts' eyes
        return importlib.import_module("kernelstream._native")
    except ImportError:
        return None


core: ModuleType | None = _load()


def describe() -> str:
    """One line for a worker's start: which passes it runs."""
    if core is not None:
        return "compiled window passes: kernelstream._native"
    if os.environ.get("KERNELSTREAM_NATIVE", "1") == "0":
        return "compiled window passes: off (KERNELSTREAM_NATIVE=0); NumPy passes"
    return (
        "compiled window passes: not built (no Rust toolchain at install); NumPy passes, "
        "the same results, slower"
    )
