"""What we know of each camera, the filters, and the Device each camera becomes: no I/O.

Pure functions of what WS-Discovery and SOAP said: which cameras pass the filters (every camera,
every pass), their ids and properties, and whether a camera is listed or unhealthy
(docs/handlers/onvif.md, "What brokers get" and "Health").
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from discovery_handlers.contract import Device, Health
from discovery_handlers.onvif.details import FilterAction, FilterList, OnvifDetails
from discovery_handlers.onvif.wsd_messages import Match

# Akri's property names first, then ours.
SERVICE_URL = "ONVIF_DEVICE_SERVICE_URL"
UUID = "ONVIF_DEVICE_UUID"
IP_ADDRESS = "ONVIF_DEVICE_IP_ADDRESS"
MAC_ADDRESS = "ONVIF_DEVICE_MAC_ADDRESS"
MANUFACTURER = "ONVIF_DEVICE_MANUFACTURER"
MODEL = "ONVIF_DEVICE_MODEL"
FIRMWARE = "ONVIF_DEVICE_FIRMWARE_VERSION"
PROFILES = "ONVIF_DEVICE_PROFILES"
STREAM_URI = "ONVIF_STREAM_URI"  # the first profile's; one per profile as ..._<TOKEN>
#: ``Device.extra`` key of a warning for users (credentials refused); never holds a secret.
WARNING_EXTRA = "warning"
MAX_PROFILES = 16
MAX_PROPERTY_CHARS = 512
_STREAM_SCHEMES = ("rtsp", "rtsps", "http", "https")


@dataclass(frozen=True)
class Stream:
    """One media profile and its RTSP URI (credentials already stripped)."""

    token: str
    uri: str


@dataclass(frozen=True)
class Description:
    """What a camera said over SOAP."""

    mac: str = ""
    manufacturer: str = ""
    model: str = ""
    firmware: str = ""
    streams: tuple[Stream, ...] = ()
    #: profiles GetProfiles listed that have no stream (token, why): GetStreamUri faulted
    #: (``ter:IncompleteConfiguration``), was refused, or gave no RTSP/HTTP URI
    profiles_left_out: tuple[tuple[str, str], ...] = ()
    #: credentials were configured for it and refused
    auth_refused: bool = False
    #: it refused what we asked without credentials, and none are configured for it
    credentials_missing: bool = False
    #: a call ONVIF makes mandatory (GetDeviceInformation) answered with this SOAP fault: the
    #: camera is listed, unhealthy, with this reason
    mandatory_fault: str = ""


@dataclass
class Camera:
    """One camera's state across passes."""

    match: Match
    source: str  # the address its last WS-Discovery message came from
    last_seen: float
    description: Description | None = None
    #: when its description was last read (monotonic seconds); None: never, or to be re-read
    described_at: float | None = None
    healthy: bool = True
    reason: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    #: the XAddr chosen when first seen; kept while the camera still lists it, so a dual-stack
    #: camera heard over IPv4 and IPv6 does not flip its id (and Instance) between them
    pinned_url: str = ""
    #: when a check last found it healthy (monotonic seconds); None: never
    checked_at: float | None = None
    #: the failure reasons logged at warning level since it last answered (each is logged
    #: once, then at debug level)
    warned: set[str] = field(default_factory=set)

    @property
    def service_url(self) -> str:
        if self.pinned_url in self.match.xaddrs:
            return self.pinned_url
        return service_url(self.match.xaddrs, self.source)

    def pin_url(self) -> None:
        self.pinned_url = self.service_url


def service_url(xaddrs: Sequence[str], source: str) -> str:
    """The XAddr to use when a camera lists several (IPv4, IPv6, host names).

    The one on the address the camera answered from; else an address of the same family as
    that one; else a host name; else another address; loopback, unspecified and zoneless
    link-local addresses last (they cannot name the camera from here). Ties: the camera's
    order.
    """
    return min(xaddrs, key=lambda xaddr: _xaddr_rank(host_of(xaddr), source))


def _xaddr_rank(host: str, source: str) -> int:
    if host == source:
        return 0
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return 2 if host else 5
    if address.is_loopback or address.is_unspecified or address.is_link_local:
        return 4
    try:
        same_family = address.version == ipaddress.ip_address(source).version
    except ValueError:
        same_family = False
    return 1 if same_family else 3


