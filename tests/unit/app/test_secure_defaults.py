"""Secure by default: loopback binds, signature checks on, keys from one command."""

from __future__ import annotations

import asyncio
import logging
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernelstream.app.cli import main
from kernelstream.app.node.runtime import _signature_check
from kernelstream.app.settings import Settings
from kernelstream.app.worker.faust_app import create_app
from kernelstream.schemas import Recommendation
from kernelstream.schemas.signing import (
    Signer,
    Verifier,
    generate_keypair,
    load_private_key,
    load_public_key,
)


def test_worker_web_server_binds_loopback_even_with_a_cluster_configured() -> None:
    app = create_app(Settings(bootstrap="kafka:9092"), "kafka:9092", web=True)
    assert app.conf.web_bind == "127.0.0.1"
    wide = create_app(Settings(bootstrap="kafka:9092", web_bind="0.0.0.0"), "kafka:9092")
    assert wide.conf.web_bind == "0.0.0.0"


def test_node_metrics_listen_on_loopback_only_by_default() -> None:
    """The node's endpoints on the default bind answer on 127.0.0.1 and on no other address."""
    import urllib.request

    from kernelstream.app.kafka.embedded import free_port
    from kernelstream.app.observability.health import serve_node_endpoints
    from kernelstream.app.observability.metrics import NodeMetrics

    s = Settings(bootstrap="kafka:9092")
    port = free_port()
    others = _non_loopback_addresses()

    async def probe() -> tuple[int, list[str]]:
        async with serve_node_endpoints(NodeMetrics(), s.node_metrics_bind, port):
            status = await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").status
            )
            reached = []
            for host in others:
                try:
                    _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
                    w.close()
                    reached.append(host)
                except OSError:
                    pass
            return status, reached

    assert s.node_metrics_bind == "127.0.0.1"
    assert asyncio.run(probe()) == (200, [])


def _non_loopback_addresses() -> set[str]:
    """This machine's outward IPv4 address (a UDP connect sends nothing), if it has one."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        try:
            u.connect(("198.51.100.1", 9))  # TEST-NET-2: only the route is looked up
            addr = str(u.getsockname()[0])
        except OSError:
            return set()
    return set() if addr.startswith("127.") else {addr}


def _rec(**over: object) -> Recommendation:
    base: dict[str, object] = {
        "id": "r1",
        "node": "n1",
        "device_index": 0,
        "device_model": "A100",
        "kernel": "k",
        "workload": "k",
        "problem_size": [1],
        "from_config_id": "a",
        "config": {"b": 1},
        "config_id": "b=1",
        "reason": "r",
        "evidence": {},
        "expected_gain": 1.1,
        "issued_at": 0.0,
        "expires_at": 10.0,
    }
    base.update(over)
    return Recommendation.model_validate(base)


def test_a_node_without_a_key_refuses_every_recommendation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        check = _signature_check(Settings(node_id="n1"))
    assert check is not None and "no signing public key" in caplog.text
    private, _ = generate_keypair()
    attacker = Signer(load_private_key(private))
    assert "refused" in check(_rec())
    assert "refused" in check(attacker.sign(_rec()))


def test_a_node_with_the_recommenders_key_accepts_only_its_signatures() -> None:
    private, public = generate_keypair()
    check = _signature_check(Settings(node_id="n1", signing_public_key=public.decode()))
    assert check is not None
    assert check(Signer(load_private_key(private)).sign(_rec())) == ""
    assert "unsigned" in check(_rec())
    other, _ = generate_keypair()
    assert "unknown key" in check(Signer(load_private_key(other)).sign(_rec()))


def test_skipping_verification_takes_an_explicit_setting_and_warns(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELSTREAM_INSECURE_ACCEPT_UNSIGNED", "true")
    with caplog.at_level(logging.WARNING):
        assert _signature_check(Settings(node_id="n1")) is None
    assert "WITHOUT signature checks" in caplog.text


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    result = CliRunner().invoke(main, ["keygen", "--out-dir", str(out)])
    assert result.exit_code == 0, result.output
    priv, pub = out / "recommender.key", out / "recommender.pub"
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    signer = Signer(load_private_key(priv.read_bytes()))
    assert Verifier(load_public_key(pub.read_bytes())).key_id == signer.key_id
    assert signer.key_id in result.output
    again = CliRunner().invoke(main, ["keygen", "--out-dir", str(out)])
    assert again.exit_code != 0 and "not overwriting" in again.output
    kept = CliRunner().invoke(main, ["keygen", "--out-dir", str(out), "--keep-existing"])
    assert kept.exit_code == 0 and priv.read_bytes() == priv.read_bytes()
    assert Signer(load_private_key(priv.read_bytes())).key_id == signer.key_id


def test_keygen_copies_only_the_public_key_to_the_nodes_volume(tmp_path: Path) -> None:
    args = ["keygen", "--out-dir", str(tmp_path / "priv"), "--public-dir", str(tmp_path / "pub")]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert sorted(p.name for p in (tmp_path / "pub").iterdir()) == ["recommender.pub"]
    again = CliRunner().invoke(main, [*args, "--keep-existing"])
    assert again.exit_code == 0 and "kept" in again.output


def test_the_kubernetes_secret_holds_both_keys_base64() -> None:
    import base64

    from kernelstream.app.cli.keys import k8s_secret

    private, public = generate_keypair()
    secret = k8s_secret("kernelstream-signing", "kernelstream", private, public)
    assert secret["metadata"] == {
        "name": "kernelstream-signing",
        "namespace": "kernelstream",
        "labels": {"app.kubernetes.io/name": "kernelstream"},
    }
    assert load_private_key(base64.b64decode(secret["data"]["private.pem"]))
    assert load_public_key(base64.b64decode(secret["data"]["public.pem"]))
