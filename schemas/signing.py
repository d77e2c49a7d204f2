"""Ed25519 signatures on recommendations: the tuner signs, nodes verify.

Here in ``schemas`` because a signature is part of the record's contract and both
sides use it: the tuner agent (``agents``, which must not import ``app``) and the
node (``app``).

Asymmetric on purpose: a node holds only the recommender's *public* key, so a
compromised node can read but never forge commands for other nodes. The
signature covers every field of the recommendation except ``signature`` itself
(node, kernel, config, expiry, id, ...), serialized canonically (orjson, sorted
keys), so changing any of them invalidates it.

Keys are PEM (PKCS#8 private, SubjectPublicKeyInfo public) or, handier in an
environment variable, the raw 32-byte key in base64.

>>> priv, pub = generate_keypair()
>>> signer, verifier = Signer(load_private_key(priv)), Verifier(load_public_key(pub))
>>> verifier.key_id == signer.key_id
True
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from kernelstream.schemas.errors import SigningKeyError
from kernelstream.schemas.records import Recommendation

__all__ = [
    "PRIVATE_KEY_FILE",
    "PUBLIC_KEY_FILE",
    "Signer",
    "Verifier",
    "generate_keypair",
    "load_private_key",
    "load_public_key",
    "signed_bytes",
    "signer_from_settings",
    "verifier_from_settings",
    "write_keypair",
]


def signed_bytes(rec: Recommendation) -> bytes:
    """The canonical bytes a signature covers: every field but ``signature``."""
    wire = rec.to_wire()
    wire.pop("signature", None)
    return orjson.dumps(wire, option=orjson.OPT_SORT_KEYS)


def _key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def _text(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def load_private_key(data: str | bytes) -> Ed25519PrivateKey:
    """An Ed25519 private key from PEM or base64 of its 32 raw bytes."""
    raw = _text(data).strip()
    try:
        if raw.startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(raw, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(base64.b64decode(raw, validate=True))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise SigningKeyError(f"the signing private key could not be read: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"the signing key must be Ed25519, not {type(key).__name__}")
    return key


def load_public_key(data: str | bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM or base64 of its 32 raw bytes."""
    raw = _text(data).strip()
    try:
        if raw.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(raw)
        else:
            key = Ed25519PublicKey.from_public_bytes(base64.b64decode(raw, validate=True))
    except (ValueError, TypeError, binascii.Error) as exc:
        raise SigningKeyError(f"the signing public key could not be read: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"the verifying key must be Ed25519, not {type(key).__name__}")
    return key


def generate_keypair() -> tuple[bytes, bytes]:
    """A new (private PEM, public PEM) pair."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public


#: File names :func:`write_keypair` uses in its directory.
PRIVATE_KEY_FILE = "recommender.key"
PUBLIC_KEY_FILE = "recommender.pub"


def write_keypair(directory: Path, *, keep_existing: bool = False) -> tuple[Path, Path, bool]:
    """Write a new pair as ``recommender.key`` (mode 0600) and ``recommender.pub``.

    Returns (private path, public path, whether a new pair was written). With
    ``keep_existing`` a directory that already holds both files is left as it is (a
    deployment's key set-up step runs on every start); without it, existing files are
    an error, so a key in use is never replaced by accident.
    """
    directory.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = directory / PRIVATE_KEY_FILE, directory / PUBLIC_KEY_FILE
    if priv_path.exists() or pub_path.exists():
        if keep_existing and priv_path.exists() and pub_path.exists():
            load_private_key(priv_path.read_bytes())  # a broken file is an error, not kept
            load_public_key(pub_path.read_bytes())
            return priv_path, pub_path, False
        raise SigningKeyError(f"{priv_path} or {pub_path} exists; not overwriting a key")
    private, public = generate_keypair()
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    pub_path.write_bytes(public)
    return priv_path, pub_path, True


class Signer:
    """Signs recommendations with the recommender's private key."""

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        self.key_id = _key_id(key.public_key())

    def sign(self, rec: Recommendation) -> Recommendation:
        unsigned = rec.model_copy(update={"signature": None, "key_id": self.key_id})
        sig = self._key.sign(signed_bytes(unsigned))
        return unsigned.model_copy(update={"signature": base64.b64encode(sig).decode()})


class Verifier:
    """Checks recommendations against the recommender's public key."""

    def __init__(self, key: Ed25519PublicKey) -> None:
        self._key = key
        self.key_id = _key_id(key)

    def problem(self, rec: Recommendation) -> str:
        """Why ``rec``'s signature is not acceptable, or "" when it is valid."""
        if not rec.signature:
            return "unsigned: this node requires recommendations signed by the recommender"
        if rec.key_id != self.key_id:
            return f"signed with unknown key {rec.key_id!r}; this node trusts {self.key_id!r}"
        try:
            sig = base64.b64decode(rec.signature, validate=True)
            self._key.verify(sig, signed_bytes(rec))
        except (InvalidSignature, binascii.Error, ValueError):
            return "forged: the signature does not match the recommendation's content"
        return ""


def _secret(value: Any) -> str | None:
    return None if value is None else str(value.get_secret_value())


def signer_from_settings(settings: Any) -> Signer | None:
    """The tuner's signer, or None when no private key is configured."""
    pem = _secret(settings.signing_private_key)
    if settings.signing_private_key_file:
        pem = Path(settings.signing_private_key_file).read_text()
    return Signer(load_private_key(pem)) if pem else None


def verifier_from_settings(settings: Any) -> Verifier | None:
    """A node's verifier, or None when no public key is configured (the node then refuses
    every recommendation, unless ``insecure_accept_unsigned`` is set)."""
    pem = settings.signing_public_key
    if settings.signing_public_key_file:
        pem = Path(settings.signing_public_key_file).read_text()
    return Verifier(load_public_key(pem)) if pem else None
