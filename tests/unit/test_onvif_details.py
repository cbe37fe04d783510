"""ONVIF details and credentials: Akri's shapes accepted, bad input named, no secret shown."""

from __future__ import annotations

import base64
import json

import pytest

from discovery_handlers.contract import InvalidDetails, Secret
from discovery_handlers.onvif import handler
from discovery_handlers.onvif.details import (
    DEFAULT_DISCOVERY_INTERVAL_S,
    FilterAction,
    FilterList,
    UnicastTarget,
)

AKRI_DETAILS = """
ipAddresses:
  action: Exclude
  items: [10.0.0.1, 10.0.1.0/24]
macAddresses:
  action: Include
  items: ["AA-BB-CC-DD-EE-FF"]
scopes:
  items: [onvif://www.onvif.org/name/dock]
uuids:
  action: Exclude
  items: ["urn:uuid:3FA1FE68-B915-4053-A3E1-AC15A21F5F91"]
discoveryTimeoutSeconds: 2
"""


def test_akri_details_parse_with_normalised_items() -> None:
    details = handler.parse_details(AKRI_DETAILS, {})
    assert details.ip_addresses == FilterList(
        items=("10.0.0.1/32", "10.0.1.0/24"), action=FilterAction.EXCLUDE
    )
    assert details.mac_addresses == FilterList(items=("aa:bb:cc:dd:ee:ff",))
    assert details.scopes == FilterList(items=("onvif://www.onvif.org/name/dock",))
    assert details.uuids is not None
    assert details.uuids.items == ("3fa1fe68-b915-4053-a3e1-ac15a21f5f91",)
    assert details.discovery_timeout_s == 2.0
    assert details.discovery_interval_s == DEFAULT_DISCOVERY_INTERVAL_S
    assert details.multicast
    assert details.ipv6


def test_empty_details_mean_every_camera_with_akri_defaults() -> None:
    details = handler.parse_details("", {})
    assert details.discovery_timeout_s == 1.0
    assert details.ip_addresses is None
    assert details.unicast_targets == ()


def test_unicast_targets_expand_hosts_ports_and_ranges() -> None:
    details = handler.parse_details(
        "unicastTargets: [192.0.2.7, '192.0.2.8:3800', '[fd00::5]:3702', fd00::6, 198.51.100.0/30]",
        {},
    )
    assert details.unicast_targets == (
        UnicastTarget("192.0.2.7"),
        UnicastTarget("192.0.2.8", 3800),
        UnicastTarget("fd00::5"),
        UnicastTarget("fd00::6"),
        UnicastTarget("198.51.100.1"),
        UnicastTarget("198.51.100.2"),
    )


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("- a list", "(root)", "mapping"),
        ("ipAddress: {}", "ipAddress", "unknown field"),
        ("scopes: [a]", "scopes", "items"),
        ("scopes: {items: [a], action: include}", "scopes.action", "Include or Exclude"),
        ("scopes: {items: [a], kind: x}", "scopes.kind", "unknown"),
        ("scopes: {items: a}", "scopes.items", "list"),
        ("scopes: {items: ['']}", "scopes.items[0]", "non-empty"),
        ("ipAddresses: {items: [10.0.0.300]}", "ipAddresses.items[0]", "not an IP"),
        ("macAddresses: {items: [zz:zz]}", "macAddresses.items[0]", "not a MAC"),
        ("discoveryTimeoutSeconds: 0", "discoveryTimeoutSeconds", "more than 0"),
        ("discoveryTimeoutSeconds: fast", "discoveryTimeoutSeconds", "number"),
        ("discoveryTimeoutSeconds: true", "discoveryTimeoutSeconds", "number"),
        ("discoveryIntervalSeconds: 0.1", "discoveryIntervalSeconds", "at least 0.5"),
        (
            "{discoveryTimeoutSeconds: 5, discoveryIntervalSeconds: 2}",
            "discoveryIntervalSeconds",
            "at least discoveryTimeoutSeconds",
        ),
        ("unicastTargets: 10.0.0.1", "unicastTargets", "list"),
        ("unicastTargets: [camera.local]", "unicastTargets[0]", "not an IP"),
        ("unicastTargets: ['10.0.0.1:99999']", "unicastTargets[0]", "port"),
        ("unicastTargets: [10.0.0.0/8]", "unicastTargets[0]", "at most 4096"),
        ("unicastTargets: [10.0.0.0/33]", "unicastTargets[0]", "CIDR"),
        ("multicast: false", "multicast", "unicastTargets"),
        ("ipv6: maybe", "ipv6", "true or false"),
        ("a: [unclosed", "(root)", "YAML"),
    ],
)
def test_bad_details_name_the_field(text: str, field: str, words: str) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details(text, {})
    assert caught.value.field == field
    assert words in caught.value.reason


