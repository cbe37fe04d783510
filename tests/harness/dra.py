"""DRA on the harness: Ready nodes, agents that publish ResourceSlices, DeviceClasses, claims.

The DRA tests drive the real kube-scheduler (its DynamicResources plugin, on by default in
v1.36) and the real kube-controller-manager (its resourceclaim controller makes a pod's claim
from a ResourceClaimTemplate). The scheduler places a pod only on a Ready Node, so the nodes
here are ``NodeReporter`` Nodes with a heartbeat and no kubelet: a pod is bound
(``spec.nodeName``) once its claim is allocated, and nothing runs it. The agents run in-process:
discovery (``ConfigurationWatch``) plus ``DraPublisher``; the controller's ``DeviceClasses``
(with the shared devices' pools, ``controller.dra.shared_pools``) runs in-process too, unless a
test runs the controller process with ``--dra``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Pod

from agent.dra.publisher import DraPublisher, ResourceSliceResource
from agent.kube.client import as_dict
from agent.kubeletapi import dra_v1_pb2 as pb
from controller.dra.device_classes import DeviceClasses
from controller.dra.instance_classes import DeviceClassResource
from crds import dra, dra_slices
from tests.harness import agent_process, echo_handlers
from tests.harness.controlplane import ControlPlane
from tests.harness.kubelet_node import NodeReporter

ResourceClaimResource = create_namespaced_resource(
    "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims"
)
#: How long the scheduler gets to allocate a pod's claim and bind the pod.
SCHEDULE_DEADLINE = 60.0


async def _cancel(tasks: Iterable[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def ready_nodes(client: AsyncClient, names: Sequence[str]) -> AsyncIterator[None]:
    """Ready, untainted Nodes (heartbeat, no kubelet), deleted afterwards with their slices."""
    reporters = [NodeReporter(client=client, node_name=n, labels={}, device_counts=dict)
                 for n in names]
    try:
        for reporter in reporters:
            await reporter.start()
        yield
    finally:
        for reporter in reporters:
            await reporter.stop(delete_node=True)
        for name in names:
            await delete_slices(client, name)


async def delete_slices(client: AsyncClient, node: str) -> None:
    async for obj in client.list(ResourceSliceResource,
                                 labels={"edgeplug.io/node": node}):
        with contextlib.suppress(ApiError):
            await client.delete(ResourceSliceResource, as_dict(obj)["metadata"]["name"])


async def delete_controller_slices(client: AsyncClient, namespace: str) -> None:
    """The controller's slices of ``namespace``'s shared devices (a stopped controller leaves
    them; its DeviceClasses too, which would still select them for a later test's claim)."""
    async for obj in client.list(ResourceSliceResource,
                                 labels={dra.LABEL_MANAGED_BY: "edgeplug-controller"}):
        body = as_dict(obj)
        if str(body["spec"]["pool"]["name"]).startswith(f"{namespace}/"):
            with contextlib.suppress(ApiError):
                await client.delete(ResourceSliceResource, body["metadata"]["name"])


@dataclass
class DraAgent:
    agent: agent_process.InProcessAgent
    publisher: DraPublisher
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def dra_agents(cp: ControlPlane, nodes: Sequence[str], namespace: str
                     ) -> AsyncIterator[dict[str, DraAgent]]:
    """One in-process agent per node: discovery and the DRA publisher (no device plugins)."""
    async with contextlib.AsyncExitStack() as stack:
        agents: dict[str, DraAgent] = {}
        for node in nodes:
            agent = await stack.enter_async_context(
                agent_process.agent_in_process(cp, node_name=node, namespace=namespace))
            publisher = DraPublisher(client=agent.client, node_name=node, namespace=namespace,
                                     devices=agent.devices)
            task = asyncio.create_task(publisher.run(), name=f"dra-{node}")
            agents[node] = DraAgent(agent, publisher, task)
        try:
            yield agents
        finally:
            await _cancel(a.task for a in agents.values())


@contextlib.asynccontextmanager
async def device_classes(client: AsyncClient, namespace: str, *,
                         extended_resources: bool = False) -> AsyncIterator[None]:
    """The controller's DeviceClass keeper for ``namespace``, in-process, with the shared
    devices' pools it publishes (deleted afterwards)."""
    task = asyncio.create_task(DeviceClasses(client, namespaces=[namespace],
                                             extended_resources=extended_resources).run())
    try:
        yield
    finally:
        await _cancel([task])
        await delete_controller_slices(client, namespace)


async def device_class(client: AsyncClient, namespace: str, configuration: str
                       ) -> dict[str, Any] | None:
    """The Configuration's DeviceClass; None while there is none."""
    return await device_class_named(client, dra.device_class_name(namespace, configuration))


async def device_class_named(client: AsyncClient, name: str) -> dict[str, Any] | None:
    """The DeviceClass ``name``; None while there is none."""
    try:
        obj = await client.get(DeviceClassResource, name)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise
    return as_dict(obj)


async def pool_slices(client: AsyncClient, pool: str) -> list[dict[str, Any]]:
    """The ResourceSlices of one pool, every generation."""
    found = []
    async for obj in client.list(ResourceSliceResource):
        body = as_dict(obj)
        if body["spec"]["pool"]["name"] == pool:
            found.append(body)
    return found


def pool_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Device name → device, over a pool's newest generation."""
    return {d["name"]: d for s in _newest(slices) for d in s["spec"].get("devices", [])}


def device_nodes(slices: Iterable[Mapping[str, Any]], device: str) -> list[str] | None:
    """The nodes a shared device can be allocated on, over its pool's newest generation: its
    own selector's (``perDeviceNodeSelection``) or its slice's, sorted; None: not in the pool."""
    slices = list(slices)
    newest = _newest(slices)
    for body in slices:
        spec = body["spec"]
        listed = next((d for d in spec.get("devices") or () if d["name"] == device), None)
        if listed is None or body not in newest:
            continue
        selector = listed["nodeSelector"] if spec.get("perDeviceNodeSelection") \
            else spec["nodeSelector"]
        return sorted(dra_slices.selector_nodes(selector))
    return None


def _newest(slices: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    slices = list(slices)
    newest = max((s["spec"]["pool"]["generation"] for s in slices), default=0)
    return [s for s in slices if s["spec"]["pool"]["generation"] == newest]


def claim_template(name: str, device_class_name: str, cel: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class_name}
    if cel is not None:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {
        "apiVersion": dra.API_VERSION, "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}},
    }


def claim_pod(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}],
            "containers": [{"name": "c", "image": "busybox:1.36",
                            "command": ["sleep", "infinity"],
                            "resources": {"claims": [{"name": "dev"}]}}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def extended_echo_configuration(name: str, descriptions: list[str], state: Path
                                ) -> dict[str, Any]:
    """A local-device Configuration of ``debugEchoExtended`` (``tests.harness.echo_handlers``,
    installed by the test), whose devices' health the test sets in ``state``; the scheduler
    allocates its devices (``spec.allocator: dra``)."""
    cfg = agent_process.debug_echo_configuration(name, descriptions=descriptions, shared=False,
                                                 allocator="dra")
    cfg["spec"]["discoveryHandler"] = {"name": echo_handlers.NAME, "discoveryDetails": json.dumps(
        {"descriptions": descriptions, "stateFile": str(state)})}
    return cfg


def extended_resource_pod(name: str, resource: str) -> dict[str, Any]:
    """A pod asking for an extended resource (no claim of its own)."""
    pod = claim_pod(name, "")
    del pod["spec"]["resourceClaims"]
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return pod


def apply(cp: ControlPlane, namespace: str, *objects: Mapping[str, Any]) -> None:
    cp.kubectl("apply", "-n", namespace, "-f", "-",
               stdin="\n---\n".join(json.dumps(o) for o in objects))


@dataclass(frozen=True)
class PodClaim:
    """Where the scheduler put a pod and what its claim was allocated (None: not yet)."""

    node: str
    results: tuple[Mapping[str, Any], ...]


async def pod_claim(client: AsyncClient, namespace: str, pod: str) -> PodClaim | None:
    """The pod's node and its claim's allocation, once the pod is bound; None before."""
    body = as_dict(await client.get(Pod, pod, namespace=namespace))
    node = body["spec"].get("nodeName")
    status = body.get("status") or {}
    statuses = status.get("resourceClaimStatuses") or []
    # A pod asking for an extended resource that a DeviceClass maps gets a claim the scheduler
    # makes, named in extendedResourceClaimStatus.
    name = (statuses[0].get("resourceClaimName") if statuses else
            (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))
    if not node or not name:
        return None
    claim = as_dict(await client.get(ResourceClaimResource, name, namespace=namespace))
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is None:
        return None
    return PodClaim(node=node, results=tuple(allocation["devices"]["results"]))


async def allocated_claim(client: AsyncClient, namespace: str, pod: str) -> pb.Claim:
    """The pod's claim once allocated and the pod bound, as the kubelet names it to the
    plugin's ``NodePrepareResources``."""
    await agent_process.eventually(lambda: pod_claim(client, namespace, pod),
                                   what=f"pod {pod} bound", deadline=SCHEDULE_DEADLINE)
    body = as_dict(await client.get(Pod, pod, namespace=namespace))
    name = body["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = as_dict(await client.get(ResourceClaimResource, name, namespace=namespace))
    return pb.Claim(namespace=namespace, name=name, uid=claim["metadata"]["uid"])


async def unschedulable(client: AsyncClient, namespace: str, pod: str) -> str | None:
    """The scheduler's message when it tried and found no place for the pod; None otherwise."""
    body = as_dict(await client.get(Pod, pod, namespace=namespace))
    for cond in (body.get("status") or {}).get("conditions") or []:
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            return str(cond.get("message") or "unschedulable")
    return None


async def describe(client: AsyncClient, namespace: str) -> str:
    """Pods (node, scheduling condition) and claims (allocation) of ``namespace``, for a
    failure message."""
    lines = []
    async for obj in client.list(Pod, namespace=namespace):
        body = as_dict(obj)
        conds = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                 for c in (body.get("status") or {}).get("conditions") or []]
        lines.append(f"pod {body['metadata']['name']} node={body['spec'].get('nodeName')} "
                     f"conditions={conds}")
    async for claim in client.list(ResourceClaimResource, namespace=namespace):
        data = as_dict(claim)
        lines.append(f"claim {data['metadata']['name']} "
                     f"allocation={(data.get('status') or {}).get('allocation')}")
    return "\n".join(lines)
