"""Parse an ``opcua`` Configuration's ``discoveryDetails`` and discovery properties.

``parse_details`` returns ``OpcuaDetails`` or refuses naming the field; it imports no OPC-UA
library (the webhook and ``edgeplug discover`` call it). Akri's shape plus our fields:
docs/handlers/opcua.md, "Configuration".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from discovery_handlers.contract import InvalidDetails, PropertyValue, Secret
from discovery_handlers.yaml_details import load_mapping, refuse_unknown

DEFAULT_DISCOVERY_URL = "opc.tcp://localhost:4840/"
DEFAULT_INTERVAL_S = 2.0  # Akri asks every 10 s
DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_CONCURRENT_CHECKS = 32
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
MIN_TIMEOUT_S = 0.05
MAX_TIMEOUT_S = 300.0
MAX_CONCURRENT_CHECKS = 1024
MAX_DISCOVERY_URLS = 256
CERTIFICATE_PROPERTY = "clientCertificate"
PRIVATE_KEY_PROPERTY = "clientPrivateKey"
_PEM_MARKER = b"-----BEGIN"
_DER_SEQUENCE = 0x30

_TOP_FIELDS = frozenset({
    "opcuaDiscoveryMethod", "applicationNames", "discoveryIntervalSeconds", "timeoutSeconds",
    "maxConcurrentChecks", "security",
})
_SECURITY_FIELDS = frozenset({"policy", "mode", "applicationUri"})
POLICIES = ("None", "Basic128Rsa15", "Basic256", "Basic256Sha256", "Aes128Sha256RsaOaep",
            "Aes256Sha256RsaPss")


class FilterAction(Enum):
    INCLUDE = "Include"
    EXCLUDE = "Exclude"


class SecurityMode(Enum):
    SIGN = "Sign"
    SIGN_AND_ENCRYPT = "SignAndEncrypt"


@dataclass(frozen=True)
class NameFilter:
    """Akri's filter list: keep names in ``items`` (Include) or not in them (Exclude).

    No list at all keeps every name; a list without ``action`` is Include (Akri's defaults).
    """

    items: frozenset[str] = frozenset()
    action: FilterAction = FilterAction.EXCLUDE

    def keeps(self, name: str) -> bool:
        return (name in self.items) == (self.action is FilterAction.INCLUDE)


@dataclass(frozen=True)
class Security:
    """How the server check's session is secured; the certificate and key stay ``Secret``."""

    policy: str
    mode: SecurityMode
    certificate: Secret = field(repr=False)
    private_key: Secret = field(repr=False)
    application_uri: str | None = None


@dataclass(frozen=True)
class OpcuaDetails:
    """Parsed ``discoveryDetails`` of an ``opcua`` Configuration."""

    discovery_urls: tuple[str, ...] = (DEFAULT_DISCOVERY_URL,)
    application_names: NameFilter = NameFilter()
    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_concurrent_checks: int = DEFAULT_MAX_CONCURRENT_CHECKS
    security: Security | None = None


def parse_details(details: str, properties: Mapping[str, PropertyValue]) -> OpcuaDetails:
    """Validate ``discoveryDetails`` (YAML) and properties; ``InvalidDetails`` names the field."""
    raw = load_mapping(details, field="opcuaDiscoveryMethod",
                       expected="required: a mapping with 'standard'")
    refuse_unknown(raw, _TOP_FIELDS)
    return OpcuaDetails(
        discovery_urls=_discovery_urls(raw.get("opcuaDiscoveryMethod")),
        application_names=_name_filter(raw.get("applicationNames")),
        interval_s=_seconds(raw, "discoveryIntervalSeconds", DEFAULT_INTERVAL_S,
                            MIN_INTERVAL_S, MAX_INTERVAL_S),
        timeout_s=_seconds(raw, "timeoutSeconds", DEFAULT_TIMEOUT_S, MIN_TIMEOUT_S, MAX_TIMEOUT_S),
        max_concurrent_checks=_count(raw, "maxConcurrentChecks", DEFAULT_MAX_CONCURRENT_CHECKS),
        security=_security(raw.get("security"), properties),
    )


def _discovery_urls(method: Any) -> tuple[str, ...]:
    if method is None:
        raise InvalidDetails("opcuaDiscoveryMethod", "required: a mapping with 'standard'")
    if not isinstance(method, dict) or set(map(str, method)) != {"standard"}:
        raise InvalidDetails("opcuaDiscoveryMethod", "must be a mapping with only 'standard'")
    standard = method["standard"]
    if standard is None:
        return (DEFAULT_DISCOVERY_URL,)
    path = "opcuaDiscoveryMethod.standard"
    if not isinstance(standard, dict):
        raise InvalidDetails(path, "must be a mapping (with optional 'discoveryUrls')")
    refuse_unknown(standard, frozenset({"discoveryUrls"}), prefix=path + ".")
    urls = standard.get("discoveryUrls")
    if urls is None or urls == []:
        return (DEFAULT_DISCOVERY_URL,)  # Akri's default when the list is absent or empty
    path += ".discoveryUrls"
    if not isinstance(urls, list):
        raise InvalidDetails(path, "must be a list of opc.tcp:// URLs")
    if len(urls) > MAX_DISCOVERY_URLS:
        raise InvalidDetails(path, f"at most {MAX_DISCOVERY_URLS} URLs")
    seen: list[str] = []
    for index, url in enumerate(urls):
        problem = url_problem(url)
        if problem:
            raise InvalidDetails(f"{path}[{index}]", problem)
        if url in seen:
            raise InvalidDetails(f"{path}[{index}]", f"duplicate URL {url!r}")
        seen.append(url)
    return tuple(seen)


def url_problem(url: Any) -> str | None:
    """Why ``url`` is no usable ``opc.tcp://host:port/path`` URL, or None when it is."""
    if not isinstance(url, str) or not url:
        return "must be a non-empty string"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a valid URL: {exc}"
    if parts.scheme != "opc.tcp":
        return "must start with opc.tcp:// (the only transport checked)"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (use discoveryProperties from a Secret)"
    if port == 0:
        return "port 0 is not a port"
    if any(ord(ch) < 0x21 for ch in url):
        return "must not contain spaces or control characters"
    return None


def _name_filter(raw: Any) -> NameFilter:
    if raw is None:
        return NameFilter()
    if not isinstance(raw, dict):
        raise InvalidDetails("applicationNames", "must be a mapping with 'items' and 'action'")
    refuse_unknown(raw, frozenset({"items", "action"}), prefix="applicationNames.")
    items = raw.get("items", [])
    if not isinstance(items, list):
        raise InvalidDetails("applicationNames.items", "must be a list of application names")
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise InvalidDetails(f"applicationNames.items[{index}]", "must be a string")
    action = raw.get("action", FilterAction.INCLUDE.value)  # Akri's default, once a list is given
    try:
        parsed = FilterAction(action)
    except ValueError:
        raise InvalidDetails("applicationNames.action", "must be Include or Exclude") from None
    return NameFilter(items=frozenset(items), action=parsed)


def _seconds(raw: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidDetails(name, "must be a number of seconds")
    if not low <= value <= high:
        raise InvalidDetails(name, f"must be between {low} and {high} seconds")
    return float(value)


def _count(raw: dict[str, Any], name: str, default: int) -> int:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDetails(name, "must be a whole number")
    if not 1 <= value <= MAX_CONCURRENT_CHECKS:
        raise InvalidDetails(name, f"must be between 1 and {MAX_CONCURRENT_CHECKS}")
    return value


def _security(raw: Any, properties: Mapping[str, PropertyValue]) -> Security | None:
    given = [name for name in (CERTIFICATE_PROPERTY, PRIVATE_KEY_PROPERTY) if name in properties]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidDetails("security", "must be a mapping with 'policy' and 'mode'")
    refuse_unknown(raw, _SECURITY_FIELDS, prefix="security.")
    policy = raw.get("policy", "None")
    if policy not in POLICIES:
        raise InvalidDetails("security.policy", f"must be one of {list(POLICIES)}")
    if policy == "None":
        if "mode" in raw or "applicationUri" in raw or given:
            what = "security.mode/applicationUri" if not given else f"property {given[0]!r}"
            raise InvalidDetails("security.policy",
                                 f"{what} given, but no security policy (set security.policy)")
        return None
    try:
        mode = SecurityMode(raw.get("mode", SecurityMode.SIGN_AND_ENCRYPT.value))
    except ValueError:
        raise InvalidDetails("security.mode", "must be Sign or SignAndEncrypt") from None
    uri = raw.get("applicationUri")
    if uri is not None and (not isinstance(uri, str) or not uri):
        raise InvalidDetails("security.applicationUri", "must be a non-empty string")
    return Security(
        policy=policy, mode=mode, application_uri=uri,
        certificate=_credential(properties, CERTIFICATE_PROPERTY, "certificate",
                                secret_only=False),
        private_key=_credential(properties, PRIVATE_KEY_PROPERTY, "private key",
                                secret_only=True),
    )


def _credential(properties: Mapping[str, PropertyValue], name: str, what: str, *,
                secret_only: bool) -> Secret:
    """A certificate or key property as ``Secret`` bytes; the message never shows its content."""
    path = f"security (discoveryProperties {name})"
    value = properties.get(name)
    if value is None:
        raise InvalidDetails(path, f"required with a security policy: the client {what}")
    if not isinstance(value, Secret):
        if secret_only:
            raise InvalidDetails(path, f"the client {what} must come from a Secret (secretKeyRef)")
        value = Secret(value.encode("utf-8"))
    data = value.value.lstrip()
    if not (data.startswith(_PEM_MARKER) or (data and data[0] == _DER_SEQUENCE)):
        raise InvalidDetails(path, f"the client {what} is neither PEM nor DER")
    return value
