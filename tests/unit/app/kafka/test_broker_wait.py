"""Waiting for a broker that is still starting: no Kafka client (and no error it logs)
until something listens at the address."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest

from kernelstream.app.errors import BrokerError
from kernelstream.app.kafka.embedded import _any_accepts, free_port, wait_for_kafka


def test_a_listening_address_accepts_and_a_closed_one_does_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        closed = free_port()
        assert asyncio.run(_any_accepts(f"127.0.0.1:{port}"))
        assert asyncio.run(_any_accepts(f"127.0.0.1:{closed}, 127.0.0.1:{port}"))
        assert not asyncio.run(_any_accepts(f"127.0.0.1:{closed}"))
        assert not asyncio.run(_any_accepts("127.0.0.1:not-a-port"))


def test_waiting_on_a_port_nobody_listens_on_logs_no_client_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiokafka logs every refused bootstrap connection at ERROR; a broker that is only
    starting must not print those to the user, and the timeout still names the address."""
    port = free_port()
    with caplog.at_level(logging.DEBUG), pytest.raises(BrokerError, match=f"127.0.0.1:{port}"):
        asyncio.run(wait_for_kafka(f"127.0.0.1:{port}", 1.0))
    assert [r for r in caplog.records if r.name.startswith("aiokafka")] == []
