"""Real cameras' WS-Discovery messages, replayed through the reader.

Each file under ``tests/data/onvif/wsd`` reconstructs the shape of a message a deployed camera
(or another WS-Discovery peer) sent, from a public source named in ``tests/data/onvif/README.md``
(vendor and protocol documentation, captures published in open-source ONVIF clients' bug
reports): its envelope, prefixes, namespaces, wrappers and XAddrs lists, with our own
addresses (documentation ranges) and uuids. ``{relates_to}`` stands for the MessageID of the
Probe it answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from discovery_handlers.onvif import wsd_messages as m
from discovery_handlers.onvif.cameras import Camera, ip_address_of, service_url

WSD = Path(__file__).resolve().parents[1] / "data" / "onvif" / "wsd"
PROBE_ID = "urn:uuid:0b1e5c1e-0000-4000-8000-00000000beef"


def replay(name: str) -> m.ProbeMatches | m.Hello | m.Bye | m.Dropped | None:
    text = (WSD / name).read_text(encoding="utf-8").replace("{relates_to}", PROBE_ID)
    return m.read(text.encode())


@dataclass(frozen=True)
class Expected:
    uuid: str
    xaddrs: int  # how many HTTP XAddrs are kept
    sender: str  # the address the datagram came from
    service_url: str  # the XAddr the handler uses
    scope: str  # one scope that must be read


PROBE_MATCHES = {
    "probematches-gsoap-soap12.xml": Expected(
        "2419d68a-2dd2-21b2-a205-ec3a7c5b1a01", 1, "192.0.2.10",
        "http://192.0.2.10:8899/onvif/device_service", "onvif://www.onvif.org/name/IPC",
    ),
    "probematches-gsoap-soap11.xml": Expected(
        "11223344-5566-7788-99aa-000c12345678", 1, "192.0.2.11",
        "http://192.0.2.11:8999/onvif/device_service",
        "onvif://www.onvif.org/location/city/guangzhou",
    ),
    "probematches-hikvision-v4-v6.xml": Expected(
        "a7fc57d6-0000-11b4-82bf-a41437000001", 2, "192.0.2.12",
        "http://192.0.2.12:8059/onvif/device_service",
        "onvif://www.onvif.org/hardware/DS-2CD2612F-I",
    ),
    # the link-local IPv6 XAddr comes first; the IPv4 one is used
    "probematches-axis-v4-v6.xml": Expected(
        "5a4f5a4f-0000-4000-8000-00408c000002", 2, "192.0.2.13",
        "http://192.0.2.13/onvif/device_service", "onvif://www.onvif.org/hardware/M1014",
    ),
    "probematches-unv-tns.xml": Expected(
        "9f8e7d6c-5b4a-3928-1706-48ea63000003", 1, "192.0.2.14",
        "http://192.0.2.14/onvif/device_service", "onvif://www.onvif.org/Profile/T",
    ),
    "probematch-unwrapped-ipycam.xml": Expected(
        "c0ffee00-1234-4abc-8def-000000000004", 1, "192.0.2.15",
        "http://192.0.2.15:8080/onvif/device_service", "onvif://www.onvif.org/Profile/Streaming",
    ),
    # host name, IPv6, IPv4; answered from IPv6: the IPv6 one
    "probematches-wsd11.xml": Expected(
        "98190dc2-0890-4ef8-ac9a-5940995e6119", 3, "2001:db8::42",
        "http://[2001:db8::42]/onvif/device_service",
        "onvif://www.onvif.org/location/building/42",
    ),
}


@pytest.mark.parametrize("name", sorted(PROBE_MATCHES))
def test_probe_matches_of_real_cameras(name: str) -> None:
    expected = PROBE_MATCHES[name]
    message = replay(name)
    assert isinstance(message, m.ProbeMatches), message
    assert message.relates_to == PROBE_ID
    assert message.dropped == ()
    (match,) = message.matches
    assert match.uuid == expected.uuid
    assert len(match.xaddrs) == expected.xaddrs
    assert expected.scope in match.scopes
    assert service_url(match.xaddrs, expected.sender) == expected.service_url
    camera = Camera(match=match, source=expected.sender, last_seen=0.0)
    assert ip_address_of(camera) == expected.sender


def test_a_camera_announced_by_a_host_name_only_is_reached_by_it() -> None:
    message = replay("probematches-wsd11.xml")
    assert isinstance(message, m.ProbeMatches)
    (match,) = message.matches
    hostname_only = m.Match(match.uuid, match.xaddrs[:1], match.scopes)
    camera = Camera(match=hostname_only, source="192.0.2.42", last_seen=0.0)
    assert camera.service_url == "http://cam-42.example.org/onvif/device_service"
    assert ip_address_of(camera) == "192.0.2.42"  # the sender's, as the host is no address


def test_hello_and_bye_of_a_camera_with_the_reference_in_the_discovery_namespace() -> None:
    hello = replay("hello-ipycam.xml")
    assert isinstance(hello, m.Hello)
    assert hello.match.uuid == "c0ffee00-1234-4abc-8def-000000000004"
    assert replay("bye-ipycam.xml") == m.Bye("c0ffee00-1234-4abc-8def-000000000004")


def test_a_computers_hello_is_dropped_quietly() -> None:
    dropped = replay("hello-windows-pc.xml")
    assert isinstance(dropped, m.Dropped)
    assert dropped.quiet
    assert "not a NetworkVideoTransmitter" in dropped.reason


def test_a_camera_refusing_our_probe_is_dropped_with_its_reason() -> None:
    dropped = replay("fault-probe-hikvision.xml")
    assert isinstance(dropped, m.Dropped)
    assert not dropped.quiet
    assert "MatchingRuleNotSupported" in dropped.reason
    assert "the xml format error" in dropped.reason
