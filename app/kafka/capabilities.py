"""What the broker behind a bootstrap address can do, asked of the broker itself.

kernelstream runs on Apache Kafka and on the embedded Tansu broker, which lacks
some of Kafka's mechanisms (ARCHITECTURE.md). Rather than a setting naming the
broker, the processes ask: :func:`probe` sends one ``InitProducerId`` request
(answered with a producer id by a broker that has idempotent producers, with an
error by one that does not) and counts the brokers in the cluster's metadata
(the replication factor of the topics kernelstream creates).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from kernelstream.app.settings import LONG_FETCH_WAIT_MS, SHORT_FETCH_WAIT_MS

__all__ = ["BrokerCapabilities", "probe", "replication_factor"]

log = logging.getLogger("kernelstream.kafka")


@dataclass(frozen=True)
class BrokerCapabilities:
    """The answers of one cluster."""

    brokers: int
    idempotent_producer: bool

    @property
    def fetch_wait_ms(self) -> int:
        """The fetch wait for consumers of this cluster, where the settings leave it unset.

        Told apart by their idempotent producers: Apache Kafka hands out producer ids and
        answers a waiting fetch as soon as data arrives; the embedded broker does neither.
        """
        return LONG_FETCH_WAIT_MS if self.idempotent_producer else SHORT_FETCH_WAIT_MS

    @property
    def replication_factor(self) -> int:
        """Replicas of the topics kernelstream creates on this cluster."""
        return replication_factor(self.brokers)


def replication_factor(brokers: int) -> int:
    """Replicas per topic on a cluster of ``brokers``: 3 where there are 3 or more.

    >>> replication_factor(1), replication_factor(3), replication_factor(5)
    (1, 3, 3)
    """
    return max(1, min(3, brokers))


async def probe(bootstrap: str, client_kwargs: dict[str, Any] | None = None) -> BrokerCapabilities:
    """Ask the cluster at ``bootstrap``; connection errors propagate (the caller retries)."""
    from aiokafka import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, **(client_kwargs or {}))
    await client.bootstrap()
    try:
        brokers = len(client.cluster.brokers())
        idempotent = await _init_producer_id(client)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    caps = BrokerCapabilities(brokers=brokers, idempotent_producer=idempotent)
    log.info("broker at %s: %s", bootstrap, caps)
    return caps


async def _init_producer_id(client: Any, tries: int = 50) -> bool:
    """True once the broker hands out a producer id; False on a non-retriable refusal."""
    import asyncio

    from aiokafka import errors
    from aiokafka.protocol.transaction import InitProducerIdRequest

    # transactional_id None: a producer id for an idempotent, non-transactional producer
    request = InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60_000)
    error: type[Exception] = errors.NoError
    for _ in range(tries):
        try:
            response = await client.send(client.get_random_node(), request)
        except (errors.KafkaConnectionError, errors.KafkaTimeoutError):
            raise
        except errors.KafkaError as exc:  # the broker refused the request itself
            log.info("no idempotent producer on this broker: %r", exc)
            return False
        error = errors.for_code(int(response.error_code))
        if error is errors.NoError:
            return True
        if not getattr(error, "retriable", False):
            break
        await asyncio.sleep(0.1)  # e.g. a producer id block not allocated yet
    log.info("no idempotent producer on this broker: InitProducerId answered %s", error.__name__)
    return False
