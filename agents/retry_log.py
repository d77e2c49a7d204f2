"""One warning per outage, not one per retry.

A node keeps running while its broker is unreachable (its outbox holds the launches),
so its clients retry every second or so. Logging each retry buried the one line that
says what to fix under dozens of identical ones; :class:`RetryLog` says it once, then
at most once every ``every_s`` seconds with the count, and once more on recovery.
"""

from __future__ import annotations

import logging
import time

__all__ = ["RetryLog", "quiet_aiokafka_connect_errors"]


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
        self.log.warning(
            "%s: cannot reach Kafka (%s)%s; retrying (check KAFKA_BOOTSTRAP)",
            self.what,
            exc,
            "" if first else f" for {self.failures} attempts",
        )

    def recovered(self) -> None:
        """Log the end of an outage (nothing when there was none)."""
        if self.failures:
            self.log.warning("%s: connected after %d failed attempts", self.what, self.failures)
        self.failures, self._last = 0, -float("inf")


class _DropConnectErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable connect to")


def quiet_aiokafka_connect_errors() -> None:
    """Drop aiokafka's own ERROR line per failed connect; :class:`RetryLog` reports them."""
    logger = logging.getLogger("aiokafka")
    if not any(isinstance(f, _DropConnectErrors) for f in logger.filters):
        logger.addFilter(_DropConnectErrors())
