"""The webhook's own certificate authority and serving certificate: made, checked and rotated.

Pure functions over PEM bytes, no I/O (``now`` is a parameter): ``plan`` says what to make or
renew, keeping an old CA in the bundle until it expires so rotation never breaks a call."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

DAY: Final = datetime.timedelta(days=1)
CA_VALIDITY: Final = 730 * DAY
SERVING_VALIDITY: Final = 365 * DAY
#: A serving certificate is renewed when less than this is left (about four months).
SERVING_RENEW_BEFORE: Final = 120 * DAY
#: A CA is renewed while it can still outlive one full serving certificate's renewal window.
CA_RENEW_BEFORE: Final = SERVING_VALIDITY + 30 * DAY
#: Certificates start a little in the past: clocks of API server and controller may differ.
CLOCK_SKEW: Final = datetime.timedelta(minutes=5)
CA_NAME: Final = "edgeplug-controller-webhook-ca"
#: Keys of the Secret that holds the certificates (``tls.crt``/``tls.key``: kubernetes.io/tls).
CA_CERT_KEY: Final = "ca.crt"
CA_KEY_KEY: Final = "ca.key"
PREVIOUS_CA_KEY: Final = "ca-previous.crt"
CERT_KEY: Final = "tls.crt"
KEY_KEY: Final = "tls.key"


@dataclass(frozen=True)
class Names:
    """What the serving certificate must be valid for."""

    dns: tuple[str, ...]
    ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class TlsState:
    """PEM bytes: the current CA and its key, the serving certificate and key, the old CA."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    previous_ca: bytes = b""

    def to_data(self) -> dict[str, bytes]:
        data = {CA_CERT_KEY: self.ca_cert, CA_KEY_KEY: self.ca_key, CERT_KEY: self.cert,
                KEY_KEY: self.key}
        if self.previous_ca:
            data[PREVIOUS_CA_KEY] = self.previous_ca
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, bytes]) -> TlsState | None:
        """The state a Secret holds, or None when a part is missing or unreadable."""
        try:
            state = cls(ca_cert=data[CA_CERT_KEY], ca_key=data[CA_KEY_KEY],
                        cert=data[CERT_KEY], key=data[KEY_KEY],
                        previous_ca=data.get(PREVIOUS_CA_KEY, b""))
            x509.load_pem_x509_certificate(state.ca_cert)
            x509.load_pem_x509_certificate(state.cert)
            serialization.load_pem_private_key(state.ca_key, password=None)
            serialization.load_pem_private_key(state.key, password=None)
            if state.previous_ca:
                x509.load_pem_x509_certificate(state.previous_ca)
        except (KeyError, ValueError, TypeError):
            return None
        return state

    def ca_bundle(self) -> bytes:
        """What the API server must trust: the current CA, and the previous one if kept."""
        return self.ca_cert + self.previous_ca


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(now: datetime.datetime) -> tuple[bytes, bytes]:
    """A new self-signed CA: (certificate PEM, key PEM)."""
    key = _key()
    name = _name(CA_NAME)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving(ca_cert: bytes, ca_key: bytes, names: Names,
                 now: datetime.datetime) -> tuple[bytes, bytes]:
    """A serving certificate for ``names`` signed by the CA: (certificate PEM, key PEM)."""
    issuer = x509.load_pem_x509_certificate(ca_cert)
    signer = serialization.load_pem_private_key(ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names.dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in names.ips]
    not_after = min(now + SERVING_VALIDITY, issuer.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder().subject_name(_name(names.dns[0] if names.dns else "webhook"))
        .issuer_name(issuer.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW).not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(signer, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _sans(cert: x509.Certificate) -> Names:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return Names(dns=())
    return Names(dns=tuple(ext.get_values_for_type(x509.DNSName)),
                 ips=tuple(str(ip) for ip in ext.get_values_for_type(x509.IPAddress)))


def _same_names(a: Names, b: Names) -> bool:
    return sorted(a.dns) == sorted(b.dns) and sorted(a.ips) == sorted(b.ips)


def plan(state: TlsState | None, names: Names, now: datetime.datetime) -> TlsState:
    """The state to keep: ``state`` itself when nothing needs renewing, else a renewed one."""
    if state is None:
        ca_cert, ca_key = make_ca(now)
        return TlsState(ca_cert, ca_key, *make_serving(ca_cert, ca_key, names, now))
    ca = x509.load_pem_x509_certificate(state.ca_cert)
    kept = state
    if state.previous_ca:
        previous = x509.load_pem_x509_certificate(state.previous_ca)
        if previous.not_valid_after_utc <= now:
            kept = replace(kept, previous_ca=b"")
    if ca.not_valid_after_utc - now < CA_RENEW_BEFORE:
        ca_cert, ca_key = make_ca(now)
        old = state.ca_cert if ca.not_valid_after_utc > now else b""
        return TlsState(ca_cert, ca_key, *make_serving(ca_cert, ca_key, names, now),
                        previous_ca=old)
    cert = x509.load_pem_x509_certificate(state.cert)
    stale = (
        cert.not_valid_after_utc - now < SERVING_RENEW_BEFORE
        or cert.issuer != ca.subject
        or not _signed_by(cert, ca)
        or not _same_names(_sans(cert), names)
    )
    if stale:
        cert_pem, key_pem = make_serving(state.ca_cert, state.ca_key, names, now)
        return replace(kept, cert=cert_pem, key=key_pem)
    return kept


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def expiry(pem: bytes) -> datetime.datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def names_of(dns: Sequence[str], ips: Sequence[str]) -> Names:
    return Names(dns=tuple(dns), ips=tuple(ips))
