"""WS-Discovery messages: our Probe is valid XML; odd or hostile answers are read safely."""

from __future__ import annotations

import pytest
from lxml import etree

from discovery_handlers.onvif import wsd_messages as m
from discovery_handlers.onvif.xmlsafe import MAX_DATAGRAM_BYTES, UnsafeXml

UUID = "3fa1fe68-b915-4053-a3e1-ac15a21f5f91"
HEAD = (
    '<s:Envelope xmlns:s="http://www.w3.org/2003/05/soap-envelope" '
    'xmlns:a="http://schemas.xmlsoap.org/ws/2004/08/addressing" '
    'xmlns:d="http://schemas.xmlsoap.org/ws/2005/04/discovery" '
    'xmlns:dn="http://www.onvif.org/ver10/network/wsdl" '
    'xmlns:tds="http://www.onvif.org/ver10/device/wsdl">'
)


def matches(relates: str, inner: str) -> bytes:
    return (
        f"{HEAD}<s:Header><a:RelatesTo>{relates}</a:RelatesTo></s:Header>"
        f"<s:Body><d:ProbeMatches>{inner}</d:ProbeMatches></s:Body></s:Envelope>"
    ).encode()


def match(
    *,
    uuid: str = UUID,
    types: str = "dn:NetworkVideoTransmitter tds:Device",
    scopes: str = "onvif://www.onvif.org/name/a onvif://www.onvif.org/location/dock",
    xaddrs: str = "http://10.0.0.5/onvif/device_service",
    tag: str = "ProbeMatch",
) -> str:
    return (
        f"<d:{tag}><a:EndpointReference><a:Address>urn:uuid:{uuid}</a:Address>"
        f"</a:EndpointReference><d:Types>{types}</d:Types><d:Scopes>{scopes}</d:Scopes>"
        f"<d:XAddrs>{xaddrs}</d:XAddrs><d:MetadataVersion>3</d:MetadataVersion></d:{tag}>"
    )


def test_probe_declares_the_namespace_of_its_type() -> None:
    root = etree.fromstring(m.probe("urn:uuid:1"))
    path = f"{{{m.NS_SOAP12}}}Body/{{{m.NS_DISCOVERY}}}Probe/{{{m.NS_DISCOVERY}}}Types"
    types = root.find(path)
    assert types is not None
    assert types.text == "dn:NetworkVideoTransmitter"
    assert types.nsmap["dn"] == m.NS_NETWORK
    assert root.findtext(f"{{{m.NS_SOAP12}}}Header/{{{m.NS_ADDRESSING}}}MessageID") == "urn:uuid:1"


def test_probe_matches_with_odd_spacing_and_several_xaddrs() -> None:
    inner = match(
        scopes="\n  onvif://www.onvif.org/name/a \t\t onvif://www.onvif.org/hardware/x  \n",
        xaddrs=" http://10.0.0.5/onvif/device_service  http://[fd00::5]/onvif/device_service ",
    )
    message = m.read(matches("urn:uuid:probe", inner))
    assert isinstance(message, m.ProbeMatches)
    assert message.relates_to == "urn:uuid:probe"
    (found,) = message.matches
    assert found.uuid == UUID
    assert found.scopes == ("onvif://www.onvif.org/name/a", "onvif://www.onvif.org/hardware/x")
    assert found.xaddrs == (
        "http://10.0.0.5/onvif/device_service",
        "http://[fd00::5]/onvif/device_service",
    )
    assert found.metadata_version == 3


@pytest.mark.parametrize(
    ("inner", "kept"),
    [
        (match(), 1),
        (match(types="tds:Device"), 0),  # not a video transmitter
        (match(types="other:NetworkVideoTransmitter"), 1),  # undeclared prefix: lenient
        (match(xaddrs="ftp://10.0.0.5/ file:///etc/passwd"), 0),  # no usable XAddr
        (match(xaddrs=""), 0),
        (match(uuid=""), 0),
        (match() + match(uuid="00000000-0000-0000-0000-000000000001"), 2),
    ],
)
def test_which_probe_matches_are_kept(inner: str, kept: int) -> None:
    message = m.read(matches("urn:uuid:p", inner))
    assert isinstance(message, m.ProbeMatches)
    assert len(message.matches) == kept


def test_types_in_a_foreign_namespace_are_refused() -> None:
    inner = match().replace(
        "<d:Types>dn:NetworkVideoTransmitter tds:Device",
        '<d:Types xmlns:x="urn:evil">x:NetworkVideoTransmitter',
    )
    message = m.read(matches("urn:uuid:p", inner))
    assert isinstance(message, m.ProbeMatches)
    assert message.matches == ()


def test_hello_and_bye() -> None:
    hello = m.read(f"{HEAD}<s:Body>{match(tag='Hello')}</s:Body></s:Envelope>".encode())
    assert isinstance(hello, m.Hello)
    assert hello.match.uuid == UUID
    bye = m.read(
        f"{HEAD}<s:Body><d:Bye><a:EndpointReference><a:Address>urn:uuid:{UUID.upper()}"
        "</a:Address></a:EndpointReference></d:Bye></s:Body></s:Envelope>".encode()
    )
    assert bye == m.Bye(UUID)


def test_a_probe_from_someone_else_is_not_acted_on() -> None:
    assert m.read(m.probe("urn:uuid:x")) is None


