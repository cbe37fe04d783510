"""Typed ``discoveryDetails`` of an ONVIF Configuration, parsed and checked without any I/O.

``parse_details`` returns ``OnvifDetails`` or refuses naming the field; the agent, the webhook and
``edgeplug discover`` call it. Fields: docs/handlers/onvif.md, "`discoveryDetails`".
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from discovery_handlers.contract import InvalidDetails, PropertyValue
from discovery_handlers.onvif.credentials import CredentialStore, parse_credentials
from discovery_handlers.yaml_details import load_mapping, refuse_unknown

DEFAULT_DISCOVERY_TIMEOUT_S = 1.0
MAX_DISCOVERY_TIMEOUT_S = 60.0
DEFAULT_DISCOVERY_INTERVAL_S = 10.0  # Akri's fixed period between probes
MIN_DISCOVERY_INTERVAL_S = 0.5
MAX_DISCOVERY_INTERVAL_S = 3600.0
#: A CIDR in ``unicastTargets`` may name at most this many hosts (a /20): one probe each per pass.
MAX_UNICAST_HOSTS = 4096
WS_DISCOVERY_PORT = 3702

_FILTER_FIELDS = ("ipAddresses", "macAddresses", "scopes", "uuids")
_KNOWN_FIELDS = frozenset(
    {
        *_FILTER_FIELDS,
        "discoveryTimeoutSeconds",
        "discoveryIntervalSeconds",
        "unicastTargets",
        "multicast",
        "ipv6",
    }
)


class FilterAction(enum.Enum):
    INCLUDE = "Include"
    EXCLUDE = "Exclude"


@dataclass(frozen=True)
class FilterList:
    """Akri's ``{items, action}``: keep only the listed (Include) or all but them (Exclude)."""

    items: tuple[str, ...]
    action: FilterAction = FilterAction.INCLUDE


@dataclass(frozen=True)
class UnicastTarget:
    """One IP address (with the WS-Discovery port, 3702 unless given) that is probed directly."""

    host: str
    port: int = WS_DISCOVERY_PORT


@dataclass(frozen=True)
class OnvifDetails:
    """Parsed ``discoveryDetails`` (and credentials) of one ONVIF Configuration."""

    ip_addresses: FilterList | None = None
    mac_addresses: FilterList | None = None
    scopes: FilterList | None = None
    uuids: FilterList | None = None
    discovery_timeout_s: float = DEFAULT_DISCOVERY_TIMEOUT_S
    discovery_interval_s: float = DEFAULT_DISCOVERY_INTERVAL_S
    unicast_targets: tuple[UnicastTarget, ...] = ()
    multicast: bool = True
    ipv6: bool = True
    #: Camera credentials; the store's repr shows no secret.
    credentials: CredentialStore = field(default_factory=CredentialStore, repr=False)


def parse_details(details: str, properties: Mapping[str, PropertyValue]) -> OnvifDetails:
    """Parse ``discoveryDetails`` YAML; raise ``InvalidDetails`` naming the field on bad input."""
    raw = load_mapping(
        details, expected="must be a mapping of ONVIF discovery settings", empty_is_empty=True
    )
    refuse_unknown(raw, _KNOWN_FIELDS)
    filters = {name: _filter_list(name, raw.get(name)) for name in _FILTER_FIELDS}
    timeout = _seconds(
        raw, "discoveryTimeoutSeconds", DEFAULT_DISCOVERY_TIMEOUT_S, 0.0, MAX_DISCOVERY_TIMEOUT_S
    )
    interval = _seconds(
        raw,
        "discoveryIntervalSeconds",
        DEFAULT_DISCOVERY_INTERVAL_S,
        MIN_DISCOVERY_INTERVAL_S,
        MAX_DISCOVERY_INTERVAL_S,
    )
    if interval < timeout:
        raise InvalidDetails(
            "discoveryIntervalSeconds",
            f"must be at least discoveryTimeoutSeconds ({timeout:g})",
        )
    targets = _unicast_targets(raw.get("unicastTargets"))
    multicast = _boolean(raw, "multicast", default=True)
    ipv6 = _boolean(raw, "ipv6", default=True)
    if not multicast and not targets:
        raise InvalidDetails("multicast", "false needs unicastTargets, or nothing is probed")
    return OnvifDetails(
        ip_addresses=_checked_ips(filters["ipAddresses"]),
        mac_addresses=_checked_macs(filters["macAddresses"]),
        scopes=filters["scopes"],
        uuids=_checked_uuids(filters["uuids"]),
        discovery_timeout_s=timeout,
        discovery_interval_s=interval,
        unicast_targets=targets,
        multicast=multicast,
        ipv6=ipv6,
        credentials=parse_credentials(properties),
    )


