"""WS-Discovery messages (2005/04 draft, the version ONVIF uses): the Probe we send, what we read.

Why this exists: it is the pure half of discovery, kept apart from sockets so every odd answer
a camera gives can be tested from a table. The Probe asks for ``dn:NetworkVideoTransmitter``
with the ``dn`` prefix declared on the element (a Probe without it is invalid XML to a strict
camera, Akri #486). Answers are read forgivingly: several XAddrs, any whitespace between scopes,
prefixes chosen by the camera; but a ProbeMatches is kept only when it relates to a Probe we
sent, and a match only when it names a NetworkVideoTransmitter and has an XAddr.
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass
from xml.sax.saxutils import escape

from lxml import etree

from discovery_handlers.onvif.details import normalise_uuid
from discovery_handlers.onvif.xmlsafe import UnsafeXml, parse

NS_SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
NS_ADDRESSING = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
NS_DISCOVERY = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
NS_NETWORK = "http://www.onvif.org/ver10/network/wsdl"
DISCOVERY_TO = "urn:schemas-xmlsoap-org:ws:2005:04:discovery"
ACTION_PROBE = f"{NS_DISCOVERY}/Probe"
ACTION_PROBE_MATCHES = f"{NS_DISCOVERY}/ProbeMatches"
ACTION_HELLO = f"{NS_DISCOVERY}/Hello"
ACTION_BYE = f"{NS_DISCOVERY}/Bye"
VIDEO_TRANSMITTER = "NetworkVideoTransmitter"
#: Caps on what one message may carry into our state.
MAX_MATCHES = 64
MAX_XADDRS = 8
MAX_SCOPES = 64
MAX_FIELD_CHARS = 1024


@dataclass(frozen=True)
class Match:
    """One camera as a ProbeMatch or Hello announces it."""

    uuid: str
    xaddrs: tuple[str, ...]
    scopes: tuple[str, ...]
    metadata_version: int = 0


@dataclass(frozen=True)
class ProbeMatches:
    relates_to: str
    matches: tuple[Match, ...]


@dataclass(frozen=True)
class Hello:
    match: Match


@dataclass(frozen=True)
class Bye:
    uuid: str


Message = ProbeMatches | Hello | Bye


def new_message_id() -> str:
    return f"urn:uuid:{uuid_module.uuid4()}"


def probe(message_id: str) -> bytes:
    """A Probe for ONVIF video transmitters, with ``message_id`` as its MessageID."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<s:Envelope xmlns:s="{NS_SOAP12}" xmlns:a="{NS_ADDRESSING}" xmlns:d="{NS_DISCOVERY}">'
        "<s:Header>"
        f"<a:MessageID>{escape(message_id)}</a:MessageID>"
        f"<a:To>{DISCOVERY_TO}</a:To>"
        f"<a:Action>{ACTION_PROBE}</a:Action>"
        "</s:Header>"
        "<s:Body><d:Probe>"
        f'<d:Types xmlns:dn="{NS_NETWORK}">dn:{VIDEO_TRANSMITTER}</d:Types>'
        "</d:Probe></s:Body></s:Envelope>"
    ).encode()


def read(data: bytes) -> Message | None:
    """The discovery message in ``data``; None for one we do not act on (a Probe, a Resolve).

    Raises ``UnsafeXml`` (or ``ValueError``) for a datagram that is not a valid message.
    """
    root = parse(data)
    if root.tag != f"{{{NS_SOAP12}}}Envelope":
        raise UnsafeXml(f"root element is {_local(root.tag)!r}, not a SOAP 1.2 Envelope")
    body = root.find(f"{{{NS_SOAP12}}}Body")
    if body is None or len(body) == 0:
        raise UnsafeXml("SOAP envelope without a body")
    payload = body[0]
    if payload.tag == f"{{{NS_DISCOVERY}}}ProbeMatches":
        relates = _text(root.find(f"{{{NS_SOAP12}}}Header/{{{NS_ADDRESSING}}}RelatesTo"))
        found = payload.findall(f"{{{NS_DISCOVERY}}}ProbeMatch")[:MAX_MATCHES]
        matches = tuple(m for m in map(_match, found) if m is not None)
        return ProbeMatches(relates_to=relates, matches=matches)
    if payload.tag == f"{{{NS_DISCOVERY}}}Hello":
        match = _match(payload)
        return Hello(match) if match is not None else None
    if payload.tag == f"{{{NS_DISCOVERY}}}Bye":
        uuid = _endpoint_uuid(payload)
        return Bye(uuid) if uuid else None
    return None


def _match(element: etree._Element) -> Match | None:
    """A Match from a ProbeMatch or Hello element; None when not a usable video transmitter."""
    uuid = _endpoint_uuid(element)
    types_element = element.find(f"{{{NS_DISCOVERY}}}Types")
    if not uuid or types_element is None or not _is_transmitter(types_element):
        return None
    xaddrs = tuple(
        x for x in _words(element.find(f"{{{NS_DISCOVERY}}}XAddrs"))[:MAX_XADDRS]
        if x.startswith(("http://", "https://"))
    )
    if not xaddrs:
        return None
    scopes = _words(element.find(f"{{{NS_DISCOVERY}}}Scopes"))[:MAX_SCOPES]
    version_text = _text(element.find(f"{{{NS_DISCOVERY}}}MetadataVersion"))
    version = int(version_text) if version_text.isdigit() and len(version_text) < 10 else 0
    return Match(uuid=uuid, xaddrs=xaddrs, scopes=scopes, metadata_version=version)


def _is_transmitter(types_element: etree._Element) -> bool:
    """Whether Types lists NetworkVideoTransmitter (in ONVIF's namespace, or any: be lenient)."""
    for word in _words(types_element):
        prefix, _, local = word.rpartition(":")
        if local != VIDEO_TRANSMITTER:
            continue
        namespace = types_element.nsmap.get(prefix or None)
        if namespace in (None, NS_NETWORK) or namespace.startswith("http://www.onvif.org/"):
            return True
    return False


def _endpoint_uuid(element: etree._Element) -> str:
    address = element.find(f"{{{NS_ADDRESSING}}}EndpointReference/{{{NS_ADDRESSING}}}Address")
    text = _text(address)
    return normalise_uuid(text) if text else ""


def _words(element: etree._Element | None) -> tuple[str, ...]:
    return tuple(word for word in _text(element).split() if len(word) <= MAX_FIELD_CHARS)


def _text(element: etree._Element | None) -> str:
    if element is None or element.text is None:
        return ""
    return str(element.text).strip()


def _local(tag: object) -> str:
    return str(tag).rpartition("}")[2]
