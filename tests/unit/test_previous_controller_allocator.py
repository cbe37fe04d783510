"""An agent of this release beside a controller of the previous one (docs/operations.md,
"Version skew"): that controller writes the allocator only as ``status.sharedDeviceAllocation``
and means it for shared devices alone, mapping no local device's resource to a DeviceClass.
So a Configuration of local devices it said ``dra`` for stays on the device plugins (served by
name, never in the node's pool), a shared one follows it, and once a controller of this release
writes ``status.allocator`` (or the spec chooses), that choice holds for every device.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.device_plugin_seam import wants_device_plugins
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from crds.configuration import Allocator, allocator_of, decided_for_shared_devices_only
from discovery_handlers.contract import Device

PREVIOUS = {"status": {"sharedDeviceAllocation": "dra"}}
THIS = {"status": {"allocator": "dra", "sharedDeviceAllocation": "dra"}}


@pytest.mark.parametrize(("obj", "shared_only"), [
    (PREVIOUS, True),
    (THIS, False),
    ({"spec": {"allocator": "dra"}, "status": {"sharedDeviceAllocation": "dra"}}, False),
    ({"spec": {"sharedDeviceAllocation": "dra"}, "status": PREVIOUS["status"]}, False),
    ({"status": {"sharedDeviceAllocation": "devicePlugin"}}, True),
    ({}, False),  # nothing said yet
    ({"spec": {"allocator": "neither"}, "status": PREVIOUS["status"]}, False),
])
def test_only_a_status_under_the_earlier_name_alone_is_the_previous_controllers(
    obj: dict[str, Any], shared_only: bool,
) -> None:
    assert decided_for_shared_devices_only(obj) is shared_only


async def _table(shared: bool, obj: dict[str, Any]) -> NodeDeviceTable:
    table = NodeDeviceTable()
    await table.put(NodeDevice(instance="lamps-0a0b0c", namespace="ns", configuration="lamps",
                               device=Device(id="lamp"), shared=shared))
    await table.set_allocator("ns", "lamps", allocator_of(obj),
                              shared_only=decided_for_shared_devices_only(obj))
    return table


async def test_local_devices_stay_on_the_device_plugins_under_the_previous_controller() -> None:
    table = await _table(False, PREVIOUS)
    assert table.allocator("ns", "lamps") == Allocator.DEVICE_PLUGIN
    assert wants_device_plugins(table, dra=True), "the device plugins start for them"
    # A controller of this release says it for every device: they go to the scheduler.
    version = table.version
    await table.set_allocator("ns", "lamps", allocator_of(THIS),
                              shared_only=decided_for_shared_devices_only(THIS))
    assert table.version != version, "readers are woken"
    assert table.allocator("ns", "lamps") == Allocator.DRA


async def test_shared_devices_follow_the_previous_controller() -> None:
    table = await _table(True, PREVIOUS)
    assert table.allocator("ns", "lamps") == Allocator.DRA
    await table.remove("ns", "lamps-0a0b0c")
    assert table.allocator("ns", "lamps") == Allocator.DEVICE_PLUGIN, (
        "no shared device left here: what remains of it is local")


async def test_this_controllers_choice_holds_for_local_devices() -> None:
    table = await _table(False, THIS)
    assert table.allocator("ns", "lamps") == Allocator.DRA
    await table.set_allocator("ns", "lamps", None)
    assert table.allocator("ns", "lamps") is None
