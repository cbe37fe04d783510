"""WS-Discovery messages: the Probe we send (2005/04, as ONVIF uses), and reading what comes back.

Pure, tested over tables: ``probe`` builds a Probe; ``read`` turns a datagram into a ProbeMatches,
Hello or Bye, or returns what it leaves out with the reason (``Dropped``). What is read:
docs/handlers/onvif.md, "What it reads, and what it says when it drops something".
"""

from __future__ import annotations

import uuid as uuid_module
from dataclasses import dataclass
from xml.sax.saxutils import escape

from lxml import etree

from discovery_handlers.onvif.details import normalise_uuid
from discovery_handlers.onvif.xmlsafe import UnsafeXml, parse

NS_SOAP12 = "http://www.w3.org/2003/05/soap-envelope"
NS_SOAP11 = "http://schemas.xmlsoap.org/soap/envelope/"
NS_ADDRESSING = "http://schemas.xmlsoap.org/ws/2004/08/addressing"
NS_ADDRESSING_2005 = "http://www.w3.org/2005/08/addressing"
NS_DISCOVERY = "http://schemas.xmlsoap.org/ws/2005/04/discovery"
NS_DISCOVERY_11 = "http://docs.oasis-open.org/ws-dd/ns/discovery/2009/01"
NS_NETWORK = "http://www.onvif.org/ver10/network/wsdl"
#: the namespaces each part is read in, the usual one first
SOAP_NAMESPACES = (NS_SOAP12, NS_SOAP11)
ADDRESSING_NAMESPACES = (NS_ADDRESSING, NS_ADDRESSING_2005)
DISCOVERY_NAMESPACES = (NS_DISCOVERY, NS_DISCOVERY_11)
#: where an EndpointReference and its Address are found (cameras use either)
ENDPOINT_NAMESPACES = ADDRESSING_NAMESPACES + DISCOVERY_NAMESPACES
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
    #: why each ProbeMatch left out of ``matches`` was left out
    dropped: tuple[str, ...] = ()


@dataclass(frozen=True)
class Hello:
    match: Match


@dataclass(frozen=True)
class Bye:
    uuid: str


@dataclass(frozen=True)
class Dropped:
    """A message read but not acted on (a Hello, a Bye, a SOAP fault), and why.

    ``quiet``: nothing is wrong with the sender (a printer's Hello is not a camera's); such a
    drop is only ever worth a debug line.
    """

    reason: str
    quiet: bool = False


Message = ProbeMatches | Hello | Bye


