"""The thin wrapper over onvif-zeep-async: ask one camera its clock, identity and streams.

Why this exists: it is the one seam to the vendor library, so the rest of the handler never
sees zeep, aiohttp or their exceptions. onvif-zeep-async brings ONVIF's WSDLs (loaded from the
package, never fetched) and signs requests with a WS-Security UsernameToken PasswordDigest. We
use its ``ONVIFService`` as a factory of zeep clients (one per service kind and credential,
shared by every camera) rather than ``ONVIFCamera`` (one set of clients per camera, a device URL
built from host and port, and whatever XAddrs a camera returns followed), and harden it:

- replies are read with a byte cap (``MAX_REPLY_BYTES``) and must be well-formed SOAP
  envelopes, checked by ``xmlsafe`` (no recovery, no DTD, no entities) before zeep sees them:
  zeep's lenient mode (``strict=False``, which real cameras' extra elements need) also makes
  lxml *recover* from broken XML, so a reply cut after ``<FirmwareVersion>11.9`` read as
  firmware 11.9. zeep then parses with DTDs, entities and external references forbidden too;
- every call has a deadline (``CALL_TIMEOUT_S``), and a description as a whole another;
- a media service on another host than the device service is not followed (a hostile camera
  must not steer our signed requests elsewhere);
- errors become ``CameraError`` with a short reason that quotes no reply and no credential; a
  malformed reply names the operation and the address that sent it, and is never left out as
  if it were a refusal: the camera is not described from it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import onvif
import zeep.exceptions
from lxml import etree
from onvif.client import AsyncTransportProtocolErrorHandler, ONVIFService
from onvif.definition import SERVICES
from zeep.settings import Settings

from discovery_handlers.onvif.cameras import (
    MAX_PROFILES,
    Description,
    Stream,
    host_of,
    strip_credentials,
)
from discovery_handlers.onvif.credentials import Credential
from discovery_handlers.onvif.details import normalise_mac
from discovery_handlers.onvif.xmlsafe import UnsafeXml, parse

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 3.0  # one SOAP request, connect to last byte
DESCRIBE_TIMEOUT_S = 10.0  # every request of one description together
MAX_REPLY_BYTES = 512 * 1024  # a GetProfiles of 16 profiles is ~50 KiB
READ_CHUNK_BYTES = 16 * 1024
MAX_REASON_CHARS = 160
WSDL_DIR = Path(onvif.__file__).parent / "wsdl"
MAX_CONNECTIONS = 64  # HTTP connections open at once, over every camera of one run
KEEPALIVE_S = 30.0  # an idle connection to a camera is kept this long for the next pass
STREAM_SETUP = {"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}}
_SOAP_ENVELOPES = frozenset({
    "http://www.w3.org/2003/05/soap-envelope",  # SOAP 1.2
    "http://schemas.xmlsoap.org/soap/envelope/",  # SOAP 1.1
})

#: zeep's parse settings for camera replies: lenient about schema, strict about XML safety
#: (well-formedness is checked before zeep parses: see ``_check_envelope``).
_SAFE_SETTINGS = Settings(
    strict=False, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True, forbid_external=True
)
# The library logs whole requests and replies at DEBUG; they carry WS-Security tokens.
logging.getLogger("onvif").setLevel(logging.WARNING)
logging.getLogger("zeep").setLevel(logging.WARNING)


class CameraError(Exception):
    """A camera's SOAP service failed; ``reason`` is short and safe to show.

    ``malformed``: the reply was not a well-formed SOAP envelope (cut, garbage, a DTD). Unlike
    a fault or a refusal that is no answer at all, so it fails the description even where a
    fault would only leave a property out. ``fault``: the camera answered with a SOAP fault.
    """

    def __init__(
        self, reason: str, *, auth_refused: bool = False, malformed: bool = False,
        fault: bool = False, cause: str = "",
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.auth_refused = auth_refused
        self.malformed = malformed
        self.fault = fault
        #: what went wrong without the details that vary from one try to the next (where a
        #: reply was cut, an OS error's text): the same cause is logged once, not every pass
        self.cause = cause or reason


class _ReplyTooLarge(Exception):
    pass


class _MalformedReply(Exception):
    """The reply's body is not a well-formed SOAP envelope; ``why`` quotes none of it."""

    def __init__(self, why: str, status: int) -> None:
        super().__init__(why)
        self.why = why
        self.status = status


