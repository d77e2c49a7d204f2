"""Ed25519 signatures on recommendations: valid, unsigned, forged, wrong key, tampered."""

from __future__ import annotations

import base64

import pytest

from kernelstream.app.settings import Settings
from kernelstream.schemas import Recommendation, SigningKeyError, decode, encode
from kernelstream.schemas.signing import (
    Signer,
    Verifier,
    generate_keypair,
    load_private_key,
    load_public_key,
    signer_from_settings,
    verifier_from_settings,
)


def rec(**over: object) -> Recommendation:
    base: dict[str, object] = dict(
        id="r1",
        node="n1",
        device_index=0,
        device_model="A100",
        kernel="k",
        workload="k",
        problem_size=[1024],
        from_config_id="block=32",
        config={"block": 64, "fast": True, "alpha": 0.5},
        config_id="block=64",
        reason="test",
        evidence={"bw_fraction": 0.1},
        expected_gain=1.2,
        issued_at=1.0,
        expires_at=21.0,
    )
    base.update(over)
    return Recommendation(**base)


@pytest.fixture
def keys() -> tuple[Signer, Verifier]:
    priv, pub = generate_keypair()
    return Signer(load_private_key(priv)), Verifier(load_public_key(pub))


def test_a_signed_recommendation_verifies_after_a_round_trip(keys: tuple[Signer, Verifier]) -> None:
    signer, verifier = keys
    signed = signer.sign(rec())
    assert signed.key_id == verifier.key_id and signed.signature
    assert verifier.problem(decode(encode(signed), Recommendation)) == ""


def test_unsigned_forged_and_foreign_key_are_refused(keys: tuple[Signer, Verifier]) -> None:
    signer, verifier = keys
    assert "unsigned" in verifier.problem(rec())
    signed = signer.sign(rec())
    tampered = signed.model_copy(update={"config": {"block": 1024, "fast": True, "alpha": 0.5}})
    assert "forged" in verifier.problem(tampered)
    retargeted = signed.model_copy(update={"node": "n2"})
    assert "forged" in verifier.problem(retargeted)
    prolonged = signed.model_copy(update={"expires_at": 1e12})
    assert "forged" in verifier.problem(prolonged)
    garbage = signed.model_copy(update={"signature": "not base64!"})
    assert "forged" in verifier.problem(garbage)
    other_priv, _ = generate_keypair()
    foreign = Signer(load_private_key(other_priv)).sign(rec())
    assert "unknown key" in verifier.problem(foreign)
    # A foreign signature presented under the trusted key id is still a forgery.
    assert "forged" in verifier.problem(foreign.model_copy(update={"key_id": verifier.key_id}))


def test_keys_from_settings_pem_or_base64(tmp_path: object) -> None:
    from pathlib import Path

    from cryptography.hazmat.primitives import serialization

    priv, pub = generate_keypair()
    key_file = Path(str(tmp_path)) / "tuner.pem"
    key_file.write_bytes(priv)
    raw_pub = load_public_key(pub).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    tuner = Settings(signing_private_key_file=key_file)
    node = Settings(signing_public_key=base64.b64encode(raw_pub).decode())
    signer, verifier = signer_from_settings(tuner), verifier_from_settings(node)
    assert signer is not None and verifier is not None
    assert verifier.problem(signer.sign(rec())) == ""
    assert signer_from_settings(Settings()) is None and verifier_from_settings(Settings()) is None
    assert priv.decode() not in repr(Settings(signing_private_key=priv.decode()))


def test_bad_keys_say_so() -> None:
    with pytest.raises(SigningKeyError, match="could not be read"):
        load_public_key("not a key")
    with pytest.raises(SigningKeyError, match="could not be read"):
        load_private_key(base64.b64encode(b"short").decode())
