"""When the agent starts its device-plugin allocator: only for devices the kubelets allocate,
or for device-plugin slots this node still holds (a switch to the scheduler, then a restart)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2 as httpx
import pytest
from lightkube import ApiError

from agent.device_plugin_seam import holds_slots, serve_when_wanted, wants_device_plugins
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube import watching
from crds.configuration import Allocator
from crds.naming import slot_id
from discovery_handlers.contract import Device
from tests.harness.slot_instances import NAME, slot_instance

DRA, PLUGINS = Allocator.DRA, Allocator.DEVICE_PLUGIN


async def _table(allocators: dict[str, Allocator | None]) -> NodeDeviceTable:
    """One served device per Configuration, each with the allocator given (None: not said)."""
    table = NodeDeviceTable()
    for index, (configuration, allocator) in enumerate(allocators.items()):
        await table.put(NodeDevice(instance=f"{configuration}-{index:06x}", namespace="ns",
                                   configuration=configuration, device=Device(id=str(index))))
        await table.set_allocator("ns", configuration, allocator)
    return table


@pytest.mark.parametrize(("allocators", "dra", "wanted"), [
    ({}, True, False),
    ({}, False, False),  # nothing served yet: nothing to start for
    ({"cams": DRA, "usb": DRA}, True, False),  # the default: the scheduler allocates all
    ({"cams": DRA, "usb": PLUGINS}, True, True),
    ({"usb": None}, True, False),  # not decided yet: an agent with DRA waits for the choice
    ({"usb": None}, False, True),  # without DRA the kubelets are the only allocator it has
    ({"usb": DRA}, False, False),  # said DRA, and this agent has none: served to nobody
])
async def test_device_plugins_are_wanted_only_for_devices_the_kubelets_allocate(
    allocators: dict[str, Allocator | None], dra: bool, wanted: bool,
) -> None:
    assert wants_device_plugins(await _table(allocators), dra=dra) is wanted


@pytest.mark.parametrize(("usage", "held"), [
    ({}, False),
    ({slot_id(NAME, 0): "", slot_id(NAME, 1): ""}, False),
    ({slot_id(NAME, 0): "node-b"}, False),  # another node's slot
    ({slot_id(NAME, 0): "node-a"}, True),
    ({slot_id(NAME, 1): "C:cam-v0:node-a"}, True),  # through the Configuration's plugin
    ({slot_id(NAME, 1): "C:cam-v0:node-b"}, False),
])
def test_a_slot_this_node_holds_through_device_plugins_is_found(
    usage: dict[str, str], held: bool,
) -> None:
    assert holds_slots("node-a", [slot_instance(usage=usage)]) is held


class _FlakyList:
    """A client whose first list of Instances is refused with 429 (the API server
    (re)initialising the CRD's storage), then lists none."""

    def __init__(self) -> None:
        self.lists = 0

    def list(self, *_: object, **__: object) -> AsyncIterator[object]:
        self.lists += 1
        return self._listed(refused=self.lists == 1)

    async def _listed(self, *, refused: bool) -> AsyncIterator[object]:
        if refused:
            response = httpx.Response(429, request=httpx.Request("GET", "https://api/"), json={
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 429,
                "reason": "TooManyRequests", "message": "storage is (re)initializing"})
            raise ApiError(response=response)
        nothing: tuple[object, ...] = ()
        for found in nothing:
            yield found


async def test_a_refused_first_list_is_retried_not_the_end_of_the_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watching, "retry_delay", lambda failures: 0.0)
    client, served = _FlakyList(), asyncio.Event()

    async def serve() -> None:
        served.set()

    await serve_when_wanted(client=client, node_name="node-a",  # type: ignore[arg-type]
                            devices=await _table({"usb": PLUGINS}), dra=True, serve=serve)
    assert served.is_set()
    assert client.lists == 2, "the refused list was sent again"
