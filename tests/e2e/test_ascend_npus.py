"""End to end: Ascend NPUs on an emulated node, through the agent, the kubelet's device-plugin API,
the real scheduler and (for brokers) the controller; the two-chip pod also on the kubelet's own
device manager (``DeviceNode``) in place of the Python emulator.

A pod written for Huawei's Ascend device plugin (``huawei.com/Ascend910: 2``) gets two healthy
chips of one card, their device nodes, the driver mount and ``ASCEND_VISIBLE_DEVICES``; a chip
faulted in DCMI turns Unhealthy on the node and stops counting; a pod asking for more than
remain stays Pending until the fault clears; a broker Configuration runs one broker per chip.
What Volcano and MindCluster read is there as Huawei's plugin leaves it: the pod's chip and
rank-table annotations, agreeing with its ``ASCEND_VISIBLE_DEVICES``, and Huawei's Node labels.

Stands in for real parts: the node's DCMI library is tests/harness/ascend_dcmi/fake_dcmi.c built
here and loaded by the agent through ctypes, its device nodes are files (tests/harness/
ascend_node.py), the kubelet is the node emulator. Everything else is the product.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name
from tests.harness.agent_process import api_client
from tests.harness.aio_process import task_running
from tests.harness.ascend_node import AscendNode, SimChip, chips_910b, dcmi_library
from tests.harness.controller_process import (
    ControllerProcess,
    apply,
    broker_pod_spec,
    broker_pods,
    install_peering_crds,
)
from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import (
    running,
    unschedulable,
    wait_allocatable,
    wait_pod,
    wait_service_account,
    wait_until,
)
from tests.harness.node_emulator import NodeEmulator

__all__ = ["dcmi_library"]  # the fixture, imported for pytest
RESOURCE = "huawei.com/Ascend910"
SHARED_SPECS = {("/dev/davinci_manager", "/dev/davinci_manager", "rwm"),  # as the host has them
                ("/dev/devmm_svm", "/dev/devmm_svm", "rwm"),
                ("/dev/hisi_hdc", "/dev/hisi_hdc", "rwm")}
DRIVER_MOUNT = ("/usr/local/Ascend/driver", "/usr/local/Ascend/driver", True)



@contextlib.asynccontextmanager
async def ascend_node(control_plane: ControlPlane, namespace: str, plugin_dir: Path,
                      host: AscendNode, kubelet: type[NodeEmulator | DeviceNode] = NodeEmulator,
                      pod_resources: Path | None = None,
                      ) -> AsyncIterator[tuple[str, NodeEmulator | DeviceNode, AsyncClient]]:
    """An emulated node and the agent (in this process: it loads the DCMI library here);
    ``kubelet`` is the Python emulator or the kubelet's own device manager (``DeviceNode``),
    serving pod-resources on ``pod_resources`` (for the agent) when given."""
    node = f"npu-{uuid.uuid4().hex[:8]}"
    emulator = kubelet(node_name=node, kubeconfig=control_plane.kubeconfig,
                       plugin_dir=plugin_dir, pod_resources_socket=pod_resources)
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=pod_resources,
                             namespace=namespace)
    kube = api_client(control_plane)
    await emulator.start()
    try:
        async with task_running(run_agent(settings), name=f"agent-{node}"):
            await wait_service_account(kube, namespace)
            yield node, emulator, kube
    finally:
        await emulator.stop(delete_node=True)
        await kube.close()


def configuration(namespace: str, name: str, host: AscendNode, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "edgeplug.io/v1alpha1", "kind": "Configuration",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"discoveryHandler": {"name": "ascend", "discoveryDetails": host.details()},
                 "capacity": 1, **spec},
    }


def npu_pod(namespace: str, name: str, chips: int) -> dict[str, Any]:
    """A pod as written for Huawei's device plugin."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"containers": [{
            "name": "train", "image": "ascendhub.huawei.com/public-ascendhub/train:1",
            "resources": {"limits": {RESOURCE: str(chips)}}}]},
    }


def card_of(phy: str) -> int:
    return int(phy) // 2  # the emulated node's cards hold two chips each


@pytest.mark.parametrize("kubelet", [NodeEmulator, DeviceNode],
                         ids=["node-emulator", "devicenode"])
