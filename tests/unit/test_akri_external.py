"""The pure parts of the Akri-protocol adapter: device checks, the registration table, the
request the agent sends, and which names an external handler may serve."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from discovery_handlers.contract import (
    Device,
    DeviceList,
    DeviceSpec,
    Mount,
    PropertyValue,
    Secret,
    warnings_of,
)
from discovery_handlers.debug_echo import handler as debug_echo
from discovery_handlers.external.akriapi import discovery_pb2 as pb
from discovery_handlers.external.devices import convert
from discovery_handlers.external.handler import ExternalHandler, ExternalHandlers
from discovery_handlers.external.registrations import (
    BadRegistration,
    EndpointType,
    Registrations,
)
from discovery_handlers.external.status import HandlerStatus
from discovery_handlers.external.stream import request


def test_devices_convert_with_their_properties_mounts_and_device_nodes() -> None:
    message = pb.Device(
        id="cam0", properties={"URL": "rtsp://x"},
        mounts=[pb.Mount(container_path="/c", host_path="/h", read_only=True)],
        device_specs=[pb.DeviceSpec(container_path="/dev/c", host_path="/dev/h")],
    )
    kept, refused = convert([message])
    assert refused == []
    assert kept == [Device(
        id="cam0", properties={"URL": "rtsp://x"},
        mounts=(Mount(container_path="/c", host_path="/h", read_only=True),),
        device_specs=(DeviceSpec(container_path="/dev/c", host_path="/dev/h",
                                 permissions="rwm"),),
    )]


@pytest.mark.parametrize(("device", "reason"), [
    (pb.Device(id=""), "empty id"),
    (pb.Device(id="  "), "empty id"),
    (pb.Device(id="a", device_specs=[pb.DeviceSpec(container_path="/dev/x")]),
     "device_specs[0] has no host_path"),
    (pb.Device(id="a", device_specs=[pb.DeviceSpec(host_path="/dev/x")]),
     "device_specs[0] has no container_path"),
    (pb.Device(id="a", device_specs=[pb.DeviceSpec(container_path="/x", host_path="/x",
                                                   permissions="rwx")]), "are not r, w, m"),
    (pb.Device(id="a", mounts=[pb.Mount(container_path="/x")]), "mounts[0] has no host_path"),
])
def test_a_malformed_device_is_refused_and_the_others_kept(device: pb.Device, reason: str) -> None:
    kept, refused = convert([pb.Device(id="good"), device, pb.Device(id="also-good")])
    assert [d.id for d in kept] == ["good", "also-good"]
    [refusal] = refused
    assert reason in refusal.reason


def test_a_repeated_id_keeps_the_first() -> None:
    kept, refused = convert([pb.Device(id="a", properties={"N": "1"}),
                             pb.Device(id="a", properties={"N": "2"})])
    assert [d.properties["N"] for d in kept] == ["1"]
    assert "already in the list" in refused[0].reason


def test_the_request_carries_details_and_every_property_as_bytes() -> None:
    sent = request("descriptions: [a]", {"site": "lab", "key": Secret(b"\x00\xff")})
    wire = pb.DiscoverRequest.FromString(sent.SerializeToString())
    assert wire.discovery_details == "descriptions: [a]"
    assert {k: v.vec for k, v in wire.discovery_properties.items()} == {
        "site": b"lab", "key": b"\x00\xff"}


def test_another_endpoint_is_added_beside_the_first_and_wakes_its_waiters() -> None:
    """As in Akri's agent, a name keeps every endpoint registered under it."""
    table = Registrations()
    seen: list[list[str]] = []
    table.on_change(lambda: seen.append(table.names()))
    first = table.register(name="h", endpoint="/run/h.sock", endpoint_type=EndpointType.UDS,
                           shared=False)
    changed = table.changed("h")
    second = table.register(name="h", endpoint="/run/h2.sock", endpoint_type=EndpointType.UDS,
                            shared=False)
    assert changed.is_set()
    assert table.endpoints("h") == (first, second)
    assert table.get("h") == second
    assert second.generation > first.generation
    assert table.drop(first), "each endpoint leaves on its own"
    assert table.endpoints("h") == (second,)
    assert not table.drop(first)
    assert table.drop(second)
    assert table.get("h") is None
    assert seen == [["h"], ["h"], ["h"], []]


def test_the_same_endpoint_registered_again_keeps_the_registration() -> None:
    """Akri's handlers register again whenever the agent closes one of their streams: the
    other streams must go on, so only runs waiting to dial are woken."""
    table = Registrations()
    seen: list[list[str]] = []
    table.on_change(lambda: seen.append(table.names()))
    first = table.register(name="h", endpoint="/run/h.sock", endpoint_type=EndpointType.UDS,
                           shared=True)
    changed, again = table.changed("h"), table.registered_again("h")
    assert table.register(name="h", endpoint="/run/h.sock", endpoint_type=EndpointType.UDS,
                          shared=True) is first
    assert again.is_set()
    assert not changed.is_set()
    assert seen == [["h"]]
    table.register(name="h", endpoint="/run/h.sock", endpoint_type=EndpointType.UDS,
                   shared=False)
    assert changed.is_set(), "another sharing is another registration"