class _Refused(Exception):
    def __init__(self, reason: str, *, quiet: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.quiet = quiet


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


def read(data: bytes) -> Message | Dropped | None:
    """The discovery message in ``data``; ``Dropped`` (with the reason) for a Hello or Bye we
    cannot use or a SOAP fault (a camera refusing our Probe); None for a message that is not
    for us (someone's Probe, a Resolve).

    Raises ``UnsafeXml`` for a datagram that is not a valid SOAP message.
    """
    root = parse(data)
    envelope_ns, local = _split(root.tag)
    if local != "Envelope" or envelope_ns not in SOAP_NAMESPACES:
        raise UnsafeXml(f"root element is {local!r}, not a SOAP Envelope")
    body = root.find(f"{{{envelope_ns}}}Body")
    if body is None or len(body) == 0:
        raise UnsafeXml("SOAP envelope without a body")
    payload = body[0]
    if _split(payload.tag) == (envelope_ns, "Fault"):
        return Dropped(f"SOAP fault {short(_fault_text(payload))!r}")
    kind = _discovery_local(payload)
    if kind in ("ProbeMatches", "ProbeMatch"):
        header = root.find(f"{{{envelope_ns}}}Header")
        relates = _text(_child(header, "RelatesTo", ADDRESSING_NAMESPACES))
        # a ProbeMatches wraps its matches; some cameras put ProbeMatch straight in the Body
        holder = payload if kind == "ProbeMatches" else body
        found = [e for e in holder if _discovery_local(e) == "ProbeMatch"][:MAX_MATCHES]
        matches: list[Match] = []
        dropped: list[str] = []
        for element in found:
            try:
                matches.append(_match(element, typed_by_probe=True))
            except _Refused as exc:
                dropped.append(exc.reason)
        if not found:
            dropped.append("ProbeMatches without a ProbeMatch")
        return ProbeMatches(relates_to=relates, matches=tuple(matches), dropped=tuple(dropped))
    try:
        if kind == "Hello":
            return Hello(_match(payload, typed_by_probe=False))
        if kind == "Bye":
            return Bye(_endpoint_uuid(payload))
    except _Refused as exc:
        return Dropped(f"{kind}: {exc.reason}", quiet=exc.quiet)
    return None


def _match(element: etree._Element, *, typed_by_probe: bool) -> Match:
    """A Match from a ProbeMatch or Hello element; raises ``_Refused`` saying why not.

    A ProbeMatch without Types answers our Probe for video transmitters, which is a claim to
    be one (WS-Discovery makes Types optional); a Hello must say what it announces.
    """
    uuid = _endpoint_uuid(element)
    types_element = _child(element, "Types", DISCOVERY_NAMESPACES)
    if types_element is None:
        if not typed_by_probe:
            raise _Refused("no Types", quiet=True)
    elif not _is_transmitter(types_element):
        raise _Refused(f"not a {VIDEO_TRANSMITTER} (Types {short(_text(types_element))!r})",
                       quiet=not typed_by_probe)
    words = _words(_child(element, "XAddrs", DISCOVERY_NAMESPACES))
    if not words:
        raise _Refused(f"camera {short(uuid)} gives no XAddrs")
    xaddrs = tuple(x for x in words if x.lower().startswith(("http://", "https://")))
    if not xaddrs:
        raise _Refused(f"camera {short(uuid)} gives no HTTP XAddr ({short(' '.join(words))!r})")
    scopes = _words(_child(element, "Scopes", DISCOVERY_NAMESPACES))[:MAX_SCOPES]
    version_text = _text(_child(element, "MetadataVersion", DISCOVERY_NAMESPACES))
    version = int(version_text) if version_text.isdigit() and len(version_text) < 10 else 0
    return Match(uuid=uuid, xaddrs=xaddrs[:MAX_XADDRS], scopes=scopes, metadata_version=version)


def _fault_text(fault: etree._Element) -> str:
    """A fault's codes and reason (SOAP 1.2 Code/Subcode/Reason or SOAP 1.1 faultstring)."""
    words = [
        _text(element)
        for element in fault.iter()
        if _split(element.tag)[1] in ("Value", "Text", "faultcode", "faultstring")
    ]
    return " ".join(word for word in words if word)


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
    reference = _child(element, "EndpointReference", ENDPOINT_NAMESPACES)
    if reference is None:
        raise _Refused("no EndpointReference")
    uuid = normalise_uuid(_text(_child(reference, "Address", ENDPOINT_NAMESPACES)))
    if not uuid:
        raise _Refused("no EndpointReference Address")
    if len(uuid) > MAX_FIELD_CHARS:
        raise _Refused("EndpointReference Address too long")
    return uuid


def _child(
    parent: etree._Element | None, local: str, namespaces: tuple[str, ...]
) -> etree._Element | None:
    """The first child of ``parent`` named ``local`` in the first of ``namespaces`` that has one."""
    if parent is None:
        return None
    for namespace in namespaces:
        found = parent.find(f"{{{namespace}}}{local}")
        if found is not None:
            return found
    return None


def _discovery_local(element: etree._Element) -> str:
    """The local name of a WS-Discovery element (either version); '' for anything else."""
    namespace, local = _split(element.tag)
    return local if namespace in DISCOVERY_NAMESPACES else ""


def _split(tag: object) -> tuple[str, str]:
    text = str(tag)
    if text.startswith("{"):
        namespace, _, local = text[1:].partition("}")
        return namespace, local
    return "", text


def _words(element: etree._Element | None) -> tuple[str, ...]:
    return tuple(word for word in _text(element).split() if len(word) <= MAX_FIELD_CHARS)


def _text(element: etree._Element | None) -> str:
    if element is None or element.text is None:
        return ""
    return str(element.text).strip()


def short(text: str) -> str:
    """Camera text quoted in a log line: printable and at most 80 characters."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in text)
    return cleaned[:80]
