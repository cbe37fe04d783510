"""Volcano's view of the chips: the agent keeps ``kube-system/mindx-dl-deviceinfo-<node>`` in
Huawei's format as chips fail, recover and are taken by pods.

Real API server; the ``ascend`` handler reads the DCMI stand-in (Huawei's C ABI,
tests/harness/ascend_dcmi), standing in for a node's NPUs; its devices go into the agent's
device table as discovery puts them; the agent's writer (``agent.discovery.volcano_device_info``)
runs as it does in ``run_agent``. What is checked is what Volcano's Ascend plugin reads: the data
keys, the ``DeviceInfoCfg`` JSON (its ``CheckCode`` recomputed here independently as the
SHA-256 of the ``DeviceInfo`` object in Go's encoding), the free, unhealthy and network lists and
the fault list's levels, and the Node's ``baseDeviceInfos`` annotation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Node

from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.discovery.volcano_device_info import DeviceInfoWriter
from agent.kube.node_instances import LABEL_VALUE, serves_label
from discovery_handlers.ascend import handler
from tests.harness.agent_process import api_client, eventually
from tests.harness.aio_process import task_running
from tests.harness.ascend_node import LEVEL_CODES, AscendNode, SimChip, dcmi_library
from tests.harness.controlplane import ControlPlane

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
pytestmark = pytest.mark.timeout(120)
CONFIGURATION = "npu"


@pytest.fixture
def node(tmp_path: Path, dcmi_library: Path, monkeypatch: pytest.MonkeyPatch) -> AscendNode:
    chips = [SimChip(card=i // 2, dev=i % 2, logic=i, phy=i) for i in range(4)]
    emulated = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    for name, value in emulated.env.items():
        monkeypatch.setenv(name, value)
    return emulated


async def _discovery(node: AscendNode, table: NodeDeviceTable, namespace: str) -> None:
    """The handler's device lists into the table, as the agent's discovery run puts them."""
    details = handler.parse_details(node.details(healthPollSeconds=1), {})
    async for devices in handler.discover(details):
        for device in devices:
            await table.put(NodeDevice(
                instance=f"{CONFIGURATION}-{device.id}", namespace=namespace,
                configuration=CONFIGURATION, device=device, health=device.health,
                handler=handler, details=details))


@contextlib.asynccontextmanager
async def _writing(control_plane: ControlPlane, node: AscendNode, name: str, namespace: str
                   ) -> AsyncIterator[AsyncClient]:
    table = NodeDeviceTable()
    client = api_client(control_plane)
    writer = DeviceInfoWriter(client=client, node=name, devices=table)
    try:
        async with (task_running(_discovery(node, table, namespace), name="discovery"),
                    task_running(writer.run(), name="device-info")):
            yield client
    finally:
        await client.close()


async def _device_info(client: AsyncClient, name: str) -> dict[str, Any]:
    cm = await client.get(ConfigMap, f"mindx-dl-deviceinfo-{name}", namespace="kube-system")
    assert cm.metadata is not None
    assert cm.metadata.labels == {"mx-consumer-cim": "true"}
    data = cm.data or {}
    assert set(data) == {"DeviceInfoCfg", "ManuallySeparateNPU", "UpgradeFaultReason",
                         "Description"}
    cache = json.loads(data["DeviceInfoCfg"])
    assert list(cache) == ["DeviceInfo", "SuperPodID", "ServerIndex", "CheckCode"]
    info = cache["DeviceInfo"]
    go_encoding = json.dumps(info, separators=(",", ":"), sort_keys=True)
    assert cache["CheckCode"] == hashlib.sha256(go_encoding.encode()).hexdigest()
    lists: dict[str, Any] = dict(info["DeviceList"])
    lists["huawei.com/Ascend910-Fault"] = json.loads(lists["huawei.com/Ascend910-Fault"])
    return lists


def _levels(lists: dict[str, Any]) -> dict[str, str]:
    return {f["npu_name"]: f["fault_level"] for f in lists["huawei.com/Ascend910-Fault"]
            if f["fault_type"] == "CardUnhealthy"}


async def test_the_configmap_follows_faults_recoveries_and_use(
        control_plane: ControlPlane, node: AscendNode, namespace: str) -> None:
    name = f"npu-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
    node.link(3, 3)  # chip 3's RoCE link unreachable (DCMI_RDFX_DETECT_UNREACH)
    async with _writing(control_plane, node, name, namespace) as client:

        async def shows(free: str, unhealthy: str, levels: dict[str, str]
                        ) -> dict[str, Any] | None:
            lists = await _device_info(client, name)
            ok = (lists["huawei.com/Ascend910"] == free
                  and lists["huawei.com/Ascend910-Unhealthy"] == unhealthy
                  and _levels(lists) == levels)
            return lists if ok else None

        every = "Ascend910-0,Ascend910-1,Ascend910-2,Ascend910-3"
        first = await eventually(lambda: shows(every, "", {}), what="all four chips free")
        assert first["huawei.com/Ascend910-NetworkUnhealthy"] == "Ascend910-3"
        assert first["huawei.com/Ascend910-Recovering"] == ""
        assert [f["fault_type"] for f in first["huawei.com/Ascend910-Fault"]] == [
            "CardNetworkUnhealthy"]
        # Every chip on the Node, for Volcano's own count of the free ones.
        meta = (await client.get(Node, name)).metadata
        assert meta is not None
        assert json.loads((meta.annotations or {})["baseDeviceInfos"]) == {
            f"Ascend910-{phy}": {"IP": "", "SuperDeviceID": 0} for phy in range(4)}

        node.fault(2, errors=(LEVEL_CODES["SeparateNPU"], LEVEL_CODES["NotHandleFault"]))
        node.fault(0, errors=(LEVEL_CODES["NotHandleFault"],))
        faulted = await eventually(lambda: shows(
            "Ascend910-0,Ascend910-1,Ascend910-3", "Ascend910-2",
            {"Ascend910-0": "NotHandleFault", "Ascend910-2": "SeparateNPU"}),
            what="chip 2 separated, chip 0 keeps serving with a NotHandleFault code")
        entry = next(f for f in faulted["huawei.com/Ascend910-Fault"]
                     if f["npu_name"] == "Ascend910-2")
        assert entry["fault_code"] == "80E3A201,80E21007"
        assert entry["fault_handling"] == entry["large_model_fault_level"] == "SeparateNPU"
        assert {code: level["fault_level"]
                for code, level in entry["fault_time_and_level_map"].items()} == {
            "80E3A201": "SeparateNPU", "80E21007": "NotHandleFault"}
        assert all(level["fault_time"] > 0
                   for level in entry["fault_time_and_level_map"].values())

        # A pod takes chip 1 (its Instance's slot in use): Volcano must not count it free.
        control_plane.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-",
                              stdin=json.dumps(_instance(namespace, f"{CONFIGURATION}-davinci1",
                                                         name)))
        await eventually(lambda: shows(
            "Ascend910-0,Ascend910-3", "Ascend910-2",
            {"Ascend910-0": "NotHandleFault", "Ascend910-2": "SeparateNPU"}),
            what="chip 1 held by a pod, out of the free list")

        node.clear(2)
        node.clear(0)
        await eventually(lambda: shows("Ascend910-0,Ascend910-2,Ascend910-3", "", {}),
                         what="chips 0 and 2 recovered")


def _instance(namespace: str, instance: str, node: str) -> dict[str, Any]:
    """The chip's Instance as the agent keeps it, one slot held by a pod on ``node``."""
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Instance",
        "metadata": {"name": instance, "namespace": namespace,
                     "labels": {serves_label(node): LABEL_VALUE}},
        "spec": {"configurationName": CONFIGURATION, "cdiName": f"edgeplug.io/{instance}",
                 "capacity": 1, "shared": False, "nodes": [node], "brokerProperties": {},
                 "deviceUsage": {f"{instance}-0": node}},
    }