def host_of(url: str) -> str:
    """The host of ``url`` without brackets ('' when there is none)."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def ip_address_of(camera: Camera) -> str:
    """The camera's IP: its service URL's host when that is an address, else the sender's."""
    host = host_of(camera.service_url)
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return camera.source


def device_id(camera: Camera) -> str:
    """Akri's id for an ONVIF camera, ``<service url>-<uuid>``, so Instance names match."""
    return f"{camera.service_url}-{camera.match.uuid}"


def passes_filters(details: OnvifDetails, camera: Camera) -> bool:
    """Whether every configured filter keeps ``camera``."""
    mac = camera.description.mac if camera.description else ""
    return (
        _keeps_ip(details.ip_addresses, ip_address_of(camera))
        and _keeps(details.mac_addresses, [mac] if mac else [])
        and _keeps(details.scopes, camera.match.scopes)
        and _keeps(details.uuids, [camera.match.uuid])
    )


def may_pass_filters(details: OnvifDetails, camera: Camera) -> bool:
    """Whether the filters could keep ``camera`` once described: as ``passes_filters``, but a
    MAC not known yet is held against it by no filter."""
    if camera.description is None and details.mac_addresses is not None:
        details = replace(details, mac_addresses=None)
    return passes_filters(details, camera)


def _keeps(filters: FilterList | None, values: Sequence[str]) -> bool:
    if filters is None:
        return True
    hit = any(value in filters.items for value in values)
    return hit if filters.action is FilterAction.INCLUDE else not hit


def _keeps_ip(filters: FilterList | None, ip: str) -> bool:
    if filters is None:
        return True
    try:
        address = ipaddress.ip_address(ip)
        hit = any(address in ipaddress.ip_network(item) for item in filters.items)
    except ValueError:
        hit = False
    return hit if filters.action is FilterAction.INCLUDE else not hit


def strip_credentials(uri: str) -> str | None:
    """``uri`` without user and password; None when it is not a stream URI we can hand on."""
    try:
        parts = urlsplit(uri.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() not in _STREAM_SCHEMES or not host:
        return None
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc = f"{netloc}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def property_suffix(token: str) -> str:
    """A profile token as an environment-variable suffix (``Profile_1`` → ``PROFILE_1``)."""
    return re.sub(r"[^A-Z0-9]", "_", token.upper())[:64]


def device_of(camera: Camera) -> Device:
    """The Device a camera becomes: Akri's four properties, then what SOAP told us."""
    properties = {
        SERVICE_URL: camera.service_url,
        UUID: camera.match.uuid,
        IP_ADDRESS: ip_address_of(camera),
    }
    description = camera.description
    if description is not None:
        extra = {
            MAC_ADDRESS: description.mac,
            MANUFACTURER: description.manufacturer,
            MODEL: description.model,
            FIRMWARE: description.firmware,
        }
        properties.update({name: value for name, value in extra.items() if value})
        streams = description.streams[:MAX_PROFILES]
        if streams:
            properties[PROFILES] = ",".join(stream.token for stream in streams)
            properties[STREAM_URI] = streams[0].uri
            for stream in streams:
                properties[f"{STREAM_URI}_{property_suffix(stream.token)}"] = stream.uri
    properties = {name: value[:MAX_PROPERTY_CHARS] for name, value in properties.items()}
    health = Health() if camera.healthy else Health.unhealthy(camera.reason)
    return Device(
        id=device_id(camera), properties=properties, health=health,
        warning=camera.extra.get(WARNING_EXTRA, ""),
    )


def auth_warning(camera: Camera) -> str:
    """What to tell users about a camera that would not show us everything; '' when it did."""
    description = camera.description
    if description is None:
        return ""
    name = f"camera {camera.service_url} (uuid {camera.match.uuid})"
    if description.auth_refused:
        return f"{name} refused the configured credentials; listed with what it shows without them"
    if description.credentials_missing:
        return (
            f"{name} wants credentials and none are configured for it; listed with what it "
            "shows without them"
        )
    return ""


def visible_devices(details: OnvifDetails, cameras: Mapping[str, Camera]) -> list[Device]:
    """The devices to publish: described cameras that pass the filters, sorted by id."""
    devices = [
        device_of(camera)
        for camera in cameras.values()
        if camera.description is not None and passes_filters(details, camera)
    ]
    return sorted(devices, key=lambda device: device.id)
