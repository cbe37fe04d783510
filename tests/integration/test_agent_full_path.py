"""The whole path: debugEcho device → Instance → allocatable on the Node → a pod gets its env.

Real control plane and scheduler, the node emulator as the kubelet, and the whole agent
(``run_agent``: discovery and device plugins) in-process.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node

from agent.main import run_agent
from agent.settings import AgentSettings
from crds.naming import instance_name, instance_resource_name
from tests.harness.agent_process import (
    api_client,
    apply,
    debug_echo_configuration,
    eventually,
    instances,
)
from tests.harness.aio_process import task_running
from tests.harness.controlplane import ControlPlane
from tests.harness.node_emulator import ContainerAllocation, NodeEmulator, PythonNodeEmulator


@dataclass(frozen=True)
class _AgentNode:
    name: str
    emulator: NodeEmulator
    client: AsyncClient


@contextlib.asynccontextmanager
async def _agent_node(control_plane: ControlPlane, namespace: str, plugin_dir: Path, *,
                      python_kubelet: bool = False) -> AsyncIterator[_AgentNode]:
    """A new node: the emulated kubelet (``PythonNodeEmulator`` with ``python_kubelet``,
    whatever EDGEPLUG_KUBELET says) and the whole agent (``run_agent``) serving
    ``namespace``, and a client; the Node is deleted afterwards."""
    node = f"node-{uuid.uuid4().hex[:8]}"
    kubelet = PythonNodeEmulator if python_kubelet else NodeEmulator
    emulator = kubelet(node_name=node, kubeconfig=control_plane.kubeconfig,
                       plugin_dir=plugin_dir)
    client = api_client(control_plane)
    settings = AgentSettings(node_name=node, kubeconfig=control_plane.kubeconfig,
                             plugin_dir=plugin_dir, pod_resources_socket=None,
                             namespace=namespace)
    await emulator.start()
    try:
        async with task_running(run_agent(settings), name=f"agent-{node}"):
            yield _AgentNode(node, emulator, client)
    finally:
        await emulator.stop(delete_node=True)
        await client.close()


async def _pod_allocated(control_plane: ControlPlane, emulator: NodeEmulator, namespace: str,
                         name: str, resource: str) -> ContainerAllocation:
    """A pod asking for one ``resource`` is applied; what the emulated kubelet's Allocate gave
    it. (pod_admitted turns True when the emulator first sees the pod, before Allocate has
    answered, so the wait is for the recorded allocation itself.)"""
    apply(control_plane, namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{
            "name": "c", "image": "busybox:1.36",
            "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}},
        }]},
    })

    async def allocated() -> bool:
        return bool(emulator.allocations(namespace, name))

    await eventually(allocated, what=f"pod {name} allocated by the emulated kubelet")
    [allocation] = emulator.allocations(namespace, name)
    return allocation


async def test_pod_requesting_an_instance_gets_its_properties(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path
) -> None:
    async with _agent_node(control_plane, namespace, plugin_dir) as node:
        name = instance_name("echo", "foo0", shared=False, node=node.name)
        resource = instance_resource_name(name)
        apply(control_plane, namespace, debug_echo_configuration(
            "echo", descriptions=["foo0"], shared=False, capacity=2,
            broker_properties={"MODE": "test"},
        ))

        async def allocatable() -> str | None:
            got = await node.client.get(Node, node.name)
            alloc = (got.status.allocatable if got.status else None) or {}
            return alloc.get(resource) if alloc.get(resource) == "2" else None

        await eventually(allocatable, what=f"{resource}=2 allocatable on Node {node.name}")
        assert name in await instances(node.client, namespace)

        allocation = await _pod_allocated(control_plane, node.emulator, namespace, "broker",
                                          resource)
        assert allocation.envs["DEBUG_ECHO_DESCRIPTION"] == "foo0"
        assert allocation.envs["MODE"] == "test"

        async def running() -> bool:
            pod = json.loads(control_plane.kubectl(
                "get", "pod", "broker", "-n", namespace, "-o", "json").stdout)
            return bool(pod["status"].get("phase") == "Running")

        await eventually(running, what="pod broker Running")


async def test_a_configurations_own_resource_name_is_served_and_allocated(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path
) -> None:
    """``spec.resourceName`` renames the configuration-level resource (Huawei's
    ``huawei.com/Ascend910`` style): the Node offers the devices under that name, not
    ``edgeplug.io/<configuration>``, and a pod asking for it gets a device."""
    renamed = "example.com/echo-cams"
    async with _agent_node(control_plane, namespace, plugin_dir) as node:
        cfg = debug_echo_configuration("cams", descriptions=["c0", "c1"], shared=False)
        cfg["spec"]["resourceName"] = renamed
        apply(control_plane, namespace, cfg)

        async def offered() -> dict[str, str] | None:
            got = await node.client.get(Node, node.name)
            alloc = (got.status.allocatable if got.status else None) or {}
            return dict(alloc) if alloc.get(renamed) == "2" else None

        alloc = await eventually(offered, what=f"{renamed}=2 allocatable on Node {node.name}")
        assert "edgeplug.io/cams" not in alloc, alloc
        allocation = await _pod_allocated(control_plane, node.emulator, namespace, "renamed",
                                          renamed)
        assert allocation.envs["DEBUG_ECHO_DESCRIPTION"] in {"c0", "c1"}


async def test_a_new_devices_first_listandwatch_already_offers_its_slots(
    control_plane: ControlPlane, namespace: str, plugin_dir: Path
) -> None:
    """The slots reserved for this node are written before the device's plugin starts, so
    the kubelet's first ListAndWatch response offers them (otherwise the first
    would offer none and a second pass, after the reservation's watch event, offered them)."""
    async with _agent_node(control_plane, namespace, plugin_dir, python_kubelet=True) as node:
        assert isinstance(node.emulator, PythonNodeEmulator)
        name = instance_name("first", "f0", shared=False, node=node.name)
        resource = instance_resource_name(name)
        apply(control_plane, namespace, debug_echo_configuration(
            "first", descriptions=["f0"], shared=False, capacity=2))
        emulator = node.emulator

        async def first_offered() -> list[str] | None:
            return emulator.first_offered(resource)

        first = await eventually(first_offered, what=f"the first ListAndWatch of {resource}")
        assert len(first) == 2, f"first offered {first}, not both slots"
