"""A stolen NPU agent token against Volcano's device-info ConfigMaps: node A writes its own
``kube-system/mindx-dl-deviceinfo-<A>`` and nothing else.

With deploy/manifests' agent files and deploy/ascend/agent-device-info.yaml applied as a user
applies them, and the agent's ServiceAccount token bound to a pod on node A (as its DaemonSet
pod's token is), each attempt is a real request to the real API server: node B's device-info
ConfigMap, any other ConfigMap in ``kube-system`` or elsewhere, extra keys, labels or owners on
its own, a read or a delete. Beside them, the write the agent's writer makes passes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from agent.node_devices import NodeDeviceTable
from agent.volcano_device_info import DeviceInfoWriter
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