async def test_pod_for_huaweis_plugin_gets_two_healthy_chips_of_one_card(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    dcmi_library: Path, monkeypatch: pytest.MonkeyPatch,
    kubelet: type[NodeEmulator | DeviceNode],
) -> None:
    # Eight 910B3 chips, two per card, so that keeping a request on one card is a choice.
    host = AscendNode(tmp_path / "host", chips_910b(8, per_card=2), library=dcmi_library)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    async with ascend_node(control_plane, namespace, plugin_dir, host, kubelet) as (
            node, emulator, kube):
        apply(control_plane, configuration(namespace, "ascend-910", host, resourceName=RESOURCE))
        await wait_allocatable(kube, node, RESOURCE, "8")

        async def labelled() -> bool:
            meta = (await kube.get(Node, node)).metadata
            labels = (meta.labels if meta else None) or {}
            return (labels.get("edgeplug.io/npu.chip.name"),
                    labels.get("edgeplug.io/npu.chip.count"),
                    labels.get("edgeplug.io/accelerator")) == (
                        "910B3", "8", "huawei-Ascend910")

        await wait_until(labelled, what="the Node labelled with chip model, count and family")

        started = time.monotonic()
        host.fault(0)  # chip 0 of card 0 faults: card 0 has one usable chip left
        await wait_allocatable(kube, node, RESOURCE, "7")
        print(f"fault → Unhealthy on the node's allocatable: {time.monotonic() - started:.2f} s "
              f"(poll 1 s)")
        assert "davinci0" not in " ".join(emulator.healthy_device_ids(RESOURCE))

        apply(control_plane, npu_pod(namespace, "train", 2))
        await wait_pod(kube, namespace, "train", running, "Running")
        [allocation] = emulator.allocations(namespace, "train")
        assert allocation.resource_name == RESOURCE
        ids = allocation.envs["ASCEND_VISIBLE_DEVICES"].split(",")
        assert len(ids) == 2
        assert "0" not in ids, "the faulted chip is never handed out"
        assert card_of(ids[0]) == card_of(ids[1]), f"chips {ids} are on two cards"
        # The env CANN and Ascend's container runtime read, as Huawei's plugin sets it: no
        # ASCEND_DEVICE_ID (CANN's in-container logical index), ASCEND_RUNTIME_OPTIONS empty.
        assert "ASCEND_DEVICE_ID" not in allocation.envs
        assert allocation.envs["ASCEND_RUNTIME_OPTIONS"] == ""
        assert set(allocation.devices) == SHARED_SPECS | {
            (f"/dev/davinci{i}", f"/dev/davinci{i}", "rwm") for i in ids}
        assert DRIVER_MOUNT in allocation.mounts

        apply(control_plane, npu_pod(namespace, "greedy", 6))  # 5 healthy chips remain
        await wait_pod(kube, namespace, "greedy", unschedulable, "Unschedulable (Pending)")

        host.clear(0)  # the fault clears: chip 0 is back, six are free, the pod runs
        await wait_allocatable(kube, node, RESOURCE, "8")
        await wait_pod(kube, namespace, "greedy", running, "Running once chip 0 is back")
        [greedy] = emulator.allocations(namespace, "greedy")
        got = set(greedy.envs["ASCEND_VISIBLE_DEVICES"].split(","))
        assert got == {str(i) for i in range(8)} - set(ids)