UUID = "6a67158b-42b1-400b-8afe-1bec9a5d7919"


def test_credentials_by_uuid_with_underscores_then_default() -> None:
    details = handler.parse_details(
        "",
        {
            "username_" + UUID.replace("-", "_"): Secret(b"cam-user"),
            "password_" + UUID.replace("-", "_"): Secret(b"cam-pass"),
            "username_default": "anyone",
            "password_default": Secret(b"fallback"),
        },
    )
    own = details.credentials.lookup(f"urn:uuid:{UUID.upper()}")
    assert own is not None
    assert (own.username, own.password) == ("cam-user", "cam-pass")
    other = details.credentials.lookup("00000000-0000-0000-0000-000000000000")
    assert other is not None
    assert (other.username, other.password) == ("anyone", "fallback")


def test_credential_lists_and_ref_lists_in_akri_order() -> None:
    listed = {
        UUID: {"username": "admin", "password": base64.b64encode(b"s3cret").decode(),
               "base64encoded": True},
        "5f5a69c2-e0ae-504f-829b-00fcdab169cc": {"username": "admin", "password": "listed"},
    }
    refs = {"5f5a69c2-e0ae-504f-829b-00fcdab169cc": {"username_ref": "u1", "password_ref": "p1"}}
    details = handler.parse_details(
        "",
        {
            "device_credential_list": '["list1"]',
            "list1": Secret(json.dumps(listed).encode()),
            "device_credential_ref_list": '["refs1"]',
            "refs1": json.dumps(refs),
            "u1": Secret(b"ref-user"),
            "p1": Secret(b"ref-pass"),
        },
    )
    first = details.credentials.lookup(UUID)
    assert first is not None
    assert first.password == "s3cret"
    second = details.credentials.lookup("5f5a69c2-e0ae-504f-829b-00fcdab169cc")
    assert second is not None
    assert (second.username, second.password) == ("ref-user", "ref-pass")
    assert details.credentials.lookup("unknown") is None


@pytest.mark.parametrize(
    ("properties", "field"),
    [
        ({"device_credential_list": "not json"}, "discoveryProperties.device_credential_list"),
        ({"device_credential_list": '["missing"]'}, "discoveryProperties.device_credential_list"),
        (
            {"device_credential_list": '["l"]', "l": Secret(b"{hunter2")},
            "discoveryProperties.l",
        ),
        (
            {"device_credential_list": '["l"]', "l": Secret(b'{"x": {"password": "hunter2"}}')},
            "discoveryProperties.l",
        ),
        (
            {"device_credential_ref_list": '["r"]', "r": '{"x": {"username_ref": "nope"}}'},
            "discoveryProperties.r",
        ),
        # A username (from a Secret) where a property name was expected: the entry is named by
        # its position; neither the name it holds nor its map key is quoted.
        (
            {"device_credential_ref_list": '["r"]',
             "r": Secret(b'{"hunter2-uuid": {"username_ref": "hunter2"}}')},
            "discoveryProperties.r",
        ),
        (
            {"device_credential_list": '["hunter2"]'},
            "discoveryProperties.device_credential_list",
        ),
    ],
)
def test_bad_credential_properties_are_named_never_quoted(
    properties: dict[str, str | Secret], field: str
) -> None:
    with pytest.raises(InvalidDetails) as caught:
        handler.parse_details("", properties)
    assert caught.value.field == field
    assert "hunter2" not in str(caught.value)
    assert "entry 1" in str(caught.value) or "JSON" in str(caught.value)


def test_no_secret_in_the_repr_of_parsed_details() -> None:
    details = handler.parse_details(
        "", {"username_default": Secret(b"admin-name"), "password_default": Secret(b"hunter2")}
    )
    shown = repr(details) + str(details) + repr(details.credentials)
    assert "hunter2" not in shown
    assert "admin-name" not in shown
    assert details.credentials.default is not None
    assert "hunter2" not in repr(details.credentials.default)


def test_parse_details_does_not_need_the_vendor_library() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['onvif'] = None; sys.modules['zeep'] = None; "
        "sys.modules['lxml'] = None\n"
        "from discovery_handlers.onvif import handler\n"
        "print(handler.parse_details('scopes: {items: [a]}', {}).scopes)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "FilterList" in result.stdout
