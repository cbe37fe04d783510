"""When the agent starts its device-plugin allocator: only for devices the kubelets allocate,
or for device-plugin slots this node still holds (a switch to the scheduler, then a restart)."""

from __future__ import annotations

import pytest

from agent.device_plugin_seam import holds_slots, wants_device_plugins
from agent.node_devices import NodeDevice, NodeDeviceTable
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
