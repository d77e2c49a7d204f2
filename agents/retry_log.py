"""One warning per outage, not one per retry, and what to fix.

A node keeps running while its broker is unreachable (its outbox holds the launches),
so its clients retry every second or so. Logging each retry buried the one line that
says what to fix under dozens of identical ones; :class:`RetryLog` says it once, then
at most once every ``every_s`` seconds with the count, and once more on recovery.

aiokafka reports why a connection failed only in its own log line ("Unable connect
to ..."); the client then raises a plain "Unable to bootstrap". The filter that drops
that line keeps what its error says to fix (:func:`connect_advice`), so that a broker
that refused the client's credentials, certificate or protocol is reported as that,
with the setting to check (:func:`advice`), and not as an unreachable broker.
"""

from __future__ import annotations

import logging
import ssl
import time

__all__ = [
    "ACLS_FIX",
    "RetryLog",
    "advice",
    "connect_advice",
    "denied_errors",
    "quiet_aiokafka_connect_errors",
    "refusal",
]

# What aiokafka's latest connection error in this process says to fix:
# (time.monotonic(), advice or None). The advice, not the error: an error kept for good
# would keep its traceback's frames, and all they refer to, alive.
_last_cause: tuple[float, str | None] | None = None
# how long a kept error explains a failure that follows it
_CAUSE_S = 30.0
# what a principal the ACLs refuse needs
ACLS_FIX = (
    "allow this principal what `kernelstream topics --acls worker` (or `--acls node`) "
    "prints (docs/operate/security.md)"
)


def connect_advice() -> str | None:
    """:func:`advice` for the error of aiokafka's latest failed connection in this
    process, where it failed in the last 30 s and :func:`quiet_aiokafka_connect_errors`
    is in place; else None."""
    if _last_cause is None or time.monotonic() - _last_cause[0] > _CAUSE_S:
        return None
    return _last_cause[1]


def denied_errors() -> tuple[type[BaseException], ...]:
    """aiokafka's errors for an operation the broker's ACLs do not allow."""
    from aiokafka import errors

    return (
        errors.TopicAuthorizationFailedError,
        errors.GroupAuthorizationFailedError,
        errors.ClusterAuthorizationFailedError,
        errors.TransactionalIdAuthorizationFailed,
    )


def advice(cause: BaseException | None) -> str | None:
    """What to fix, in one line, where a connection or a request failed with ``cause``
    because the broker refused the client (credentials, certificate, security protocol,
    ACLs); None where it may just be unreachable (refused, timed out, no such host) or
    the cause is unknown."""
    from aiokafka.errors import (
        IllegalSaslStateError,
        KafkaConnectionError,
        SaslAuthenticationFailed,
        UnsupportedSaslMechanismError,
    )

    protocol = "check KERNELSTREAM_SECURITY_PROTOCOL"
    if isinstance(cause, denied_errors()):
        return f"not allowed by the broker's ACLs: {cause}; {ACLS_FIX}"
    if isinstance(cause, SaslAuthenticationFailed):
        detail = cause.args[0] if cause.args else "authentication failed"
        return (
            f"the broker refused the SASL credentials ({detail}); check "
            "KERNELSTREAM_SASL_USERNAME and KERNELSTREAM_SASL_PASSWORD"
        )
    if isinstance(cause, UnsupportedSaslMechanismError):
        return "the broker does not take this SASL mechanism; check KERNELSTREAM_SASL_MECHANISM"
    if isinstance(cause, IllegalSaslStateError):
        return f"the broker's listener does not speak SASL; {protocol}"
    if isinstance(cause, ssl.SSLCertVerificationError):
        detail = cause.verify_message or str(cause)
        fix = "KERNELSTREAM_SSL_CAFILE"
        if "mismatch" in detail:
            fix += " and KERNELSTREAM_SSL_CHECK_HOSTNAME (and KAFKA_BOOTSTRAP's host names)"
        return f"the broker's TLS certificate was not accepted ({detail}); check {fix}"
    if isinstance(cause, ssl.SSLError):
        return f"the TLS handshake failed ({cause.reason or cause}); {protocol}"
    # these two are also what a broker that is stopping does
    if isinstance(cause, ConnectionResetError):
        return (
            "the broker reset the connection (stopping, or a listener that does not speak "
            f"TLS?); {protocol}"
        )
    if isinstance(cause, KafkaConnectionError) and str(cause).endswith(" closed"):
        return (
            "the broker closed the connection before answering (stopping, or a listener "
            f"that wants TLS or SASL?); {protocol}"
        )
    return None


def refusal(exc: BaseException) -> str | None:
    """:func:`advice` for ``exc``, or, where ``exc`` is aiokafka's "Unable to bootstrap"
    (which hides why each connection failed), for the error of its latest failed
    connection (:func:`connect_advice`)."""
    from aiokafka.errors import KafkaConnectionError

    hint = advice(exc)
    if hint is None and isinstance(exc, KafkaConnectionError):
        hint = connect_advice()
    return hint


class RetryLog:
    """Rate-limited reporting of a retried connection (``what``: who retries)."""

    def __init__(self, log: logging.Logger, what: str, every_s: float = 30.0) -> None:
        self.log, self.what, self.every_s = log, what, every_s
        self.failures = 0
        self._last = -float("inf")

    def failed(self, exc: BaseException) -> None:
        """Count one failed attempt; log it when it is the first or enough time passed."""
        self.failures += 1
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        first = self.failures == 1
        times = "" if first else f" for {self.failures} attempts"
        hint = refusal(exc)
        if hint is not None:
            self.log.warning("%s: cannot use Kafka%s: %s; retrying", self.what, times, hint)
            return
        self.log.warning(
            "%s: cannot reach Kafka (%s)%s; retrying (check KAFKA_BOOTSTRAP)",
            self.what,
            exc,
            times,
        )

    def recovered(self) -> None:
        """Log the end of an outage (nothing when there was none)."""
        if self.failures:
            self.log.warning("%s: connected after %d failed attempts", self.what, self.failures)
        self.failures, self._last = 0, -float("inf")


class _DropReported(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        global _last_cause
        if str(record.msg).startswith(_DENIED):  # the error raised says it, and what to do
            return False
        if not str(record.msg).startswith("Unable connect to"):
            return True
        # aiokafka's arguments: (host, port, error) or (node id, error)
        args = record.args if isinstance(record.args, tuple) else ()
        if args and isinstance(args[-1], BaseException):
            _last_cause = (time.monotonic(), advice(args[-1]))
        return False


# aiokafka.cluster's line for a topic the ACLs hide ("Topic %s is not authorized ...")
_DENIED = "Topic %s is not authorized"


def quiet_aiokafka_connect_errors() -> None:
    """Drop aiokafka's own ERROR line per failed connect, keeping its error
    (:func:`connect_advice`), and its line per topic the ACLs refuse, which the error
    raised says too; :class:`RetryLog` and the command line report them."""
    for name in ("aiokafka", "aiokafka.cluster"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropReported) for f in logger.filters):
            logger.addFilter(_DropReported())