def _filter_list(name: str, value: Any) -> FilterList | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidDetails(name, "must be a mapping with 'items' and 'action'")
    extra = sorted(set(map(str, value)) - {"items", "action"})
    if extra:
        raise InvalidDetails(f"{name}.{extra[0]}", "unknown field (known: action, items)")
    items = value.get("items", [])
    if not isinstance(items, list):
        raise InvalidDetails(f"{name}.items", "must be a list of strings")
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise InvalidDetails(f"{name}.items[{index}]", "must be a non-empty string")
    action_text = value.get("action", FilterAction.INCLUDE.value)
    try:
        action = FilterAction(action_text)
    except ValueError:
        raise InvalidDetails(
            f"{name}.action", f"must be Include or Exclude, not {action_text!r}"
        ) from None
    return FilterList(items=tuple(item.strip() for item in items), action=action)


def _checked_ips(filters: FilterList | None) -> FilterList | None:
    if filters is None:
        return None
    normalised = []
    for index, item in enumerate(filters.items):
        try:
            normalised.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise InvalidDetails(
                f"ipAddresses.items[{index}]", f"{item!r} is not an IP address or CIDR range"
            ) from None
    return FilterList(items=tuple(normalised), action=filters.action)


def normalise_mac(text: str) -> str | None:
    """``aa:bb:cc:dd:ee:ff`` for any common MAC spelling, None when it is not one."""
    hexdigits = "".join(ch for ch in text.lower() if ch not in ":-.")
    if len(hexdigits) != 12 or any(ch not in "0123456789abcdef" for ch in hexdigits):
        return None
    return ":".join(hexdigits[i : i + 2] for i in range(0, 12, 2))


def _checked_macs(filters: FilterList | None) -> FilterList | None:
    if filters is None:
        return None
    normalised = []
    for index, item in enumerate(filters.items):
        mac = normalise_mac(item)
        if mac is None:
            raise InvalidDetails(f"macAddresses.items[{index}]", f"{item!r} is not a MAC address")
        normalised.append(mac)
    return FilterList(items=tuple(normalised), action=filters.action)


def normalise_uuid(text: str) -> str:
    """The bare lower-case uuid of ``urn:uuid:…``, ``uuid:…`` or a plain uuid."""
    value = text.strip().lower()
    for prefix in ("urn:uuid:", "uuid:"):
        if value.startswith(prefix):
            return value[len(prefix) :]
    return value


def _checked_uuids(filters: FilterList | None) -> FilterList | None:
    if filters is None:
        return None
    return FilterList(items=tuple(map(normalise_uuid, filters.items)), action=filters.action)


def _seconds(raw: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidDetails(name, f"must be a number of seconds, not {value!r}")
    if value <= 0 or value < low or value > high:
        bound = f"at least {low:g}" if low > 0 else "more than 0"
        raise InvalidDetails(name, f"must be {bound} and at most {high:g} seconds, not {value!r}")
    return float(value)


def _boolean(raw: Mapping[str, Any], name: str, *, default: bool) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise InvalidDetails(name, "must be true or false")
    return value


def _unicast_targets(value: Any) -> tuple[UnicastTarget, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidDetails("unicastTargets", "must be a list of hosts or CIDR ranges")
    targets: list[UnicastTarget] = []
    for index, item in enumerate(value):
        path = f"unicastTargets[{index}]"
        if not isinstance(item, str) or not item.strip():
            raise InvalidDetails(path, "must be a host, host:port or CIDR range")
        targets.extend(_expand_target(path, item.strip()))
    return tuple(dict.fromkeys(targets))


def _expand_target(path: str, text: str) -> list[UnicastTarget]:
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise InvalidDetails(path, f"{text!r} is not a CIDR range") from None
        if network.num_addresses > MAX_UNICAST_HOSTS:
            raise InvalidDetails(
                path, f"{text} holds {network.num_addresses} addresses; at most {MAX_UNICAST_HOSTS}"
            )
        hosts = list(network.hosts()) if network.num_addresses > 2 else list(network)
        return [UnicastTarget(host=str(host)) for host in hosts]
    host, port = _split_host_port(path, text)
    try:
        return [UnicastTarget(host=str(ipaddress.ip_address(host)), port=port)]
    except ValueError:
        raise InvalidDetails(
            path, f"{text!r} is not an IP address (host names are not resolved), host:port or CIDR"
        ) from None


def _split_host_port(path: str, text: str) -> tuple[str, int]:
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise InvalidDetails(path, f"{text!r}: unclosed '['")
        port_text = rest.removeprefix(":") if rest else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""  # a bare IPv6 address or a plain host
    if not port_text:
        return host, WS_DISCOVERY_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidDetails(path, f"{text!r}: port must be 1-65535")
    return host, int(port_text)
