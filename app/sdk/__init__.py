"""The library side of kernelstream: a node context for the user's own kernels.

:class:`Node` runs, inside the user's process, what ``kernelstream node`` runs for the
built-in workloads (outbox, sender, reconfiguration agent), over every
:class:`kernelstream.TunableKernel` of the process.
"""

from __future__ import annotations

from kernelstream.app.sdk.node import Node

__all__ = ["Node"]
