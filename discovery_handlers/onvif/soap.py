"""Ask one ONVIF camera its clock, identity and streams over SOAP (onvif-zeep-async).

``CameraSession.check_clock`` and ``describe`` are the handler's only way to a camera's SOAP
service; failures come back as ``CameraError`` with a short reason that quotes no reply and no
credential. The transport lives in ``soap_clients``. Why: docs/handlers/onvif.md, "How it
works, and why".
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import zeep.exceptions

from discovery_handlers.onvif.cameras import (
    MAX_PROFILES,
    Description,
    Stream,
    host_of,
    strip_credentials,
)
from discovery_handlers.onvif.credentials import Credential
from discovery_handlers.onvif.details import normalise_mac
from discovery_handlers.onvif.soap_clients import (
    CALL_TIMEOUT_S,
    MAX_REPLY_BYTES,
    MalformedReply,
    ReplyTooLarge,
    SoapClients,
    Unauthorized,
)

__all__ = [
    "CALL_TIMEOUT_S",
    "DESCRIBE_TIMEOUT_S",
    "MAX_REPLY_BYTES",
    "CameraError",
    "CameraSession",
    "SoapClients",
]

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 10.0  # every request of one description together
MAX_REASON_CHARS = 160
STREAM_SETUP = {"Stream": "RTP-Unicast", "Transport": {"Protocol": "RTSP"}}


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
    except ReplyTooLarge:
        raise CameraError(f"{name}: reply over {MAX_REPLY_BYTES} bytes") from None
    except Unauthorized:
        raise CameraError(f"{name}: HTTP 401", auth_refused=True) from None
    except MalformedReply as exc:
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
