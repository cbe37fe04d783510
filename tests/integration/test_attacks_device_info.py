"""A stolen NPU agent token against Volcano's device-info ConfigMaps: node A writes its own
``kube-system/mindx-dl-deviceinfo-<A>`` and nothing else.

With deploy/manifests' agent files and deploy/ascend/agent-device-info.yaml applied as a user
applies them, and the agent's ServiceAccount token bound to a pod on node A (as its DaemonSet
pod's token is), each attempt is a real request to the real API server: node B's device-info
ConfigMap, any other ConfigMap in ``kube-system`` or elsewhere, extra keys, labels or owners on
its own, a read or a delete; and on Nodes, the ``baseDeviceInfos`` annotation (Volcano's count
of the node's chips) set on another node's Node, or removed, or another annotation set. Beside
them, the writes the agent's writer makes pass.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node
from lightkube.types import PatchType

from agent.discovery.node_devices import NodeDeviceTable
from agent.discovery.volcano_device_info import DeviceInfoWriter
from tests.harness.controlplane import REPO_ROOT, ControlPlane
from tests.harness.service_accounts import Identity, mint, pod_bound
from tests.integration.test_attacks_agent import (
    SYSTEM_NAMESPACE,
    _allowed,
    _outcome,
    _refused,
    _until_refused,
    agent_manifests,
)

pytestmark = pytest.mark.timeout(180)
DEVICE_INFO = REPO_ROOT / "deploy" / "ascend" / "agent-device-info.yaml"
OWN_NODE_ONLY = "may write only the device-info ConfigMap of the Node its pod runs on"
HUAWEIS_KEYS_ONLY = "holds only Huawei's keys"
FORBIDDEN = "403"


@dataclass(frozen=True)
class World:
    node_a: str
    node_b: str
    agent_a: Identity
    unbound: Identity


@pytest.fixture(scope="module")
def world(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[World]:
    cp = control_plane
    for path in [*agent_manifests(), DEVICE_INFO]:
        cp.kubectl("apply", "-f", str(path))
    suffix = uuid.uuid4().hex[:6]
    node_a, node_b = f"npu-a-{suffix}", f"npu-b-{suffix}"
    for node in (node_a, node_b):
        cp.kubectl("apply", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}))
    folder: Path = tmp_path_factory.mktemp("device-info-attacks")
    agent_a = pod_bound(cp, namespace=SYSTEM_NAMESPACE, account="edgeplug-agent", node=node_a,
                        folder=folder)
    unbound = mint(cp, namespace=SYSTEM_NAMESPACE, account="edgeplug-agent",
                   path=folder / "unbound")
    try:
        yield World(node_a, node_b, agent_a, unbound)
    finally:
        cp.kubectl("delete", "pod", "-n", SYSTEM_NAMESPACE, "--wait=false",
                   f"edgeplug-agent-{node_a}", check=False)
        cp.kubectl("delete", "node", node_a, node_b, "--wait=false", check=False)


def _client(who: Identity) -> Client:
    return Client(KubeConfig.from_file(str(who.kubeconfig)), field_manager="attack")


def _apply(who: Identity, name: str, *, namespace: str = "kube-system",
           data: dict[str, str] | None = None, labels: dict[str, str] | None = None,
           extra: dict[str, Any] | None = None) -> tuple[bool, str]:
    body = ConfigMap(
        metadata=ObjectMeta(name=name, namespace=namespace,
                            labels={"mx-consumer-cim": "true"} if labels is None else labels,
                            **(extra or {})),
        data={"DeviceInfoCfg": "{}"} if data is None else data)
    return _outcome(lambda: _client(who).apply(body, force=True))


def test_a_node_writes_its_own_device_info_and_no_other_configmap(
        control_plane: ControlPlane, world: World) -> None:
    w = world
    theirs = f"mindx-dl-deviceinfo-{w.node_b}"
    _refused(_until_refused(lambda: _apply(w.agent_a, theirs), "the device-info policy"),
             OWN_NODE_ONLY)
    _refused(_apply(w.agent_a, "coredns"), OWN_NODE_ONLY)
    _refused(_apply(w.agent_a, "mindx-dl-fault-config"), OWN_NODE_ONLY)
    _refused(_apply(w.unbound, f"mindx-dl-deviceinfo-{w.node_a}"), OWN_NODE_ONLY)
    # Outside kube-system RBAC grants nothing at all.
    elsewhere = _apply(w.agent_a, f"mindx-dl-deviceinfo-{w.node_a}", namespace="default")
    assert not elsewhere[0]
    assert elsewhere[1].startswith(FORBIDDEN), elsewhere
    # Its own name, dressed up: extra keys, binary data, other labels, an owner.
    mine = f"mindx-dl-deviceinfo-{w.node_a}"
    _refused(_apply(w.agent_a, mine, data={"DeviceInfoCfg": "{}", "Corefile": "."}),
             HUAWEIS_KEYS_ONLY)
    _refused(_apply(w.agent_a, mine, labels={"mx-consumer-cim": "true", "app": "x"}),
             HUAWEIS_KEYS_ONLY)
    _refused(_apply(w.agent_a, mine, extra={"finalizers": ["example.com/keep"]}),
             HUAWEIS_KEYS_ONLY)


async def test_the_writers_own_write_passes_and_reads_and_deletes_stay_refused(
        control_plane: ControlPlane, world: World) -> None:
    w = world
    _until_refused(lambda: _apply(w.agent_a, f"mindx-dl-deviceinfo-{w.node_b}"),
                   "the device-info policy")
    client = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
    try:
        writer = DeviceInfoWriter(client=client, node=w.node_a, devices=NodeDeviceTable())
        assert await writer.write({"huawei.com/Ascend910": "Ascend910-0"})
    finally:
        await client.close()
    written = control_plane.kubectl("get", "configmap", "-n", "kube-system", writer.name,
                                    "-o", "jsonpath={.data.DeviceInfoCfg}").stdout
    assert '"huawei.com/Ascend910":"Ascend910-0"' in written
    _allowed(_apply(w.agent_a, writer.name, data={"DeviceInfoCfg": written}))
    for call in (lambda: _client(w.agent_a).get(ConfigMap, writer.name, namespace="kube-system"),
                 lambda: _client(w.agent_a).delete(ConfigMap, writer.name,
                                                   namespace="kube-system")):
        allowed, message = _outcome(call)
        assert not allowed
        assert message.startswith(FORBIDDEN), message


def _annotate(who: Identity, node: str, annotations: dict[str, str | None]) -> tuple[bool, str]:
    return _outcome(lambda: _client(who).patch(
        Node, node, {"metadata": {"annotations": annotations}}, patch_type=PatchType.MERGE))


async def test_a_node_sets_volcanos_chip_annotation_on_its_own_node_only(
        control_plane: ControlPlane, world: World) -> None:
    w = world
    value = '{"Ascend910-0":{"IP":"","SuperDeviceID":0}}'
    _refused(_until_refused(lambda: _annotate(w.agent_a, w.node_b, {"baseDeviceInfos": value}),
                            "the node policy"), "may change only the Node its pod runs on")
    client = AsyncClient(KubeConfig.from_file(str(w.agent_a.kubeconfig)))
    try:
        writer = DeviceInfoWriter(client=client, node=w.node_a, devices=NodeDeviceTable())
        await writer._annotate_node()  # no chips: "{}"
    finally:
        await client.close()
    written = control_plane.kubectl("get", "node", w.node_a, "-o",
                                    "jsonpath={.metadata.annotations.baseDeviceInfos}").stdout
    assert written == "{}"
    _allowed(_annotate(w.agent_a, w.node_a, {"baseDeviceInfos": value}))
    _refused(_annotate(w.agent_a, w.node_a, {"baseDeviceInfos": None}),
             "set (not remove) Huawei's baseDeviceInfos")
    _refused(_annotate(w.agent_a, w.node_a, {"example.com/owner": "attacker"}),
             "may change only its edgeplug.io/labels annotation")
