"""Which devices a pod holds, from the ids pod-resources lists
(agent/deviceplugins/pod_annotations.py): an Instance plugin's slots, a configuration plugin's
virtual ids through ``deviceUsage``; an id not recorded yet means "ask again", never a partial
answer."""

from __future__ import annotations

import asyncio

from agent.deviceplugins.pod_annotations import devices_of
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from crds.instance import Instance
from discovery_handlers.contract import Device

NODE = "npu-a"


def _instance(name: str, usage: dict[str, str]) -> Instance:
    return Instance.from_object({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"configurationName": "npu", "capacity": 1, "nodes": [NODE],
                 "deviceUsage": usage}})


def _world() -> tuple[dict[tuple[str, str], Instance], NodeDeviceTable]:
    instances = {
        ("ml", "npu-aaaaaa"): _instance("npu-aaaaaa", {"npu-aaaaaa-0": f"C:npu-v0:{NODE}"}),
        ("ml", "npu-bbbbbb"): _instance("npu-bbbbbb", {"npu-bbbbbb-0": f"C:npu-v5:{NODE}"}),
        ("ml", "npu-cccccc"): _instance("npu-cccccc", {"npu-cccccc-0": "C:npu-v1:npu-b"}),
    }
    table = NodeDeviceTable()
    for (namespace, name), phy in zip(instances, (0, 1, 2), strict=True):
        asyncio.run(table.put(NodeDevice(instance=name, namespace=namespace, configuration="npu",
                                         device=Device(id=f"davinci{phy}", properties={}))))
    return instances, table


def test_virtual_ids_map_through_device_usage_and_slots_to_their_instance() -> None:
    instances, table = _world()

    def of(resource: str, ids: list[str]) -> list[str] | None:
        found = devices_of(resource, ids, node=NODE, instances=instances,
                           configuration_resources={("ml", "npu"): "huawei.com/Ascend910"},
                           table=table)
        return None if found is None else [d.device.id for d in found]

    assert of("huawei.com/Ascend910", ["npu-v5", "npu-v0"]) == ["davinci1", "davinci0"]
    assert of("edgeplug.io/npu-cccccc", ["npu-cccccc-0"]) == ["davinci2"]
    # Another node's claim, or one not recorded yet: not ours to name, ask again later.
    assert of("huawei.com/Ascend910", ["npu-v0", "npu-v1"]) is None
    assert of("huawei.com/Ascend910", ["npu-v7"]) is None
    assert of("nvidia.com/gpu", ["GPU-1"]) == []