@pytest.mark.parametrize(("endpoint", "kind", "target"), [
    ("/var/lib/akri/onvif.sock", EndpointType.UDS, "unix:///var/lib/akri/onvif.sock"),
    ("http://10.1.2.3:10000", EndpointType.NETWORK, "10.1.2.3:10000"),
    ("10.1.2.3:10000", EndpointType.NETWORK, "10.1.2.3:10000"),
])
def test_targets(endpoint: str, kind: EndpointType, target: str) -> None:
    registration = Registrations().register(name="h", endpoint=endpoint, endpoint_type=kind,
                                            shared=True)
    assert registration.target() == target


@pytest.mark.parametrize(("name", "endpoint", "kind", "why"), [
    ("", "/x.sock", EndpointType.UDS, "name is empty"),
    ("h", "", EndpointType.UDS, "endpoint is empty"),
    ("h", "x.sock", EndpointType.UDS, "absolute"),
    ("h", "https://h:1", EndpointType.NETWORK, "TLS"),
])
def test_unusable_registrations_are_refused(
    name: str, endpoint: str, kind: EndpointType, why: str
) -> None:
    with pytest.raises(BadRegistration, match=why):
        Registrations().register(name=name, endpoint=endpoint, endpoint_type=kind, shared=True)


class _Installed:
    name = "ascend"
    shared = False

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> Any:
        return details

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        yield []


def test_akri_names_and_unknown_names_are_served_externally_others_stay() -> None:
    resolve = ExternalHandlers(Registrations(), grace=1.0, waiting_on="/x")
    assert isinstance(resolve("debugEcho", debug_echo), ExternalHandler)
    assert isinstance(resolve("myHandler", None), ExternalHandler)
    assert resolve("ascend", _Installed()) is None
    assert resolve("myHandler", None) is resolve("myHandler", None)


async def test_an_unregistered_name_without_built_in_waits_and_says_so() -> None:
    table = Registrations()
    handler = ExternalHandler(name="x", registrations=table, builtin=None, grace=1.0,
                              waiting_on="/var/lib/akri/agent-registration.sock")
    details = handler.parse_details("anything: [at all", {})
    stream = handler.discover(details)
    first = await anext(stream)
    assert isinstance(first, HandlerStatus)
    assert list(first) == []
    assert not first.ready
    assert "/var/lib/akri/agent-registration.sock" in first.message
    assert "installed handlers: " in first.message
    assert "debugEcho" in first.message  # a misspelt name is easy to see
    # A registration wakes it: the handler is dialled (here its socket is missing, so the
    # next verdict says it is unreachable, naming why).
    table.register(name="x", endpoint="/nonexistent/x.sock", endpoint_type=EndpointType.UDS,
                   shared=True)
    lost = await asyncio.wait_for(anext(stream), 5.0)
    assert isinstance(lost, HandlerStatus)
    assert not lost.ready
    assert "the socket does not exist" in lost.message
    await stream.aclose()


async def test_the_built_in_serves_while_nothing_is_registered() -> None:
    handler = ExternalHandler(name="debugEcho", registrations=Registrations(),
                              builtin=debug_echo, grace=1.0, waiting_on="/x")
    details = handler.parse_details("descriptions: [foo0]", {})
    stream = handler.discover(details)
    assert [d.id for d in await anext(stream)] == ["foo0"]
    await stream.aclose()


class _Warning:
    """A built-in that carries a discovery warning with its list (as opcua's does)."""

    name = "opcua"
    shared = True

    def parse_details(self, details: str, properties: Mapping[str, PropertyValue]) -> Any:
        return details

    async def discover(self, details: Any) -> AsyncIterator[Sequence[Device]]:
        yield DeviceList([Device(id="s1")], ["discovery server lds-1 stopped answering"])


async def test_a_built_ins_warnings_pass_through() -> None:
    handler = ExternalHandler(name="opcua", registrations=Registrations(), builtin=_Warning(),
                              grace=1.0, waiting_on="/x")
    stream = handler.discover(handler.parse_details("", {}))
    first = await anext(stream)
    assert warnings_of(first) == ("discovery server lds-1 stopped answering",)
    await stream.aclose()


async def test_a_handler_of_other_sharing_that_never_answered_leaves_the_run_as_it_is() -> None:
    """Instance names depend on sharing: a local built-in run is not restarted for a handler of
    shared devices that has not answered (test_akri_stand_in: one that answers restarts it)."""
    table = Registrations()
    handler = ExternalHandler(name="debugEcho", registrations=table, builtin=debug_echo,
                              grace=60.0, waiting_on="/x")
    details = handler.parse_details("descriptions: [foo0]\nshared: false", {})
    assert details.shared is False
    stream = handler.discover(details)
    assert [d.id for d in await anext(stream)] == ["foo0"]
    table.register(name="debugEcho", endpoint="/nonexistent/e.sock",
                   endpoint_type=EndpointType.UDS, shared=True)
    noted = await asyncio.wait_for(anext(stream), 5.0)
    assert [d.id for d in noted] == ["foo0"]
    assert "the socket does not exist" in warnings_of(noted)[0]
    assert handler.parse_details("descriptions: [foo0]\nshared: false", {}).shared is False
    await stream.aclose()
