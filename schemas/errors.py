"""Exceptions of the schemas package."""

from __future__ import annotations

__all__ = ["KernelstreamError", "SchemaError", "SigningKeyError"]


class KernelstreamError(Exception):
    """Base of every error kernelstream raises on purpose."""


class SchemaError(KernelstreamError, ValueError):
    """A message could not be decoded into the record type its topic carries.

    The message says which field failed and why. Stages that receive such input
    send the original bytes to the dead-letter topic with this message as the
    reason; they never drop it and never crash on it. ``code`` classifies the
    reason for counters (one of :data:`schemas.codec.REASON_CODES`).
    """

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(message)
        self.code = code


class SigningKeyError(KernelstreamError, ValueError):
    """A signing or verifying key in the settings could not be used.

    Keys are Ed25519, PEM or base64 of the 32 raw bytes; the message says what
    failed. Generate a pair with ``schemas.signing.generate_keypair``.
    """
