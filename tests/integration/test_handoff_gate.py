"""The give-away gate on the real API server: the Node's count goes down before a slot is given
away, and comes back if a pod bound here may still be admitted with it.

Real parts: kube-apiserver and etcd; the Node's status written as a kubelet writes it (its
device resources in capacity and allocatable). What a user would check is what the scheduler
reads: the Node's ``status.allocatable``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from agent.deviceplugins.crossnode.handoff import HandoffGate, pods_awaiting_admission
from tests.harness.controlplane import ControlPlane
from tests.harness.service_accounts import mint

pytestmark = pytest.mark.timeout(60)

INSTANCE = "edgeplug.io/cam-1a2b3c"
CONFIGURATION = "edgeplug.io/cam"


@pytest.fixture
async def node(kube: AsyncClient) -> AsyncIterator[str]:
    """A Node whose kubelet reports two slots on both resources."""
    name = f"gate-{uuid.uuid4().hex[:6]}"
    await kube.create(cast(Node, Node.from_dict({"metadata": {"name": name}})))
    await _kubelet_reports(kube, name, {INSTANCE: 2, CONFIGURATION: 2})
    yield name
    await kube.delete(Node, name)


async def _kubelet_reports(kube: AsyncClient, node: str, counts: dict[str, int]) -> None:
    values = {r: str(n) for r, n in counts.items()}
    await kube.patch(Node.Status, node, {"status": {
        "capacity": {**values, "cpu": "4"}, "allocatable": {**values, "cpu": "4"}}},
        patch_type=PatchType.MERGE)


async def _allocatable(kube: AsyncClient, node: str) -> dict[str, str]:
    obj = await kube.get(Node, node)
    assert obj.status is not None
    assert obj.status.allocatable is not None
    return {r: str(v) for r, v in obj.status.allocatable.items()}


async def _bound_pod(kube: AsyncClient, namespace: str, node: str, resource: str) -> str:
    name = f"p-{uuid.uuid4().hex[:6]}"
    await kube.create(cast(Pod, Pod.from_dict({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "containers": [
            {"name": "m", "image": "m:1", "resources": {"limits": {resource: "1"}}}]}})))
    return f"{namespace}/{name}"


async def test_the_count_drops_before_the_give_away_when_no_pod_awaits(
    kube: AsyncClient, node: str, namespace: str
) -> None:
    gate = HandoffGate(client=kube, node=node)
    await _bound_pod(kube, namespace, node, "edgeplug.io/other")  # asks for something else
    assert await gate.clear("cam-1a2b3c", ["cam-1a2b3c-0"], before={INSTANCE: 2, CONFIGURATION: 2},
                            after={INSTANCE: 1, CONFIGURATION: 1})
    assert await _allocatable(kube, node) == {INSTANCE: "1", CONFIGURATION: "1", "cpu": "4"}


@pytest.mark.parametrize("resource", [INSTANCE, CONFIGURATION])
async def test_a_pod_bound_here_keeps_the_slot_and_the_count(
    kube: AsyncClient, node: str, namespace: str, resource: str
) -> None:
    """A pod the scheduler bound here on the old count, on either resource, not started: its
    kubelet may admit it with the slot, so the slot is not given away and the count is back."""
    pod = await _bound_pod(kube, namespace, node, resource)
    assert await pods_awaiting_admission(kube, node, [INSTANCE, CONFIGURATION]) == [pod]
    gate = HandoffGate(client=kube, node=node)
    assert not await gate.clear("cam-1a2b3c", ["cam-1a2b3c-0"],
                                before={INSTANCE: 2, CONFIGURATION: 2},
                                after={INSTANCE: 1, CONFIGURATION: 1})
    assert await _allocatable(kube, node) == {INSTANCE: "2", CONFIGURATION: "2", "cpu": "4"}
    # Once it has started (or ended) it awaits nothing: the slot may go.
    namespace_, name = pod.split("/")
    await kube.patch(Pod.Status, name, {"status": {"phase": "Running"}}, namespace=namespace_,
                     patch_type=PatchType.MERGE)
    assert await pods_awaiting_admission(kube, node, [INSTANCE, CONFIGURATION]) == []
    assert await gate.clear("cam-1a2b3c", ["cam-1a2b3c-0"], before={INSTANCE: 2, CONFIGURATION: 2},
                            after={INSTANCE: 1, CONFIGURATION: 1})


async def test_a_kubelet_status_that_put_the_old_count_back_is_lowered_again(
    kube: AsyncClient, node: str
) -> None:
    """The kubelet computed its status before it took in the withdrawal and wrote it after the
    lowering: the Node's watch shows more than is advertised, and the count goes down again;
    a count at or below what is advertised is the kubelet's and is left alone."""
    gate = HandoffGate(client=kube, node=node)
    assert await gate.clear("cam-1a2b3c", ["cam-1a2b3c-0"], before={INSTANCE: 2},
                            after={INSTANCE: 1})
    await _kubelet_reports(kube, node, {INSTANCE: 2, CONFIGURATION: 2})
    assert gate.allocatable.seen(await kube.get(Node, node))
    await gate.keep_down({INSTANCE: 1, CONFIGURATION: 2, "edgeplug.io/unknown": 0})
    assert await _allocatable(kube, node) == {INSTANCE: "1", CONFIGURATION: "2", "cpu": "4"}
    assert gate.allocatable.seen(await kube.get(Node, node))
    await gate.keep_down({INSTANCE: 2, CONFIGURATION: 2})  # a slot reserved since: not raised
    assert await _allocatable(kube, node) == {INSTANCE: "1", CONFIGURATION: "2", "cpu": "4"}


async def test_without_the_pods_list_grant_the_gate_stays_open_and_says_so(
    kube: AsyncClient, control_plane: ControlPlane, node: str, namespace: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A partial install: the agent may write its Node's count but not list pods. The gate
    cannot see a binding, so it gives the slot away as an install without the gate would, warns
    once naming the manifest, and does not retry for ever; a pod bound here is not seen."""
    account, role = "gate-partial", f"gate-partial-{namespace}"
    control_plane.kubectl("create", "serviceaccount", account, "-n", namespace)
    control_plane.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
        "items": [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": role}, "rules": [
                 {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
                 {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": role},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": role},
             "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
        ]}))
    identity = mint(control_plane, namespace=namespace, account=account,
                    path=tmp_path / "kubeconfig")
    partial = AsyncClient(KubeConfig.from_file(str(identity.kubeconfig)))
    try:
        await _bound_pod(kube, namespace, node, INSTANCE)
        gate = HandoffGate(client=partial, node=node)
        caplog.set_level(logging.WARNING, logger="agent.deviceplugins.crossnode.handoff")
        assert await gate.clear("cam-1a2b3c", ["cam-1a2b3c-0"], before={INSTANCE: 2},
                                after={INSTANCE: 1})
        assert not gate.retry
        assert await gate.settle({}, after={INSTANCE: 1})
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert "may not list the pods" in warnings[0]
        assert "KUBELET_CLIENT_CERT" in warnings[0]
        assert "deploy/token-reads" in warnings[0]
        # What the scheduler reads: the count without the slot given away.
        assert (await _allocatable(kube, node))[INSTANCE] == "1"
    finally:
        await partial.close()
        control_plane.kubectl("delete", "clusterrolebinding,clusterrole", role)
