"""The thin wrapper over onvif-zeep-async: ask one camera its clock, identity and streams.

Why this exists: it is the one seam to the vendor library, so the rest of the handler never
sees zeep, aiohttp or their exceptions. onvif-zeep-async brings ONVIF's WSDLs (loaded from the
package, never fetched) and signs requests with a WS-Security UsernameToken PasswordDigest. We
use its ``ONVIFService`` as a factory of zeep clients (one per service kind and credential,
shared by every camera) rather than ``ONVIFCamera`` (one set of clients per camera, a device URL
built from host and port, and whatever XAddrs a camera returns followed), and harden it:

- replies are read with a byte cap (``MAX_REPLY_BYTES``) and parsed by zeep with DTDs,
  entities and external references forbidden and lxml's huge-tree mode off;
- every call has a deadline (``CALL_TIMEOUT_S``), and a description as a whole another;
- a media service on another host than the device service is not followed (a hostile camera
  must not steer our signed requests elsewhere);
- errors become ``CameraError`` with a short reason that quotes no reply and no credential.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import onvif
import zeep.exceptions
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

#: zeep's parse settings for camera replies: lenient about schema, strict about XML safety.
_SAFE_SETTINGS = Settings(
    strict=False, xml_huge_tree=False, forbid_dtd=True, forbid_entities=True, forbid_external=True
)
# The library logs whole requests and replies at DEBUG; they carry WS-Security tokens.
logging.getLogger("onvif").setLevel(logging.WARNING)
logging.getLogger("zeep").setLevel(logging.WARNING)


class CameraError(Exception):
    """A camera's SOAP service failed; ``reason`` is short and safe to show."""

    def __init__(self, reason: str, *, auth_refused: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.auth_refused = auth_refused


class _ReplyTooLarge(Exception):
    pass


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
        return response, bytes(body)


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

    def _op(
        self, kind: str, xaddr: str, name: str, authless: bool
    ) -> Callable[[dict[str, Any] | None], Awaitable[Any]]:
        credential = None if authless else self.credential

        async def call(params: dict[str, Any] | None) -> Any:
            return await self._clients.call(
                kind, xaddr, name, credential=credential, params=params
            )

        return call

    async def check_clock(self) -> None:
        """GetSystemDateAndTime: unauthenticated, as ONVIF requires it to be open.

        A camera that refuses it unauthenticated is asked again with the configured
        credentials (and from then on with them first). A refusal is an answer: the camera
        is alive, so it raises nothing; ``locked`` then says that only the clock query's
        outcome is known and ``describe`` can learn nothing more.
        """
        signed = self._clock_signed and self.credential is not None
        try:
            await _call("GetSystemDateAndTime", self._clock_op(authless=not signed))
            self.locked = False
            return
        except CameraError as exc:
            if not exc.auth_refused:
                raise
            if signed or self.credential is None:
                self.locked = True
                return
        try:
            await _call("GetSystemDateAndTime", self._clock_op(authless=False))
        except CameraError as exc:
            if not exc.auth_refused:
                raise
            self.locked = True
            return
        self._clock_signed, self.locked = True, False

    def _clock_op(self, *, authless: bool) -> Callable[[dict[str, Any] | None], Awaitable[Any]]:
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
        try:
            op = self._op("devicemgmt", self.xaddr, "GetDeviceInformation", authless)
            info = await _call("GetDeviceInformation", op)
        except CameraError as exc:
            if not exc.auth_refused:
                raise
            if authless:  # it wants credentials and none are configured
                return Description(credentials_missing=True)
            refused, authless = True, True
            op = self._op("devicemgmt", self.xaddr, "GetDeviceInformation", True)
            info = await _optional("GetDeviceInformation", op)
        interfaces = await _optional(
            "GetNetworkInterfaces",
            self._op("devicemgmt", self.xaddr, "GetNetworkInterfaces", authless),
        )
        streams = await self._streams(authless)
        return Description(
            mac=_mac(interfaces),
            manufacturer=_field(info, "Manufacturer"),
            model=_field(info, "Model"),
            firmware=_field(info, "FirmwareVersion"),
            streams=streams,
            auth_refused=refused,
        )

    async def _streams(self, authless: bool) -> tuple[Stream, ...]:
        capabilities = await _optional(
            "GetCapabilities",
            self._op("devicemgmt", self.xaddr, "GetCapabilities", authless),
            {"Category": "Media"},
        )
        media_xaddr = _field(getattr(capabilities, "Media", None), "XAddr") or self.xaddr
        if host_of(media_xaddr) != host_of(self.xaddr):
            log.info("camera %s names a media service on another host; not followed", self.xaddr)
            return ()
        profiles = await _optional(
            "GetProfiles", self._op("media", media_xaddr, "GetProfiles", authless)
        )
        streams: list[Stream] = []
        for profile in list(profiles or [])[:MAX_PROFILES]:
            token = str(getattr(profile, "token", "") or "")[:64]
            if not token:
                continue
            reply = await _optional(
                "GetStreamUri",
                self._op("media", media_xaddr, "GetStreamUri", authless),
                {"StreamSetup": STREAM_SETUP, "ProfileToken": token},
            )
            uri = strip_credentials(_field(reply, "Uri"))
            if uri:
                streams.append(Stream(token=token, uri=uri))
        return tuple(streams)


async def _call(name: str, op: Callable[[Any], Awaitable[Any]], params: Any = None) -> Any:
    try:
        async with asyncio.timeout(CALL_TIMEOUT_S):
            return await op(params)
    except TimeoutError:
        raise CameraError(f"{name}: no answer within {CALL_TIMEOUT_S:g}s") from None
    except _ReplyTooLarge:
        raise CameraError(f"{name}: reply over {MAX_REPLY_BYTES} bytes") from None
    except _Unauthorized:
        raise CameraError(f"{name}: HTTP 401", auth_refused=True) from None
    except zeep.exceptions.Fault as exc:
        reason = f"{name}: SOAP fault {_safe(exc.message)}"
        raise CameraError(reason, auth_refused=_is_auth_fault(exc)) from None
    except zeep.exceptions.TransportError as exc:
        if exc.status_code == 200:  # zeep's way of saying the reply was not XML
            raise CameraError(f"{name}: unreadable reply (not XML)") from None
        refused = exc.status_code == 401
        raise CameraError(f"{name}: HTTP {exc.status_code}", auth_refused=refused) from None
    except (zeep.exceptions.Error, ValueError) as exc:
        raise CameraError(f"{name}: unreadable reply ({type(exc).__name__})") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise CameraError(f"{name}: {type(exc).__name__} {_safe(str(exc))}") from None
    except Exception as exc:  # the library raised something unforeseen: the camera is broken
        log.debug("%s failed", name, exc_info=True)
        raise CameraError(f"{name}: {type(exc).__name__}") from None


async def _optional(name: str, op: Callable[[Any], Awaitable[Any]], params: Any = None) -> Any:
    """A call whose failure leaves its properties out (auth refusals included)."""
    try:
        return await _call(name, op, params)
    except CameraError as exc:
        log.debug("camera call %s", exc.reason)
        return None


def _is_auth_fault(fault: zeep.exceptions.Fault) -> bool:
    codes = [str(code) for code in (fault.subcodes or [])] + [str(fault.code or "")]
    text = " ".join(codes) + " " + str(fault.message or "")
    return "NotAuthorized" in text or "not authorized" in text.lower()


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
