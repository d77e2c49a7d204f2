"""SASL/SSL settings reach every Kafka client: aiokafka producers, consumers, admin, Faust.

The embedded broker cannot check TLS or SASL (see ARCHITECTURE.md), so these tests
check the plumbing: the keyword arguments and Faust credentials built from the
settings, and that aiokafka accepts them. The whole loop against Apache Kafka behind
SASL_SSL is tests/integration/test_secured_kafka.py.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from kernelstream.app.settings import Settings
from kernelstream.app.worker.faust_app import create_app, faust_broker_kwargs
from tests.pki import client_pki


def _aiokafka_accepts(kw: dict[str, object]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

    async def build() -> None:  # aiokafka validates the security options in its constructors
        AIOKafkaProducer(bootstrap_servers="kafka:9093", **kw)
        AIOKafkaConsumer(bootstrap_servers="kafka:9093", **kw)
        AIOKafkaAdminClient(bootstrap_servers="kafka:9093", **kw)

    import asyncio

    asyncio.run(build())


def _faust_auth(s: Settings) -> dict[str, object]:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    app = create_app(s, "kafka:9093", web=False)
    return dict(credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context))


def test_plaintext_by_default() -> None:
    s = Settings()
    assert s.kafka_client_kwargs() == {"security_protocol": "PLAINTEXT"}
    assert "broker_credentials" not in faust_broker_kwargs(s)
    assert _faust_auth(s) == {"security_protocol": "PLAINTEXT"}


def test_sasl_plaintext_scram_reaches_aiokafka_and_faust() -> None:
    s = Settings(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="ks",
        sasl_password="s3cret",
    )
    kw = s.kafka_client_kwargs()
    assert kw == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "ks",
        "sasl_plain_password": "s3cret",
    }
    _aiokafka_accepts(kw)
    auth = _faust_auth(s)
    assert {k: auth[k] for k in kw} == kw and auth["ssl_context"] is None
    assert "s3cret" not in repr(s) and "s3cret" not in str(s.model_dump())


def test_sasl_ssl_with_a_private_ca(tmp_path: Path) -> None:
    ca, _, _ = client_pki(tmp_path)
    s = Settings(
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="ks",
        sasl_password="s3cret",
        ssl_cafile=ca,
    )
    kw = s.kafka_client_kwargs()
    ctx = kw["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "ks-test-ca"),),)]
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "PLAIN"
    _aiokafka_accepts(kw)
    auth = _faust_auth(s)
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_plain_username"] == "ks"
    assert isinstance(auth["ssl_context"], ssl.SSLContext)


def test_mutual_tls_with_an_encrypted_client_key(tmp_path: Path) -> None:
    ca, cert, key = client_pki(tmp_path)
    s = Settings(
        security_protocol="SSL",
        ssl_cafile=ca,
        ssl_certfile=cert,
        ssl_keyfile=key,
        ssl_password="pw",
        ssl_check_hostname=False,
        sasl_mechanism="PLAIN",  # ignored: not a SASL protocol
    )
    kw = s.kafka_client_kwargs()
    assert set(kw) == {"security_protocol", "ssl_context"} and kw["security_protocol"] == "SSL"
    assert not kw["ssl_context"].check_hostname
    _aiokafka_accepts(kw)
    auth = _faust_auth(s)
    assert auth["security_protocol"] == "SSL" and isinstance(auth["ssl_context"], ssl.SSLContext)
    with pytest.raises(ssl.SSLError):
        Settings(
            security_protocol="SSL",
            ssl_certfile=cert,
            ssl_keyfile=key,
            ssl_password="wrong",
        ).kafka_client_kwargs()


def test_incomplete_security_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="sasl_mechanism, sasl_username, sasl_password"):
        Settings(security_protocol="SASL_SSL")
    with pytest.raises(ValueError, match="sasl_password"):
        Settings(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u")
    with pytest.raises(ValueError, match="ssl_keyfile needs ssl_certfile"):
        Settings(security_protocol="SSL", ssl_keyfile=Path("k.pem"))


def test_security_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELSTREAM_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KERNELSTREAM_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("KERNELSTREAM_SASL_USERNAME", "ks")
    monkeypatch.setenv("KERNELSTREAM_SASL_PASSWORD", "from-env")
    kw = Settings().kafka_client_kwargs()
    assert kw["sasl_plain_password"] == "from-env" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