async def test_a_broker_per_chip(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    dcmi_library: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    install_peering_crds(control_plane)
    chips = [SimChip(card=0, dev=i, logic=i, phy=i) for i in range(2)]
    host = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    ctl = ControllerProcess(control_plane, namespaces=[namespace], log_path=tmp_path / "ctl.log")
    async with ascend_node(control_plane, namespace, plugin_dir, host) as (node, emulator, _):
        ctl.start()
        try:
            apply(control_plane, configuration(
                namespace, "npu", host, resourceName=RESOURCE,
                brokerSpec={"brokerPodSpec": broker_pod_spec()}))
            names = {instance_name("npu", f"davinci{i}", shared=False, node=node): str(i)
                     for i in range(2)}

            async def brokers_running() -> bool:
                pods = broker_pods(control_plane, namespace)
                phases = [str(p.get("status", {}).get("phase")) for p in pods]
                return phases.count("Running") == 2

            await wait_until(brokers_running, what="two broker pods Running")
            for inst, phy in names.items():
                [allocation] = emulator.allocations(namespace, f"{inst}-{node}-pod")
                assert allocation.resource_name == f"edgeplug.io/{inst}"
                assert allocation.envs["ASCEND_VISIBLE_DEVICES"] == phy
                assert allocation.envs["ASCEND_CHIP_MODEL"] == "Ascend910B3"
                assert (f"/dev/davinci{phy}", f"/dev/davinci{phy}", "rwm") in allocation.devices
        finally:
            ctl.stop()


async def test_volcano_and_mindcluster_read_huaweis_annotations_and_labels(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path, tmp_path: Path,
    dcmi_library: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the kubelet's own device manager and pod-resources: the agent learns which chips the
    pod got from pod-resources and annotates it as Huawei's plugin does."""
    chips = [replace(c, roce_ip=f"192.168.100.{10 + c.phy}") for c in chips_910b(8, per_card=2)]
    host = AscendNode(tmp_path / "host", chips, library=dcmi_library)
    for key, value in host.env.items():
        monkeypatch.setenv(key, value)
    # A Unix socket path must fit in 108 bytes.
    resources_dir = Path(tempfile.mkdtemp(prefix="ep-npu-pr-", dir="/tmp"))
    try:
        async with ascend_node(control_plane, namespace, plugin_dir, host, DeviceNode,
                               pod_resources=resources_dir / "kubelet.sock") as (
                node, emulator, kube):
            apply(control_plane, configuration(namespace, "ascend-910", host,
                                               resourceName=RESOURCE))
            await wait_allocatable(kube, node, RESOURCE, "8")
            huawei_labels = {"accelerator": "huawei-Ascend910",
                             "node.kubernetes.io/npu.chip.name": "910B3",
                             "servertype": "Ascend910B-20",
                             "mind-cluster/npu-chip-memory": "64G"}

            async def node_labels() -> dict[str, str]:
                meta = (await kube.get(Node, node)).metadata
                return dict((meta.labels if meta else None) or {})

            async def labelled() -> bool:
                labels = await node_labels()
                return all(labels.get(k) == v for k, v in huawei_labels.items())

            await wait_until(labelled, what=f"the Node labelled {huawei_labels}")

            apply(control_plane, npu_pod(namespace, "train", 2))
            started = time.monotonic()
            pod = await wait_pod(kube, namespace, "train", running, "Running")
            [allocation] = emulator.allocations(namespace, "train")
            phys = allocation.envs["ASCEND_VISIBLE_DEVICES"].split(",")
            assert len(phys) == 2
            config_key = "ascend.kubectl.kubernetes.io/ascend-910-configuration"

            async def annotations() -> dict[str, str]:
                meta = (await kube.get(Pod, "train", namespace=namespace)).metadata
                return dict((meta.annotations if meta else None) or {})

            async def annotated() -> bool:
                return config_key in await annotations()

            await wait_until(annotated, what="the pod annotated as Huawei's plugin does")
            print(f"Running → annotated: {time.monotonic() - started:.2f} s")
            found = await annotations()
            names = ",".join(sorted(f"Ascend910-{p}" for p in phys))
            assert found["huawei.com/Ascend910"] == names
            assert found["huawei.com/AscendReal"] == names
            rank = json.loads(found[config_key])
            assert rank["devices"] == [
                {"device_id": p, "device_ip": f"192.168.100.{10 + int(p)}"}
                for p in sorted(phys, key=int)]
            assert pod.metadata is not None
            assert pod.status is not None
            assert (rank["pod_name"], rank["server_id"], rank["host_ip"]) == (
                "train", pod.metadata.uid, pod.status.hostIP)

            # The Configuration goes: our labels go with its last chip, Huawei's stay (as
            # Huawei's plugin leaves them; an NPU node's accelerator label is often the user's).
            control_plane.kubectl("delete", "configuration", "ascend-910", "-n", namespace)

            async def unlabelled() -> bool:
                return "edgeplug.io/accelerator" not in await node_labels()

            await wait_until(unlabelled, what="edgeplug.io/ labels removed")
            labels = await node_labels()
            assert {k: labels.get(k) for k in huawei_labels} == huawei_labels
    finally:
        shutil.rmtree(resources_dir, ignore_errors=True)