BOMB = (
    b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
    b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><d>&b;</d>'
)
XXE = b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file:///etc/passwd">]><d>&x;</d>'


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"<s:Envelope><unclosed>", "well-formed"),
        (b"\xff\xfe\x00garbage", "well-formed"),
        (BOMB, "DTD"),
        (XXE, "DTD"),
        (b"<x>" + b"a" * MAX_DATAGRAM_BYTES + b"</x>", "limit"),
        (b"<root/>", "not a SOAP"),
        (f"{HEAD}</s:Envelope>".encode(), "without a body"),
    ],
)
def test_hostile_datagrams_are_refused_with_a_reason(data: bytes, words: str) -> None:
    with pytest.raises(UnsafeXml) as caught:
        m.read(data)
    assert words in str(caught.value)
    assert "passwd" not in str(caught.value)


def test_caps_on_what_one_message_carries() -> None:
    inner = "".join(
        match(uuid=f"00000000-0000-0000-0000-{i:012d}") for i in range(m.MAX_MATCHES + 10)
    )
    message = m.read(matches("urn:uuid:p", inner))
    assert isinstance(message, m.ProbeMatches)
    assert len(message.matches) == m.MAX_MATCHES


SOAP_VERSIONS = {"1.2": m.NS_SOAP12, "1.1": m.NS_SOAP11}
ADDRESSING = {"2004/08": m.NS_ADDRESSING, "2005/08": m.NS_ADDRESSING_2005}
DISCOVERY = {"2005/04": m.NS_DISCOVERY, "1.1": m.NS_DISCOVERY_11}


def variant(soap: str, addressing: str, discovery: str, *, wrapped: bool, epr_in: str) -> bytes:
    """A ProbeMatches in the given namespaces; ``epr_in``: 'a' (addressing) or 'd' (discovery)."""
    match_xml = (
        f"<d:ProbeMatch><{epr_in}:EndpointReference><{epr_in}:Address>urn:uuid:{UUID}"
        f"</{epr_in}:Address></{epr_in}:EndpointReference>"
        "<d:Types>dn:NetworkVideoTransmitter</d:Types><d:Scopes>onvif://www.onvif.org/name/v"
        "</d:Scopes><d:XAddrs>http://10.0.0.5/onvif/device_service</d:XAddrs></d:ProbeMatch>"
    )
    body = f"<d:ProbeMatches>{match_xml}</d:ProbeMatches>" if wrapped else match_xml
    return (
        f'<e:Envelope xmlns:e="{soap}" xmlns:a="{addressing}" xmlns:d="{discovery}" '
        f'xmlns:dn="{m.NS_NETWORK}"><e:Header><a:RelatesTo>urn:uuid:p</a:RelatesTo></e:Header>'
        f"<e:Body>{body}</e:Body></e:Envelope>"
    ).encode()


@pytest.mark.parametrize("soap", sorted(SOAP_VERSIONS))
@pytest.mark.parametrize("addressing", sorted(ADDRESSING))
@pytest.mark.parametrize("discovery", sorted(DISCOVERY))
@pytest.mark.parametrize("wrapped", [True, False])
@pytest.mark.parametrize("epr_in", ["a", "d"])
def test_probe_matches_in_every_namespace_cameras_use(
    soap: str, addressing: str, discovery: str, wrapped: bool, epr_in: str
) -> None:
    data = variant(
        SOAP_VERSIONS[soap], ADDRESSING[addressing], DISCOVERY[discovery],
        wrapped=wrapped, epr_in=epr_in,
    )
    message = m.read(data)
    assert isinstance(message, m.ProbeMatches)
    assert message.relates_to == "urn:uuid:p"
    (found,) = message.matches
    assert found.uuid == UUID
    assert found.xaddrs == ("http://10.0.0.5/onvif/device_service",)


def test_a_foreign_namespace_is_not_taken_for_discovery() -> None:
    data = variant(m.NS_SOAP12, m.NS_ADDRESSING, "urn:not-discovery", wrapped=True, epr_in="a")
    assert m.read(data) is None


@pytest.mark.parametrize(
    ("inner", "reason"),
    [
        (match(xaddrs=""), "gives no XAddrs"),
        (match(xaddrs="ftp://10.0.0.5/ soap.udp://10.0.0.5:3702"), "gives no HTTP XAddr"),
        (match(types="tds:Device"), "not a NetworkVideoTransmitter"),
        (match(uuid=""), "no EndpointReference Address"),
        (match().replace("a:EndpointReference", "a:Other"), "no EndpointReference"),
    ],
)
def test_each_dropped_probe_match_says_why(inner: str, reason: str) -> None:
    good = match(uuid="00000000-0000-0000-0000-00000000000b")
    message = m.read(matches("urn:uuid:p", inner + good))
    assert isinstance(message, m.ProbeMatches)
    assert len(message.matches) == 1  # the good one beside it is kept
    (why,) = message.dropped
    assert reason in why


def test_a_probe_match_without_types_answers_our_probe_but_a_hello_must_say() -> None:
    untyped = match().replace("<d:Types>dn:NetworkVideoTransmitter tds:Device</d:Types>", "")
    message = m.read(matches("urn:uuid:p", untyped))
    assert isinstance(message, m.ProbeMatches)
    assert len(message.matches) == 1
    hello = m.read(f"{HEAD}<s:Body>{untyped.replace('ProbeMatch', 'Hello')}</s:Body>"
                   "</s:Envelope>".encode())
    assert isinstance(hello, m.Dropped)
    assert hello.quiet


def test_a_soap_fault_is_dropped_with_its_codes_and_reason() -> None:
    fault = (
        f"{HEAD}<s:Body><s:Fault><s:Code><s:Value>s:Sender</s:Value></s:Code>"
        '<s:Reason><s:Text xml:lang="en">bad probe</s:Text></s:Reason></s:Fault>'
        "</s:Body></s:Envelope>"
    )
    dropped = m.read(fault.encode())
    assert dropped == m.Dropped("SOAP fault 's:Sender bad probe'")