class _Unauthorized(Exception):
    """HTTP 401, whatever the body: a SOAP fault, or an HTML page with a DOCTYPE that the
    hardened parser would refuse as unreadable."""


class _CappedTransport(AsyncTransportProtocolErrorHandler):  # type: ignore[misc]
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
                raise _ReplyTooLarge
            body = bytearray()
            async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
                body += chunk
                if len(body) > MAX_REPLY_BYTES:
                    raise _ReplyTooLarge
        finally:
            response.release()
        if response.status == 401:
            raise _Unauthorized
        if body or response.status not in (201, 202):  # zeep reads those as "no reply"
            _check_envelope(bytes(body), response.status)
        return response, bytes(body)


def _check_envelope(body: bytes, status: int) -> None:
    """Raise ``_MalformedReply`` unless ``body`` is a well-formed SOAP envelope with a Body.

    Parsed without recovery, DTDs or entities (``xmlsafe``), so what zeep reads next is the
    document the camera sent, not lxml's repair of it.
    """
    try:
        root = parse(body, limit=MAX_REPLY_BYTES)
    except UnsafeXml as exc:
        raise _MalformedReply(str(exc), status) from None
    envelope = etree.QName(root)
    if envelope.localname != "Envelope" or envelope.namespace not in _SOAP_ENVELOPES:
        raise _MalformedReply(f"not a SOAP envelope (root element {envelope.localname!r})", status)
    bodies = [child for child in root if etree.QName(child).localname == "Body"]
    if not bodies:
        raise _MalformedReply("SOAP envelope without a Body", status)
    if not any(isinstance(child.tag, str) for child in bodies[0]):
        raise _MalformedReply("SOAP Body is empty", status)


