"""opcua discoveryDetails: Akri's shape accepted, our additions checked, every refusal names its
field, and the client certificate and key stay secret (never in a repr or a message)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from discovery_handlers.contract import InvalidDetails, Secret
from discovery_handlers.opcua import handler
from discovery_handlers.opcua.details import (
    DEFAULT_DISCOVERY_URL,
    FilterAction,
    NameFilter,
    SecurityMode,
)

PEM_CERT = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
PEM_KEY = b"-----BEGIN PRIVATE KEY-----\nTOP-SECRET-KEY-MATERIAL\n-----END PRIVATE KEY-----\n"
DER_CERT = bytes([0x30, 0x82, 0x01, 0x0A]) + b"\x00" * 8
AKRI_EXAMPLE = """
opcuaDiscoveryMethod:
  standard:
    discoveryUrls:
      - opc.tcp://lds.factory.example:4840/
      - opc.tcp://10.1.2.3:4841/
applicationNames:
  action: Include
  items: [Thermometer-Line-1]
"""


def test_akri_configuration_parses() -> None:
    details = handler.parse_details(AKRI_EXAMPLE, {})
    assert details.discovery_urls == ("opc.tcp://lds.factory.example:4840/",
                                      "opc.tcp://10.1.2.3:4841/")
    assert details.application_names == NameFilter(frozenset({"Thermometer-Line-1"}),
                                                   FilterAction.INCLUDE)
    assert details.security is None
    assert (details.interval_s, details.timeout_s, details.max_concurrent_checks) == (2.0, 2.0, 32)


@pytest.mark.parametrize("text", [
    "opcuaDiscoveryMethod:\n  standard: {}\n",
    "opcuaDiscoveryMethod:\n  standard:\n",
    "opcuaDiscoveryMethod:\n  standard:\n    discoveryUrls: []\n",
])
def test_default_url_is_akris(text: str) -> None:
    assert handler.parse_details(text, {}).discovery_urls == (DEFAULT_DISCOVERY_URL,)


def test_no_filter_keeps_every_name_and_a_list_without_action_includes() -> None:
    names = handler.parse_details("opcuaDiscoveryMethod: {standard: {}}", {}).application_names
    assert names.keeps("anything")
    listed = handler.parse_details("opcuaDiscoveryMethod: {standard: {}}\n"
                                   "applicationNames: {items: [a]}", {}).application_names
    assert listed.action is FilterAction.INCLUDE  # Akri's default action
    assert (listed.keeps("a"), listed.keeps("b")) == (True, False)


@pytest.mark.parametrize(("action", "name", "kept"), [
    ("Include", "a", True), ("Include", "b", False),
    ("Exclude", "a", False), ("Exclude", "b", True),
])
def test_filter_semantics(action: str, name: str, kept: bool) -> None:
    details = handler.parse_details(
        f"opcuaDiscoveryMethod: {{standard: {{}}}}\n"
        f"applicationNames: {{action: {action}, items: [a]}}", {})
    assert details.application_names.keeps(name) is kept


def test_our_additions_parse() -> None:
    details = handler.parse_details(
        "opcuaDiscoveryMethod: {standard: {}}\ndiscoveryIntervalSeconds: 0.5\n"
        "timeoutSeconds: 3\nmaxConcurrentChecks: 4\n", {})
    assert (details.interval_s, details.timeout_s, details.max_concurrent_checks) == (0.5, 3.0, 4)


BASE = "opcuaDiscoveryMethod: {standard: {}}\n"


@pytest.mark.parametrize(("text", "field"), [
    ("", "opcuaDiscoveryMethod"),
    ("applicationNames: {items: []}", "opcuaDiscoveryMethod"),
    ("opcuaDiscoveryMethod: {lds: {}}", "opcuaDiscoveryMethod"),
    ("opcuaDiscoveryMethod: {standard: [a]}", "opcuaDiscoveryMethod.standard"),
    ("opcuaDiscoveryMethod: {standard: {urls: []}}", "opcuaDiscoveryMethod.standard.urls"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: x}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['http://a:1/']}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[0]"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://a:1/', 'opc.tcp://:2/']}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[1]"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://u:p@a:1/']}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[0]"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://a:99999/']}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[0]"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: ['opc.tcp://a:1/', 'opc.tcp://a:1/']}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[1]"),
    ("opcuaDiscoveryMethod: {standard: {discoveryUrls: [7]}}",
     "opcuaDiscoveryMethod.standard.discoveryUrls[0]"),
    (BASE + "applicationNames: [a]", "applicationNames"),
    (BASE + "applicationNames: {items: a}", "applicationNames.items"),
    (BASE + "applicationNames: {items: [a, 3]}", "applicationNames.items[1]"),
    (BASE + "applicationNames: {action: Keep}", "applicationNames.action"),
    (BASE + "applicationNames: {names: []}", "applicationNames.names"),
    (BASE + "discoveryIntervalSeconds: 0", "discoveryIntervalSeconds"),
    (BASE + "discoveryIntervalSeconds: fast", "discoveryIntervalSeconds"),
    (BASE + "discoveryIntervalSeconds: .nan", "discoveryIntervalSeconds"),
    (BASE + "timeoutSeconds: true", "timeoutSeconds"),
    (BASE + "timeoutSeconds: 1000", "timeoutSeconds"),
    (BASE + "maxConcurrentChecks: 0", "maxConcurrentChecks"),
    (BASE + "maxConcurrentChecks: 2.5", "maxConcurrentChecks"),
    (BASE + "security: {policy: Basic512}", "security.policy"),
    (BASE + "security: {policy: None, mode: Sign}", "security.policy"),
    (BASE + "security: strong", "security"),
    (BASE + "security: {policy: Basic256Sha256, colour: red}", "security.colour"),
    (BASE + "colour: red", "colour"),
    ("opcuaDiscoveryMethod: [", "(root)"),
])
def test_refusals_name_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(text, {})
    assert caught.value.field == field


SECURE = BASE + "security: {policy: Basic256Sha256, mode: SignAndEncrypt}\n"


def test_security_takes_certificate_and_key_from_properties() -> None:
    details = handler.parse_details(SECURE, {
        "clientCertificate": Secret(DER_CERT),
        "clientPrivateKey": Secret(PEM_KEY),
    })
    assert details.security is not None
    assert details.security.policy == "Basic256Sha256"
    assert details.security.mode is SecurityMode.SIGN_AND_ENCRYPT
    assert details.security.private_key.value == PEM_KEY
    shown = repr(details) + str(details)
    assert "TOP-SECRET" not in shown, "the key must never appear in a repr"


def test_certificate_may_be_plain_text_but_key_must_be_secret() -> None:
    details = handler.parse_details(SECURE, {"clientCertificate": PEM_CERT.decode(),
                                             "clientPrivateKey": Secret(PEM_KEY)})
    assert details.security is not None
    assert details.security.certificate.value == PEM_CERT
    with pytest.raises(InvalidDetails, match="must come from a Secret") as caught:
        handler.parse_details(SECURE, {"clientCertificate": PEM_CERT.decode(),
                                       "clientPrivateKey": PEM_KEY.decode()})
    assert "TOP-SECRET" not in str(caught.value)


@pytest.mark.parametrize(("properties", "message"), [
    ({}, "client certificate"),
    ({"clientCertificate": Secret(PEM_CERT)}, "client private key"),
    ({"clientCertificate": Secret(b"hello"), "clientPrivateKey": Secret(PEM_KEY)},
     "neither PEM nor DER"),
    ({"clientCertificate": Secret(PEM_CERT), "clientPrivateKey": Secret(b"TOP-SECRET")},
     "neither PEM nor DER"),
])
def test_security_refusals(properties: dict[str, Secret], message: str) -> None:
    with pytest.raises(InvalidDetails, match=message) as caught:
        handler.parse_details(SECURE, dict(properties))
    assert "TOP-SECRET" not in str(caught.value)


def test_credentials_without_a_policy_are_refused() -> None:
    with pytest.raises(InvalidDetails, match="clientPrivateKey") as caught:
        handler.parse_details(BASE, {"clientPrivateKey": Secret(PEM_KEY)})
    assert caught.value.field == "security.policy"


def test_parsing_does_not_import_asyncua() -> None:
    code = ("import sys; from discovery_handlers.opcua import handler; "
            "handler.parse_details('opcuaDiscoveryMethod: {standard: {}}', {}); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncua'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", f"parse_details imported {out}"
