"""kernelstream: a stream-processing pipeline that tunes GPU kernels while they run.

The installed distribution has one top-level import package, ``kernelstream``. The
repository keeps the design's folders at its top level (``app/``, ``agents/``,
``kernels/``, ``schemas/``, ``bench/``); ``kernelstream/app`` and its siblings are relative
symlinks to them, so they import as ``kernelstream.app``, ``kernelstream.agents`` and so on
(from a checkout, an editable install or a wheel alike), and nothing of ours lands beside a
user's own ``app`` or ``kernels`` package.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