class SoapClients:
    """zeep clients shared by every camera of one discovery run, over one HTTP connection pool.

    A zeep client (and its service proxy, which binds every operation of the WSDL) costs
    milliseconds of CPU and about a MiB to build, so there is one per service kind and
    credential, not one per camera; each call names its camera's address.
    """

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None
        self._transport: _CappedTransport | None = None
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
                self._transport = _CappedTransport(
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


class CameraSession:
    """The SOAP conversation with one camera, through the run's shared clients."""

    def __init__(self, clients: SoapClients, xaddr: str, credential: Credential | None) -> None:
        self.xaddr = xaddr
        self.credential = credential
        self._clients = clients
        #: the camera refused the clock query to us (with the credentials, when configured)
        self.locked = False
        self._clock_signed = False  # it wants the clock query signed

    def _op(self, kind: str, xaddr: str, name: str, authless: bool) -> _Operation:
        credential = None if authless else self.credential
        return _Operation(self._clients, kind, xaddr, name, credential)

    async def check_clock(self) -> None:
        """GetSystemDateAndTime: unauthenticated, as ONVIF requires it to be open.

        A camera that refuses it unauthenticated is asked again with the configured
        credentials (and from then on with them first). A refusal is an answer: the camera
        is alive, so it raises nothing; ``locked`` then says that only the clock query's
        outcome is known and ``describe`` can learn nothing more.
        """
        signed = self._clock_signed and self.credential is not None
        try:
            await _call(self._clock_op(authless=not signed))
            self.locked = False
            return
        except CameraError as exc:
            if not exc.auth_refused:
                raise
            if signed or self.credential is None:
                self.locked = True
                return
        try:
            await _call(self._clock_op(authless=False))
        except CameraError as exc:
            if not exc.auth_refused:
                raise
            self.locked = True
            return
        self._clock_signed, self.locked = True, False

    def _clock_op(self, *, authless: bool) -> _Operation:
        return self._op("devicemgmt", self.xaddr, "GetSystemDateAndTime", authless)

    async def describe(self) -> Description:
        """Identity, MAC and stream URIs; with credentials when they are accepted."""
        try:
            async with asyncio.timeout(DESCRIBE_TIMEOUT_S):
                return await self._describe()
        except TimeoutError:
            raise CameraError(f"no description within {DESCRIBE_TIMEOUT_S:g}s") from None

    async def _describe(self) -> Description:
        if self.locked:  # every other operation would be refused too
            return Description(auth_refused=self.credential is not None,
                               credentials_missing=self.credential is None)
        authless = self.credential is None
        refused = False
        info: Any = None
        mandatory_fault = ""
        try:
            info = await _call(self._op("devicemgmt", self.xaddr, "GetDeviceInformation", authless))
        except CameraError as exc:
            if exc.auth_refused:
                if authless:  # it wants credentials and none are configured
                    return Description(credentials_missing=True)
                refused, authless = True, True
                info = await _optional(
                    self._op("devicemgmt", self.xaddr, "GetDeviceInformation", True))
            elif exc.fault:  # it speaks SOAP: described, and unhealthy while the fault lasts
                mandatory_fault = exc.reason
            else:
                raise
        interfaces = await _optional(
            self._op("devicemgmt", self.xaddr, "GetNetworkInterfaces", authless)
        )
        streams, left_out = await self._streams(authless)
        return Description(
            mac=_mac(interfaces),
            manufacturer=_field(info, "Manufacturer"),
            model=_field(info, "Model"),
            firmware=_field(info, "FirmwareVersion"),
            streams=streams,
            profiles_left_out=left_out,
            auth_refused=refused,
            mandatory_fault=mandatory_fault,
        )

    async def _streams(
        self, authless: bool
    ) -> tuple[tuple[Stream, ...], tuple[tuple[str, str], ...]]:
        """Every profile's stream, and the profiles that have none, with the reason."""
        capabilities = await _optional(
            self._op("devicemgmt", self.xaddr, "GetCapabilities", authless), {"Category": "Media"}
        )
        media_xaddr = _field(getattr(capabilities, "Media", None), "XAddr") or self.xaddr
        if host_of(media_xaddr) != host_of(self.xaddr):
            log.info("camera %s names a media service on another host; not followed", self.xaddr)
            return (), ()
        profiles = await _optional(self._op("media", media_xaddr, "GetProfiles", authless))
        streams: list[Stream] = []
        left_out: list[tuple[str, str]] = []
        for profile in list(profiles or [])[:MAX_PROFILES]:
            token = str(getattr(profile, "token", "") or "")[:64]
            if not token:
                continue
            why: list[str] = []
            reply = await _optional(
                self._op("media", media_xaddr, "GetStreamUri", authless),
                {"StreamSetup": STREAM_SETUP, "ProfileToken": token},
                why=why,
            )
            uri = strip_credentials(_field(reply, "Uri"))
            if uri:
                streams.append(Stream(token=token, uri=uri))
            else:
                reason = why[0] if why else "GetStreamUri: no RTSP/HTTP URI"
                left_out.append((_safe(token), reason))  # the token as logs may show it
        return tuple(streams), tuple(left_out)


@dataclass(frozen=True)
class _Operation:
    """One SOAP operation of one camera's service, ready to be sent."""

    clients: SoapClients = field(repr=False)
    kind: str
    xaddr: str
    name: str
    credential: Credential | None = field(repr=False)

    async def __call__(self, params: dict[str, Any] | None) -> Any:
        return await self.clients.call(
            self.kind, self.xaddr, self.name, credential=self.credential, params=params
        )


async def _call(op: _Operation, params: dict[str, Any] | None = None) -> Any:
    name, sender = op.name, _safe(op.xaddr)
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await op(params)
    except TimeoutError:
        raise CameraError(f"{name}: no answer within {CALL_TIMEOUT_S:g}s") from None
    except _ReplyTooLarge:
        raise CameraError(f"{name}: reply over {MAX_REPLY_BYTES} bytes") from None
    except _Unauthorized:
        raise CameraError(f"{name}: HTTP 401", auth_refused=True) from None
    except _MalformedReply as exc:
        if exc.status != 200:  # an HTTP error with a page of its own: the status says it all
            raise CameraError(f"{name}: HTTP {exc.status}") from None
        reason = f"{name}: malformed reply from {sender}: {_safe(exc.why)}"
        raise CameraError(reason, malformed=True, cause=f"{name}: malformed reply") from None
    except zeep.exceptions.Fault as exc:
        reason = f"{name}: SOAP fault {_fault_text(exc)}"
        raise CameraError(reason, auth_refused=_is_auth_fault(exc), fault=True) from None
    except zeep.exceptions.TransportError as exc:
        if exc.status_code == 200:  # zeep's way of saying the reply was not XML
            raise CameraError(f"{name}: unreadable reply (not XML)") from None
        refused = exc.status_code == 401
        raise CameraError(f"{name}: HTTP {exc.status_code}", auth_refused=refused) from None
    except (zeep.exceptions.Error, ValueError) as exc:
        reason = f"{name}: unreadable reply from {sender} ({type(exc).__name__})"
        raise CameraError(reason) from None
    except (aiohttp.ClientError, OSError) as exc:
        kind = type(exc).__name__
        raise CameraError(f"{name}: {kind} {_safe(str(exc))}", cause=f"{name}: {kind}") from None
    except Exception as exc:  # the library raised something unforeseen: the camera is broken
        log.debug("%s of %s failed", name, sender, exc_info=True)
        reason = f"{name}: the reply from {sender} could not be read ({type(exc).__name__})"
        raise CameraError(reason) from None


async def _optional(
    op: _Operation, params: dict[str, Any] | None = None, *, why: list[str] | None = None
) -> Any:
    """A call whose fault, refusal or silence leaves its properties out (the reason is
    appended to ``why``); a malformed reply is raised: the camera is not described from it."""
    try:
        return await _call(op, params)
    except CameraError as exc:
        if exc.malformed:
            raise
        log.debug("camera call %s", exc.reason)
        if why is not None:
            why.append(exc.reason)
        return None


def _is_auth_fault(fault: zeep.exceptions.Fault) -> bool:
    codes = [str(code) for code in (fault.subcodes or [])] + [str(fault.code or "")]
    text = " ".join(codes) + " " + str(fault.message or "")
    return "NotAuthorized" in text or "not authorized" in text.lower()


def _fault_text(fault: zeep.exceptions.Fault) -> str:
    """The fault's most specific subcode (``IncompleteConfiguration``) and its reason text."""
    subcodes = [str(code) for code in (fault.subcodes or [])]
    detail = subcodes[-1].rpartition("}")[2] if subcodes else ""
    message = _safe(fault.message)
    return _safe(f"{detail}: {message}" if detail and message else detail or message)


def _field(obj: Any, name: str) -> str:
    value = getattr(obj, name, None) if obj is not None else None
    return _safe(str(value)) if value is not None else ""


def _mac(interfaces: Any) -> str:
    for interface in list(interfaces or [])[:16]:
        mac = normalise_mac(_field(getattr(interface, "Info", None), "HwAddress"))
        if mac:
            return mac
    return ""


def _safe(text: str | None) -> str:
    """Printable, single-line and short: camera text is shown to users, never trusted."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in (text or ""))
    return cleaned.strip()[:MAX_REASON_CHARS]
