"""Which servers a set of FindServers answers yields, and what each becomes: pure, no I/O.

``select`` applies the rules (application types, the name filter, the URL chosen, hosts replaced,
duplicates removed) and ``state_health`` maps a server state to health; the rules:
docs/handlers/opcua.md, "What brokers get".
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from discovery_handlers.contract import HEALTHY, Device, Health
from discovery_handlers.opcua.details import NameFilter, url_problem

DISCOVERY_URL_PROPERTY = "OPCUA_DISCOVERY_URL"  # Akri's name: brokers read it
APPLICATION_URI_PROPERTY = "OPCUA_APPLICATION_URI"
PRODUCT_URI_PROPERTY = "OPCUA_PRODUCT_URI"
APPLICATION_NAME_PROPERTY = "OPCUA_APPLICATION_NAME"
OPC_TCP_DEFAULT_PORT = 4840
MAX_TEXT_CHARS = 256  # longer names and URIs from the network are cut

# OPC-UA ApplicationType values (Part 4, 7.2)
SERVER = 0
CLIENT = 1
CLIENT_AND_SERVER = 2
DISCOVERY_SERVER = 3
SERVING_TYPES = frozenset({SERVER, CLIENT_AND_SERVER})

# OPC-UA ServerState values (Part 5, 12.6)
RUNNING = 0
STATE_NAMES: Mapping[int, str] = {
    0: "Running", 1: "Failed", 2: "NoConfiguration", 3: "Suspended", 4: "Shutdown", 5: "Test",
    6: "CommunicationFault", 7: "Unknown",
}
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


@dataclass(frozen=True)
class ServerRecord:
    """One ApplicationDescription of a FindServers answer, as plain, length-bounded text."""

    application_uri: str
    product_uri: str
    application_name: str
    application_type: int
    discovery_urls: tuple[str, ...]


@dataclass(frozen=True)
class Answer:
    """What the discovery server at ``reached_url`` answered to FindServers."""

    reached_url: str
    records: tuple[ServerRecord, ...]


@dataclass(frozen=True)
class Candidate:
    """A server to check; ``url`` is its device id and what brokers connect to."""

    url: str
    application_uri: str
    product_uri: str
    application_name: str

    def device(self, health: Health = HEALTHY) -> Device:
        return Device(
            id=self.url,
            properties={
                DISCOVERY_URL_PROPERTY: self.url,
                APPLICATION_URI_PROPERTY: self.application_uri,
                PRODUCT_URI_PROPERTY: self.product_uri,
                APPLICATION_NAME_PROPERTY: self.application_name,
            },
            health=health,
        )


def clean_text(value: object) -> str:
    """Network text made safe for an environment variable: no control characters, bounded."""
    if not isinstance(value, str):
        return ""
    return "".join(ch for ch in value[: MAX_TEXT_CHARS * 2] if ch.isprintable())[:MAX_TEXT_CHARS]


def state_health(state: int) -> Health:
    """A server that answers but is not Running is present and unhealthy."""
    if state == RUNNING:
        return HEALTHY
    return Health.unhealthy(f"server state is {STATE_NAMES.get(state, f'unknown ({state})')}")


def hosts_to_resolve(answers: Iterable[Answer], *, names: NameFilter) -> set[str]:
    """Host names in the URLs ``select`` would choose that must be looked up (no IP literals)."""
    hosts: set[str] = set()
    for answer in answers:
        for record in answer.records:
            url = _kept_url(record, names)
            host = urlsplit(url).hostname if url else None
            if host and not _is_ip(host) and host.lower() not in _LOOPBACK_NAMES:
                hosts.add(host)
    return hosts


def select(
    answers: Iterable[Answer], *, names: NameFilter, unresolvable: frozenset[str] = frozenset()
) -> list[Candidate]:
    """The servers to check, one per URL, sorted by URL; the same for any order of answers."""
    best: dict[tuple[str, int, str], Candidate] = {}
    for answer in answers:
        for record in answer.records:
            url = _kept_url(record, names)
            if url is None:
                continue
            url = _rehost(url, reached=answer.reached_url, unresolvable=unresolvable)
            candidate = Candidate(url, record.application_uri, record.product_uri,
                                  record.application_name)
            key = url_key(url)
            current = best.get(key)
            if current is None or _order(candidate) < _order(current):
                best[key] = candidate
    return sorted(best.values(), key=_order)


def url_key(url: str) -> tuple[str, int, str]:
    """What makes two URLs the same server: host (case-insensitive), port, path."""
    parts = urlsplit(url)
    return ((parts.hostname or "").lower(), parts.port or OPC_TCP_DEFAULT_PORT,
            parts.path.rstrip("/"))


def _order(candidate: Candidate) -> tuple[str, str, str, str]:
    return (candidate.url, candidate.application_uri, candidate.product_uri,
            candidate.application_name)


def _kept_url(record: ServerRecord, names: NameFilter) -> str | None:
    if record.application_type not in SERVING_TYPES or not names.keeps(record.application_name):
        return None
    for url in record.discovery_urls:
        bare = _without_credentials(url)
        if bare is not None and url_problem(bare) is None:
            return bare
    return None


def _without_credentials(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _rehost(url: str, *, reached: str, unresolvable: frozenset[str]) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    reached_host = urlsplit(reached).hostname or ""
    if host in unresolvable or (_is_loopback(host) and not _is_loopback(reached_host)):
        if not reached_host or reached_host == host:
            return url
        shown = f"[{reached_host}]" if ":" in reached_host else reached_host
        netloc = shown if parts.port is None else f"{shown}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    return url


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
