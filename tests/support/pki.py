"""Keys and certificates for 127.0.0.1, made in the test (no openssl command): self-signed ones, and a
private CA with server and client certificates it signs (mutual TLS)."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _write(directory: Path, name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate,
           passphrase: bytes | None = None) -> tuple[Path, Path]:
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.BestAvailableEncryption(passphrase) if passphrase
                                           else serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             not_after: datetime.datetime | None = None) -> x509.CertificateBuilder:
    """Valid from 5 minutes ago until `not_after`, by default for 90 days (Let's Encrypt's lifetime: a
    server warns of one with 14 days or less left)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ends = not_after or now + datetime.timedelta(days=90)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(now - datetime.timedelta(minutes=5), ends - datetime.timedelta(days=1)))
            .not_valid_after(ends))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


_LOOPBACK = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])


def key_and_cert(directory: Path, name: str, passphrase: bytes | None = None,
                 not_after: datetime.datetime | None = None) -> tuple[Path, Path]:
    """`name`.key and `name`.pem in `directory`: an EC key (encrypted with `passphrase` where given) and a
    self-signed certificate of CN `name` for 127.0.0.1 (valid until `not_after`, see `_builder`), a new
    serial number each time."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(_name(name), _name(name), key, not_after).add_extension(_LOOPBACK, critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(directory, name, key, cert, passphrase)


def ca(directory: Path, name: str) -> tuple[Path, Path]:
    """`name`.key and `name`.pem: a private CA (a self-signed certificate that may sign others, and no
    more: it names no host)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(_name(name), _name(name), key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(directory, name, key, cert)


def signed(directory: Path, name: str, by: tuple[Path, Path], *, client: bool = False) -> tuple[Path, Path]:
    """`name`.key and `name`.pem: a leaf certificate of CN `name` signed by the CA `by` (its key, its
    certificate), a server's for 127.0.0.1 or, with `client`, a client's. A new key and serial each time."""
    ca_key = serialization.load_pem_private_key(by[0].read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(by[1].read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (_builder(_name(name), ca_cert.subject, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if not client:
        builder = builder.add_extension(_LOOPBACK, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return _write(directory, name, key, cert)
