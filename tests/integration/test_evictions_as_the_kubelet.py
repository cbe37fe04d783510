"""The agent evicts pods off separated devices as the kubelet, which reaches only its own node.

``agent.deviceplugins.separated_devices`` needs no right of its own: with the kubelet's client
certificate (``KUBELET_CLIENT_CERT``) it evicts as ``system:node:<node>``, which the Node authorizer
lets create ``pods/eviction`` and NodeRestriction lets evict only pods bound to that node. Here, on
the real API server (Node authorizer and NodeRestriction on), node A's kubelet identity evicts
a pod on A through the evictor's own code and is refused one on B; the agent's ServiceAccount
token (deploy/manifests applied) is refused both.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.kubelet.podresources import PodDevices
from agent.deviceplugins.separated_devices import SeparatedDeviceEvictor
from agent.discovery.node_devices import NodeDevice
from agent.kube.node_reads import NodeReads
from discovery_handlers.ascend.faults import chip_health, default_table
from discovery_handlers.contract import Device
from tests.harness.controlplane import ControlPlane
from tests.harness.service_accounts import kubelet_kubeconfig, pod_bound
from tests.integration.test_attacks_agent import SYSTEM_NAMESPACE, agent_manifests

SEPARATE_NPU_CODE = 0x80E3A201


def _pod(cp: ControlPlane, namespace: str, name: str, node: str) -> None:
    cp.kubectl("apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x:1"}]}}))


def _separated_chip() -> NodeDevice:
    health = chip_health((SEPARATE_NPU_CODE,), default_table())
    return NodeDevice(instance="npu-davinci0", namespace="ns", configuration="npu",
                      device=Device(id="davinci0", health=health), health=health)


async def _evicts(evictor: SeparatedDeviceEvictor, namespace: str, pod: str) -> bool:
    return await evictor._evict(PodDevices(namespace, pod, (("huawei.com/Ascend910", ("0",)),)),
                                [_separated_chip()])


async def test_the_kubelet_evicts_its_own_nodes_pods_only(control_plane: ControlPlane,
                                                          namespace: str,
                                                          tmp_path: Path) -> None:
    cp = control_plane
    for path in agent_manifests():
        cp.kubectl("apply", "-f", str(path))
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"evict-a-{suffix}", f"evict-b-{suffix}"
    for node in (node_a, node_b):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    _pod(cp, namespace, "on-a", node_a)
    _pod(cp, namespace, "on-b", node_b)
    _pod(cp, namespace, "on-a-too", node_a)
    kubelet = AsyncClient(KubeConfig.from_file(str(kubelet_kubeconfig(cp, node_a, tmp_path))))
    agent = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account="edgeplug-agent", node=node_a,
                      folder=tmp_path)
    token = AsyncClient(KubeConfig.from_file(str(agent.kubeconfig)))
    try:
        as_kubelet = SeparatedDeviceEvictor(reads=NodeReads(kubelet),
                                            resolve=lambda resource, ids: None)
        assert await _evicts(as_kubelet, namespace, "on-a")
        assert not await _evicts(as_kubelet, namespace, "on-b")
        as_token = SeparatedDeviceEvictor(reads=NodeReads(token),
                                          resolve=lambda resource, ids: None)
        assert not await _evicts(as_token, namespace, "on-a-too")
        gone = await _deleting(kubelet, namespace, "on-a")
        assert gone
        for pod in ("on-b", "on-a-too"):
            found = await AsyncClient(KubeConfig.from_file(str(cp.kubeconfig))).get(
                Pod, pod, namespace=namespace)
            assert found.metadata is not None
            assert found.metadata.deletionTimestamp is None, pod
    finally:
        await kubelet.close()
        await token.close()
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"edgeplug-agent-{node_a}", check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


async def _deleting(client: AsyncClient, namespace: str, name: str) -> bool:
    """The eviction took: the pod is being deleted (no kubelet runs to finish it) or gone."""
    try:
        pod = await client.get(Pod, name, namespace=namespace)
    except ApiError as error:
        return error.status.code == 404
    meta = pod.metadata or ObjectMeta()
    return meta.deletionTimestamp is not None
