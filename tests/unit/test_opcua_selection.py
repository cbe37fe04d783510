"""opcua selection rules over tables: which FindServers entries become devices, with which URL,
properties and health, the same whatever order the answers come in."""

from __future__ import annotations

import itertools

import pytest

from discovery_handlers.contract import HEALTHY
from discovery_handlers.opcua.details import FilterAction, NameFilter
from discovery_handlers.opcua.selection import (
    CLIENT,
    CLIENT_AND_SERVER,
    DISCOVERY_SERVER,
    MAX_TEXT_CHARS,
    SERVER,
    Answer,
    Candidate,
    ServerRecord,
    clean_text,
    hosts_to_resolve,
    select,
    state_health,
)

LDS = "opc.tcp://10.0.0.5:4840/"
ALL = NameFilter()


def rec(name: str, *urls: str, kind: int = SERVER, uri: str | None = None) -> ServerRecord:
    return ServerRecord(uri or f"urn:{name}", "urn:product", name, kind, urls)


def urls(candidates: list[Candidate]) -> list[str]:
    return [c.url for c in candidates]


@pytest.mark.parametrize(("kind", "kept"), [
    (SERVER, True), (CLIENT_AND_SERVER, True), (CLIENT, False), (DISCOVERY_SERVER, False),
    (-1, False), (99, False),
])
def test_application_types(kind: int, kept: bool) -> None:
    answer = Answer(LDS, (rec("a", "opc.tcp://10.0.0.6:4841/", kind=kind),))
    assert bool(select([answer], names=ALL)) is kept


@pytest.mark.parametrize(("record_urls", "chosen"), [
    (("opc.tcp://10.0.0.6:1/",), "opc.tcp://10.0.0.6:1/"),
    (("http://10.0.0.6:80/", "opc.tcp://10.0.0.6:2/"), "opc.tcp://10.0.0.6:2/"),
    (("opc.https://10.0.0.6:3/", "opc.tcp://10.0.0.6:4/", "opc.tcp://10.0.0.6:5/"),
     "opc.tcp://10.0.0.6:4/"),
    (("opc.tcp://user:pw@10.0.0.6:6/x",), "opc.tcp://10.0.0.6:6/x"),
    (("opc.tcp://10.0.0.6:99999/", "opc.tcp://10.0.0.6:7/"), "opc.tcp://10.0.0.6:7/"),
    (("http://only-http/",), None),
    ((), None),
    (("not a url at all",), None),
])
def test_prefers_the_first_usable_opc_tcp_url(record_urls: tuple[str, ...],
                                               chosen: str | None) -> None:
    found = select([Answer(LDS, (rec("a", *record_urls),))], names=ALL)
    assert urls(found) == ([chosen] if chosen else [])


@pytest.mark.parametrize(("reached", "server_url", "unresolvable", "expected"), [
    # the server registered as localhost: that means the discovery server's machine
    ("opc.tcp://10.0.0.5:4840/", "opc.tcp://localhost:4841/", set(), "opc.tcp://10.0.0.5:4841/"),
    ("opc.tcp://10.0.0.5:4840/", "opc.tcp://127.0.0.1:4841/p", set(),
     "opc.tcp://10.0.0.5:4841/p"),
    # reached on loopback: loopback stays
    ("opc.tcp://127.0.0.1:4840/", "opc.tcp://localhost:4841/", set(), "opc.tcp://localhost:4841/"),
    # a host name the agent cannot resolve (akri#555) takes the discovery server's address
    ("opc.tcp://10.0.0.5:4840/", "opc.tcp://plc-7:4841/", {"plc-7"}, "opc.tcp://10.0.0.5:4841/"),
    ("opc.tcp://[fd00::5]:4840/", "opc.tcp://plc-7:4841/", {"plc-7"},
     "opc.tcp://[fd00::5]:4841/"),
    ("opc.tcp://10.0.0.5:4840/", "opc.tcp://plc-7/", {"plc-7"}, "opc.tcp://10.0.0.5/"),
    # a name that resolves stays
    ("opc.tcp://10.0.0.5:4840/", "opc.tcp://plc-8:4841/", {"plc-7"}, "opc.tcp://plc-8:4841/"),
])
def test_host_replacement(reached: str, server_url: str, unresolvable: set[str],
                          expected: str) -> None:
    found = select([Answer(reached, (rec("a", server_url),))], names=ALL,
                   unresolvable=frozenset(unresolvable))
    assert urls(found) == [expected]


