"""Exceptions of the schemas package."""

from __future__ import annotations

__all__ = ["KernelstreamError", "SchemaError"]


class KernelstreamError(Exception):
    """Base of every error kernelstream raises on purpose."""


class SchemaError(KernelstreamError, ValueError):
    """A message could not be decoded into the record type its topic carries.

    The message says which field failed and why. Stages that receive such input
    send the original bytes to the dead-letter topic with this message as the
    reason; they never drop it and never crash on it.
    """
