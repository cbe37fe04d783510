"""Slot backends' answers that need no API write: preferences and early refusals.

The ``SlotWorld`` here is an in-process table of Instances and NodeDevices (the service's own
view), not a stand-in for the Kubernetes API: nothing here reaches a ledger.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import grpc
import pytest
from lightkube import AsyncClient

from agent.deviceplugins.kubelet.backend import PluginError
from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.slots.backends import ConfigurationBackend, InstanceBackend
from agent.deviceplugins.slots.ledger import SlotLedger
from agent.deviceplugins.slots.rules import SlotRef
from agent.discovery.node_devices import NodeDevice
from agent.metrics import AgentMetrics
from crds.instance import Instance, InstanceSpec, SlotUsage
from discovery_handlers.contract import HEALTHY, Device, Health

NODE = "node-a"


def _instance(name: str, usage: dict[str, str], capacity: int = 3) -> Instance:
    return Instance(
        name=name,
        namespace="ns",
        spec=InstanceSpec(
            configuration_name="cam", capacity=capacity, nodes=(NODE,), device_usage=usage
        ),
        reservations={f"{name}-{i}": NODE for i in range(capacity)},
    )


def _device(name: str, *, healthy: bool = True) -> NodeDevice:
    return NodeDevice(
        instance=name,
        namespace="ns",
        configuration="cam",
        device=Device(id=name),
        health=HEALTHY if healthy else Health.unhealthy("test fault"),
    )


class World:
    node = NODE

    def __init__(self, instances: list[Instance], devices: list[NodeDevice]) -> None:
        self.metrics = AgentMetrics()
        self.instances = {i.name: i for i in instances}
        self.devices = {d.instance: d for d in devices}

    def ledger(self, namespace: str, instance: str) -> SlotLedger:
        raise AssertionError("no claim expected in these tests")

    def instance(self, namespace: str, instance: str) -> Instance | None:
        return self.instances.get(instance)

    def remember(self, instance: Instance) -> None:
        self.instances[instance.name] = instance

    def device(self, namespace: str, instance: str) -> NodeDevice | None:
        return self.devices.get(instance)

    def configuration_instances(self, namespace: str, configuration: str) -> list[Instance]:
        return list(self.instances.values())

    def slots_changed(self, refs: Iterable[SlotRef]) -> None:
        raise AssertionError("no claim expected in these tests")

    @property
    def answers_before_recording(self) -> bool:
        return False

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        raise AssertionError("no claim expected in these tests")


async def test_instance_plugin_prefers_slots_this_node_holds_and_honours_must_include() -> None:
    inst = _instance("cam-aaaaaa", {"cam-aaaaaa-2": NODE})
    backend = InstanceBackend(
        world=World([inst], [_device(inst.name)]), namespace="ns", instance=inst.name,
        configuration="cam",
    )
    ids = ["cam-aaaaaa-0", "cam-aaaaaa-1", "cam-aaaaaa-2"]
    assert await backend.preferred_allocation(available=ids, must_include=[], size=1) == [
        "cam-aaaaaa-2"
    ]
    assert await backend.preferred_allocation(
        available=ids, must_include=["cam-aaaaaa-1"], size=2
    ) == ["cam-aaaaaa-1", "cam-aaaaaa-2"]


async def test_configuration_plugin_prefers_held_virtual_devices_on_distinct_instances() -> None:
    one = _instance(
        "cam-aaaaaa", {"cam-aaaaaa-0": f"C:cam-v0:{NODE}", "cam-aaaaaa-1": f"C:cam-v1:{NODE}"}
    )
    two = _instance("cam-bbbbbb", {"cam-bbbbbb-0": f"C:cam-v2:{NODE}"})
    world = World([one, two], [_device(one.name), _device(two.name)])
    feed = DeviceFeed(AdvertisedDevice(f"cam-v{i}") for i in range(6))
    backend = ConfigurationBackend(
        world=world, namespace="ns", configuration="cam", feed=feed
    )
    available = [f"cam-v{i}" for i in range(6)]
    chosen = await backend.preferred_allocation(
        available=available, must_include=["cam-v0"], size=2
    )
    assert chosen == ["cam-v0", "cam-v2"], "held ids, a second Instance before a second slot"


async def test_unknown_and_unhealthy_devices_are_refused_before_any_claim() -> None:
    inst = _instance("cam-aaaaaa", {})
    sick = _instance("cam-cccccc", {})
    world = World([inst, sick], [_device(inst.name), _device(sick.name, healthy=False)])
    backend = InstanceBackend(world=world, namespace="ns", instance=inst.name, configuration="cam")
    with pytest.raises(PluginError) as unknown:
        await backend.allocate([["cam-aaaaaa-9"]])
    assert unknown.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "cam-aaaaaa-9" in unknown.value.message

    unhealthy = InstanceBackend(world=world, namespace="ns", instance=sick.name,
                                configuration="cam")
    with pytest.raises(PluginError) as refused:
        await unhealthy.allocate([["cam-cccccc-0"]])
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "unhealthy" in refused.value.message

    feed = DeviceFeed([AdvertisedDevice("cam-v0")])
    configuration = ConfigurationBackend(
        world=world, namespace="ns", configuration="cam", feed=feed
    )
    with pytest.raises(PluginError) as bad_vid:
        await configuration.allocate([["cam-v5"]])
    assert bad_vid.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "cam-v5" in bad_vid.value.message
    # Counted per Configuration, node and kind of resource, never per Instance or resource.
    get = world.metrics.registry.get_sample_value
    labels = {"namespace": "ns", "configuration": "cam", "node": NODE, "outcome": "refused"}
    assert get("edgeplug_allocations_total", {**labels, "kind": "instance"}) == 2
    assert get("edgeplug_allocations_total", {**labels, "kind": "configuration"}) == 1


async def test_a_promised_slot_counts_as_held_when_the_kubelet_asks_to_prepare() -> None:
    """The fast path answers Allocate before the slot is recorded in the Instance; the kubelet's
    PreStartContainer may come first, and must find the id's slot in the ledger's promises."""
    inst = _instance("cam-aaaaaa", {})
    ledger = SlotLedger(client=cast(AsyncClient, None), node=NODE, namespace="ns",
                        name=inst.name)
    ledger.promised["cam-aaaaaa-1"] = SlotUsage.by_configuration("cam-v0", NODE)

    class Promised(World):
        def ledger(self, namespace: str, instance: str) -> SlotLedger:
            return ledger

    backend = ConfigurationBackend(
        world=Promised([inst], [_device(inst.name)]), namespace="ns", configuration="cam",
        feed=DeviceFeed([AdvertisedDevice("cam-v0")]))
    await backend.pre_start(["cam-v0"])
    with pytest.raises(PluginError, match="'cam-v1' holds no slot"):
        await backend.pre_start(["cam-v1"])
