"""The webhook's certificate rules at any date: made, kept, renewed before expiry, CA rotated
with the old one still trusted.

Rotation happens months apart in a real cluster; these tests move ``now`` instead of waiting,
and check each certificate the way a TLS client would (issuer signature, names, validity
window).
"""

from __future__ import annotations

import datetime

from cryptography import x509

from controller.webhook.certs import (
    CA_RENEW_BEFORE,
    CA_VALIDITY,
    DAY,
    SERVING_RENEW_BEFORE,
    SERVING_VALIDITY,
    Names,
    TlsState,
    plan,
)

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NAMES = Names(dns=("hook.edgeplug-system", "hook.edgeplug-system.svc"), ips=("127.0.0.1",))


def _cert(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def _trusted_at(state: TlsState, serving: bytes, when: datetime.datetime) -> bool:
    """Whether a client trusting ``state``'s caBundle accepts ``serving`` at ``when``."""
    cert = _cert(serving)
    if not cert.not_valid_before_utc <= when <= cert.not_valid_after_utc:
        return False
    for ca in x509.load_pem_x509_certificates(state.ca_bundle()):
        if ca.not_valid_before_utc <= when <= ca.not_valid_after_utc:
            try:
                cert.verify_directly_issued_by(ca)
            except Exception:
                continue
            return True
    return False


def _sans(pem: bytes) -> tuple[list[str], list[str]]:
    ext = _cert(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (ext.get_values_for_type(x509.DNSName),
            [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)])


def test_first_state_serves_the_names_and_is_trusted() -> None:
    state = plan(None, NAMES, NOW)
    assert _sans(state.cert) == (list(NAMES.dns), list(NAMES.ips))
    assert _trusted_at(state, state.cert, NOW)
    assert _cert(state.cert).not_valid_after_utc == NOW + SERVING_VALIDITY
    assert _cert(state.ca_cert).not_valid_after_utc == NOW + CA_VALIDITY
    assert state.previous_ca == b""


def test_nothing_renewed_while_far_from_expiry() -> None:
    state = plan(None, NAMES, NOW)
    assert plan(state, NAMES, NOW + 30 * DAY) == state


def test_serving_certificate_renewed_before_it_expires_by_the_same_ca() -> None:
    state = plan(None, NAMES, NOW)
    later = NOW + SERVING_VALIDITY - SERVING_RENEW_BEFORE + DAY
    renewed = plan(state, NAMES, later)
    assert renewed.ca_cert == state.ca_cert
    assert renewed.cert != state.cert
    assert _trusted_at(renewed, renewed.cert, later)
    assert _trusted_at(renewed, state.cert, later)  # a replica not yet reloaded still works


def test_ca_rotated_before_expiry_with_the_old_one_kept_in_the_bundle() -> None:
    state = plan(None, NAMES, NOW)
    later = NOW + CA_VALIDITY - CA_RENEW_BEFORE + DAY
    # The serving certificate was renewed on time in between; it is still the old CA's.
    state = plan(state, NAMES, later - 2 * DAY)
    rotated = plan(state, NAMES, later)
    assert rotated.ca_cert != state.ca_cert
    assert rotated.previous_ca == state.ca_cert
    assert _trusted_at(rotated, rotated.cert, later)
    assert _trusted_at(rotated, state.cert, later)  # the old CA's certificate, still trusted
    # By the time the first CA expires the second is due too: the first leaves the bundle,
    # which never holds more than two CAs.
    gone = plan(rotated, NAMES, NOW + CA_VALIDITY + DAY)
    assert state.ca_cert not in gone.ca_bundle()
    assert gone.previous_ca == rotated.ca_cert
    assert _trusted_at(gone, gone.cert, NOW + CA_VALIDITY + DAY)


def test_changed_names_get_a_new_serving_certificate() -> None:
    state = plan(None, NAMES, NOW)
    moved = Names(dns=("other.ns.svc",))
    renewed = plan(state, moved, NOW + DAY)
    assert _sans(renewed.cert) == (["other.ns.svc"], [])
    assert renewed.ca_cert == state.ca_cert


def test_unreadable_secret_data_is_none_and_a_serving_cert_of_another_ca_is_replaced() -> None:
    state = plan(None, NAMES, NOW)
    assert TlsState.from_data({}) is None
    assert TlsState.from_data({**state.to_data(), "tls.crt": b"garbage"}) is None
    assert TlsState.from_data(state.to_data()) == state
    foreign = plan(None, NAMES, NOW)
    mixed = TlsState(state.ca_cert, state.ca_key, foreign.cert, foreign.key)
    fixed = plan(mixed, NAMES, NOW)
    assert fixed.cert != foreign.cert
    assert _trusted_at(fixed, fixed.cert, NOW)
