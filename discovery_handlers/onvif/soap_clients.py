"""The HTTP side of the ONVIF handler's SOAP calls: shared zeep clients over one capped transport.

``SoapClients.call`` sends one operation to a camera's address; replies are read with a byte cap
and must be well-formed SOAP envelopes (``check_envelope``) before zeep parses them. Why:
docs/handlers/onvif.md, "How it works, and why".
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import aiohttp
import onvif
from lxml import etree
from onvif.client import AsyncTransportProtocolErrorHandler, ONVIFService
from onvif.definition import SERVICES
from zeep.settings import Settings

from discovery_handlers.onvif.credentials import Credential
from discovery_handlers.onvif.xmlsafe import UnsafeXml, parse

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 3.0  # one SOAP request, connect to last byte
MAX_REPLY_BYTES = 512 * 1024  # a GetProfiles of 16 profiles is ~50 KiB
READ_CHUNK_BYTES = 16 * 1024
WSDL_DIR = Path(onvif.__file__).parent / "wsdl"
MAX_CONNECTIONS = 64  # HTTP connections open at once, over every camera of one run
KEEPALIVE_S = 30.0  # an idle connection to a camera is kept this long for the next pass
_SOAP_ENVELOPES = frozenset({
    "http://www.w3.org/2003/05/soap-envelope",  # SOAP 1.2
    "http://schemas.xmlsoap.org/soap/envelope/",  # SOAP 1.1
})

#: zeep's parse settings for camera replies: lenient about schema, strict about XML safety
#: (well-formedness is checked before zeep parses: see ``check_envelope``).
_SAFE_SETTINGS = Settings(
    strict=False, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True, forbid_external=True
)
# The library logs whole requests and replies at DEBUG; they carry WS-Security tokens.
logging.getLogger("onvif").setLevel(logging.WARNING)
logging.getLogger("zeep").setLevel(logging.WARNING)


class ReplyTooLarge(Exception):
    pass


class MalformedReply(Exception):
    """The reply's body is not a well-formed SOAP envelope; ``why`` quotes none of it."""

    def __init__(self, why: str, status: int) -> None:
        super().__init__(why)
        self.why = why
        self.status = status


class Unauthorized(Exception):
    """HTTP 401, whatever the body: a SOAP fault, or an HTML page with a DOCTYPE that the
    hardened parser would refuse as unreadable."""


class CappedTransport(AsyncTransportProtocolErrorHandler):  # type: ignore[misc]
    """The library's aiohttp transport, reading at most ``MAX_REPLY_BYTES`` of a reply."""

    async def _post_internal(
        self, address: str, message: str | bytes, headers: dict[str, str]
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        headers = dict(headers or {})
        headers.setdefault("Content-Type", 'application/soap+xml; charset="utf-8"')
        data = message.encode("utf-8") if isinstance(message, str) else message
        response = await self.session.post(address, data=data, headers=headers)
        try:
            declared = response.content_length
            if declared is not None and declared > MAX_REPLY_BYTES:
                raise ReplyTooLarge
            body = bytearray()
            async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
                body += chunk
                if len(body) > MAX_REPLY_BYTES:
                    raise ReplyTooLarge
        finally:
            response.release()
        if response.status == 401:
            raise Unauthorized
        if body or response.status not in (201, 202):  # zeep reads those as "no reply"
            check_envelope(bytes(body), response.status)
        return response, bytes(body)


def check_envelope(body: bytes, status: int) -> None:
    """Raise ``MalformedReply`` unless ``body`` is a well-formed SOAP envelope with a Body.

    Parsed without recovery, DTDs or entities (``xmlsafe``), so what zeep reads next is the
    document the camera sent, not lxml's repair of it.
    """
    try:
        root = parse(body, limit=MAX_REPLY_BYTES)
    except UnsafeXml as exc:
        raise MalformedReply(str(exc), status) from None
    envelope = etree.QName(root)
    if envelope.localname != "Envelope" or envelope.namespace not in _SOAP_ENVELOPES:
        raise MalformedReply(f"not a SOAP envelope (root element {envelope.localname!r})", status)
    bodies = [child for child in root if etree.QName(child).localname == "Body"]
    if not bodies:
        raise MalformedReply("SOAP envelope without a Body", status)
    if not any(isinstance(child.tag, str) for child in bodies[0]):
        raise MalformedReply("SOAP Body is empty", status)


class SoapClients:
    """zeep clients shared by every camera of one discovery run, over one HTTP connection pool.

    A zeep client (and its service proxy, which binds every operation of the WSDL) is costly to
    build, so there is one per service kind and credential, not one per camera; each call names
    its camera's address.
    """

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._transport: CappedTransport | None = None
        self._services: dict[tuple[str, tuple[str, str] | None], ONVIFService] = {}
        self._lock = asyncio.Lock()

    async def _service(self, kind: str, credential: Credential | None) -> ONVIFService:
        key = (kind, (credential.username, credential.password) if credential else None)
        async with self._lock:
            service = self._services.get(key)
            if service is not None:
                return service
            if self._session is None:
                connector = aiohttp.TCPConnector(
                    limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S
                )
                self._session = aiohttp.ClientSession(
                    connector=connector,
                    timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S + 1),
                )
                self._transport = CappedTransport(
                    session=self._session, verify_ssl=False, cache=None
                )
            spec = SERVICES[kind]
            service = ONVIFService(
                "http://unused.invalid/",  # every call below names its camera's address
                credential.username if credential else None,
                credential.password if credential else None,
                str(WSDL_DIR / spec["wsdl"]),
                encrypt=True,
                no_cache=True,
                binding_name=f"{{{spec['ns']}}}{spec['binding']}",
            )
            service.transport = self._transport
            try:
                await service.setup()
            except Exception:
                await service.close()
                raise
            for client in (service.zeep_client, service.zeep_client_authless):
                client.settings = _SAFE_SETTINGS
            self._services[key] = service
            return service

    async def call(
        self,
        kind: str,
        xaddr: str,
        operation: str,
        *,
        credential: Credential | None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """One SOAP operation on ``xaddr``, signed with ``credential`` unless it is None."""
        service = await self._service(kind, credential)
        client = service.zeep_client if credential else service.zeep_client_authless
        binding = client.wsdl.bindings[service.binding_name]
        return await binding.send_async(client, {"address": xaddr}, operation, (), params or {})

    async def close(self) -> None:
        services, self._services = list(self._services.values()), {}
        for service in services:
            try:
                await service.close()  # its own (unused) session; ours is closed below
            except Exception as exc:  # closing must never fail a discovery run
                log.debug("closing a SOAP client failed: %s", exc)
        if self._session is not None:
            await self._session.close()
            self._session = None
