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


class PrivateCA:
    """A CA of the test's own (its certificate in ``ca.pem`` of ``d``), issuing a
    broker's keystore and clients' certificates as PEM files in ``d``."""

    def __init__(self, d: Path) -> None:
        self.dir = d
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._cert = _issue("ks-test-ca", self._key, "ks-test-ca", self._key)
        self.path = d / "ca.pem"
        self.path.write_bytes(self._cert)

    def broker_keystore(self) -> Path:
        """The broker's key (unencrypted PKCS#8), then its certificate for 127.0.0.1 and
        this CA's: what :class:`~kernelstream.app.kafka.apache.SecuredListeners` takes."""
        key = ec.generate_private_key(ec.SECP256R1())
        keystore = self.dir / "broker.pem"
        keystore.write_bytes(
            key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
            + _issue("ks-broker", key, "ks-test-ca", self._key, ip="127.0.0.1")
            + self._cert
        )
        return keystore

    def client(self, cn: str, password: bytes = b"pw") -> tuple[Path, Path]:
        """(a client certificate of subject ``CN=cn``, its key encrypted with
        ``password``) for mutual TLS."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert_file, key_file = self.dir / f"{cn}.pem", self.dir / f"{cn}.key"
        cert_file.write_bytes(_issue(cn, key, "ks-test-ca", self._key))
        key_file.write_bytes(
            key.private_bytes(
                _PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.BestAvailableEncryption(password),
            )
        )
        return cert_file, key_file


def client_pki(d: Path) -> tuple[Path, Path, Path]:
    """(the CA's certificate, a client certificate it signed, the client's key encrypted
    with the password ``pw``), as PEM files in ``d``."""
    ca = PrivateCA(d)
    cert, key = ca.client("ks-node")
    return ca.path, cert, key
