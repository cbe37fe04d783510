"""The one way this handler parses XML from the network: size-capped, no DTD, no entities.

``parse`` returns the root element or raises ``UnsafeXml``; a document with a DOCTYPE is refused,
and lxml never resolves entities, loads a DTD or touches the network.
"""

from __future__ import annotations

from lxml import etree

#: Largest WS-Discovery datagram we parse; real ProbeMatches are a few KiB.
MAX_DATAGRAM_BYTES = 32 * 1024


class UnsafeXml(ValueError):
    """A document refused by the hardened parser; the message never quotes the document."""


def _parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
        recover=False,
    )


def parse(data: bytes, *, limit: int = MAX_DATAGRAM_BYTES) -> etree._Element:
    """Parse ``data`` into its root element, or raise ``UnsafeXml`` saying why not."""
    if len(data) > limit:
        raise UnsafeXml(f"document of {len(data)} bytes is over the {limit}-byte limit")
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        raise UnsafeXml("document declares a DTD or entities")
    try:
        root = etree.fromstring(data, parser=_parser())
    except etree.XMLSyntaxError as exc:
        raise UnsafeXml(f"not well-formed XML ({exc.msg})") from None
    if root.getroottree().docinfo.doctype:
        raise UnsafeXml("document declares a DTD")
    return root
