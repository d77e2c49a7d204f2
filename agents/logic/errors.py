"""Exceptions of the pure streaming logic (windows, detection, tuning)."""

from __future__ import annotations

from kernelstream.schemas.errors import KernelstreamError

__all__ = ["LogicError", "LogicSettingsError", "SnapshotError"]


class LogicError(KernelstreamError):
    """Base of the errors raised by :mod:`agents.logic`."""


class LogicSettingsError(LogicError, ValueError):
    """A window spec, threshold or tuner setting is out of range.

    The message names the setting and its value; fix the configuration that built it.
    """


class SnapshotError(LogicError, ValueError):
    """A state snapshot cannot be restored (wrong version or malformed).

    Snapshots are versioned; a worker that cannot restore one should discard the
    persisted state and rebuild it by replaying its input topic.
    """