def test_hosts_to_resolve_skips_addresses_and_loopback() -> None:
    answer = Answer(LDS, (rec("a", "opc.tcp://plc-7:1/"), rec("b", "opc.tcp://10.0.0.9:1/"),
                          rec("c", "opc.tcp://localhost:1/"), rec("d", "opc.tcp://[::1]:1/"),
                          rec("e", "opc.tcp://client-only:1/", kind=CLIENT)))
    assert hosts_to_resolve([answer], names=ALL) == {"plc-7"}


def test_name_filter_include_and_exclude() -> None:
    answer = Answer(LDS, (rec("a", "opc.tcp://10.0.0.6:1/"), rec("b", "opc.tcp://10.0.0.6:2/")))
    include = NameFilter(frozenset({"a"}), FilterAction.INCLUDE)
    exclude = NameFilter(frozenset({"a"}), FilterAction.EXCLUDE)
    assert [c.application_name for c in select([answer], names=include)] == ["a"]
    assert [c.application_name for c in select([answer], names=exclude)] == ["b"]


def test_duplicates_removed_whatever_the_order() -> None:
    direct = Answer("opc.tcp://10.0.0.6:1/", (rec("a", "opc.tcp://10.0.0.6:1/"),))
    via_lds = Answer(LDS, (rec("a", "opc.tcp://10.0.0.6:1"), rec("b", "opc.tcp://10.0.0.7:1/"),
                           rec("a", "opc.tcp://10.0.0.6:1/", uri="urn:other"),
                           rec("c", "opc.tcp://10.0.0.7:4840/x"),
                           rec("c", "opc.tcp://10.0.0.7/x/")))
    results = set()
    for order in itertools.permutations([direct, via_lds]):
        for reverse in (False, True):
            answers = [Answer(a.reached_url, tuple(reversed(a.records)) if reverse else a.records)
                       for a in order]
            results.add(tuple(select(answers, names=ALL)))
    assert len(results) == 1, "the same devices, whatever the order"
    [found] = results
    assert [c.url for c in found] == ["opc.tcp://10.0.0.6:1", "opc.tcp://10.0.0.7/x/",
                                      "opc.tcp://10.0.0.7:1/"]


def test_device_carries_akris_property_and_ours() -> None:
    device = Candidate("opc.tcp://10.0.0.6:1/", "urn:a", "urn:p", "Line 1").device()
    assert device.id == "opc.tcp://10.0.0.6:1/"
    assert dict(device.properties) == {
        "OPCUA_DISCOVERY_URL": "opc.tcp://10.0.0.6:1/", "OPCUA_APPLICATION_URI": "urn:a",
        "OPCUA_PRODUCT_URI": "urn:p", "OPCUA_APPLICATION_NAME": "Line 1"}
    assert device.health == HEALTHY


@pytest.mark.parametrize(("state", "healthy", "reason"), [
    (0, True, ""), (1, False, "server state is Failed"), (3, False, "server state is Suspended"),
    (4, False, "server state is Shutdown"), (42, False, "server state is unknown (42)"),
])
def test_state_health(state: int, healthy: bool, reason: str) -> None:
    health = state_health(state)
    assert (health.healthy, health.reason) == (healthy, reason)


@pytest.mark.parametrize(("value", "expected"), [
    ("Line 1", "Line 1"), ("a\nb\x00c\x1b[31m", "abc[31m"), (None, ""), (7, ""),
    ("x" * 10_000, "x" * MAX_TEXT_CHARS),
])
def test_clean_text(value: object, expected: str) -> None:
    assert clean_text(value) == expected
