"""Certificates of a private CA for the security tests: a client's, and a broker's.

Made with ``cryptography`` (EC P-256, SHA-256), valid for a day from five minutes ago.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_PEM = serialization.Encoding.PEM


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    signer: ec.EllipticCurvePrivateKey,
    ip: str | None = None,
) -> bytes:
    """A certificate of ``subject`` for ``key``, signed by ``signer`` (a CA's when
    ``subject == issuer``); ``ip``: the address it names, for a server."""
    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=subject == issuer, path_length=None), True)
    )
    if ip is not None:
        san = [x509.IPAddress(ipaddress.ip_address(ip)), x509.DNSName("localhost")]
        b = b.add_extension(x509.SubjectAlternativeName(san), False)
    return b.sign(signer, hashes.SHA256()).public_bytes(_PEM)


def _ca(d: Path) -> tuple[Path, bytes, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue("ks-test-ca", key, "ks-test-ca", key)
    path = d / "ca.pem"
    path.write_bytes(cert)
    return path, cert, key


def client_pki(d: Path) -> tuple[Path, Path, Path]:
    """(the CA's certificate, a client certificate it signed, the client's key encrypted
    with the password ``pw``), as PEM files in ``d``."""
    ca, _, ca_key = _ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    cert_file, key_file = d / "client.pem", d / "client.key"
    cert_file.write_bytes(_issue("ks-node", key, "ks-test-ca", ca_key))
    key_file.write_bytes(
        key.private_bytes(
            _PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pw"),
        )
    )
    return ca, cert_file, key_file


def broker_pki(d: Path) -> tuple[Path, Path]:
    """(the CA's certificate, the broker's keystore: its key, unencrypted PKCS#8, then
    its certificate for 127.0.0.1 and the CA's), as PEM files in ``d``: what
    :class:`~kernelstream.app.kafka.apache.SaslSslListener` takes."""
    ca, ca_cert, ca_key = _ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    keystore = d / "broker.pem"
    keystore.write_bytes(
        key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + _issue("ks-broker", key, "ks-test-ca", ca_key, ip="127.0.0.1")
        + ca_cert
    )
    return ca, keystore
