"""Emulated nodes running the agent's device-plugin side, and the Instances they serve.

The device-plugin service tests and the slot-demand tests both start nodes
(the kubelet's own device manager as ``DeviceNode``, or the Python ``NodeEmulator`` when
``EDGEPLUG_KUBELET=emulator``, plus ``serve_device_plugins`` as ``agent.main`` runs it), create
Instances in the API server and feed the nodes' device tables. The parts live here once; the
``start_node`` fixture in tests/integration/conftest.py hands out ``AgentNodes.start``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.slots.service import serve_device_plugins
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube.client import InstanceResource, as_dict
from agent.kube.node_instances import LABEL_VALUE, serves_label
from agent.metrics import AgentMetrics
from agent.settings import current, in_use
from crds.instance import Instance
from crds.naming import LABEL_TARGET_NODE, target_node_label
from discovery_handlers.contract import Device, DeviceSpec, Mount
from tests.harness.devicenode import DeviceNode
from tests.harness.kube_waits import wait_allocatable
from tests.harness.node_emulator import NodeEmulator

#: Short orphan grace so the freeing tests do not wait 5 s.
TEST_ORPHAN_GRACE_S = 1.0
#: How long a cancelled service may take to stop (it removes its sockets).
STOP_WAIT_S = 30.0

MOUNT = Mount(container_path="/var/run/cam", host_path="/run/cam", read_only=True)
DEVICE = DeviceSpec(container_path="/dev/cam0", host_path="/dev/video0", permissions="rw")


async def serving_with(orphan_grace: float, serving: Coroutine[Any, Any, None]) -> None:
    """Run ``serving`` (a node's device plugins) with the settings in use but its orphan grace."""
    tree = current()
    with in_use(replace(tree, slots=replace(tree.slots, orphan_grace_s=orphan_grace))):
        await serving


#: Which kubelet stand-in runs the agent nodes: "devicenode" (the kubelet's own device
#: manager, tests/harness/devicenode.py; the default) or "emulator" (the Python emulator).
KUBELET_ENV = "EDGEPLUG_KUBELET"
KubeletNode = DeviceNode | NodeEmulator


def kubelet_class() -> type[DeviceNode] | type[NodeEmulator]:
    """The kubelet stand-in ``$EDGEPLUG_KUBELET`` names; a clear error for anything else."""
    choice = os.environ.get(KUBELET_ENV, "devicenode")
    if choice == "devicenode":
        return DeviceNode
    if choice == "emulator":
        return NodeEmulator
    raise ValueError(f"{KUBELET_ENV}={choice!r}: expected 'devicenode' or 'emulator'")


@dataclass
class AgentNode:
    """One node (a kubelet stand-in) with the device-plugin side of its agent running."""

    emulator: KubeletNode
    table: NodeDeviceTable
    metrics: AgentMetrics
    task: asyncio.Task[None]
    #: Makes the coroutine that serves this node's device plugins (``serve_device_plugins``).
    serve: Callable[[], Coroutine[Any, Any, None]]

    @property
    def name(self) -> str:
        return self.emulator.node_name

    async def restart_service(self) -> None:
        """Stop the device-plugin side (its plugins' sockets go) and start a new one on the
        same kubelet, device table and pod-resources: an agent restart as the kubelet sees
        it, with the new agent remembering nothing of the old one's ledgers."""
        await self.stop_service()
        self.task = asyncio.create_task(self.serve())

    async def stop_service(self) -> None:
        self.task.cancel()
        done, _ = await asyncio.wait([self.task], timeout=STOP_WAIT_S)
        assert done, f"the device-plugin service of {self.name} did not stop when cancelled"

    def counter(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def allocations(self, namespace: str, configuration: str, *, kind: str = "instance",
                    outcome: str = "ok") -> float:
        """Allocate calls this node answered for the Configuration's resources of ``kind``
        (``instance`` or ``configuration``), with ``outcome`` (ok or refused)."""
        return self.counter("edgeplug_allocations_total", namespace=namespace,
                            configuration=configuration, node=self.name, kind=kind,
                            outcome=outcome)

    def slot_conflicts(self, namespace: str, configuration: str, *,
                       kind: str = "instance") -> float:
        """Slot claims this node lost for the Configuration's resources of ``kind``."""
        return self.counter("edgeplug_slot_conflicts_total", namespace=namespace,
                            configuration=configuration, node=self.name, kind=kind)


class StartNode(Protocol):
    """What the ``start_node`` fixture hands a test: start one more agent node (with this
    orphan grace)."""

    def __call__(self, *, orphan_grace: float = ...) -> Awaitable[AgentNode]: ...


@dataclass
class AgentNodes:
    """Starts agent nodes against one API server and stops every one it started."""

    kube: AsyncClient
    kubeconfig: Path
    #: The kubelet stand-in; None: the one ``$EDGEPLUG_KUBELET`` names.
    kubelet: type[DeviceNode] | type[NodeEmulator] | None = None
    started: list[AgentNode] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    async def start(self, *, orphan_grace: float = TEST_ORPHAN_GRACE_S) -> AgentNode:
        # Short paths: a Unix socket path must fit in 108 bytes.
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-dp-", dir="/tmp"))
        pod_resources_dir = Path(tempfile.mkdtemp(prefix="ep-pr-", dir="/tmp"))
        self.dirs.extend([str(plugin_dir), str(pod_resources_dir)])
        emulator = (self.kubelet or kubelet_class())(
            node_name=f"emu-{uuid.uuid4().hex[:8]}",
            kubeconfig=self.kubeconfig,
            plugin_dir=plugin_dir,
            pod_resources_socket=pod_resources_dir / "kubelet.sock",
        )
        await emulator.start()
        table, metrics = NodeDeviceTable(), AgentMetrics()

        def serve() -> Coroutine[Any, Any, None]:
            return serving_with(orphan_grace, serve_device_plugins(
                client=self.kube,
                node_name=emulator.node_name,
                plugin_dir=plugin_dir,
                pod_resources_socket=pod_resources_dir / "kubelet.sock",
                devices=table,
                metrics=metrics,
            ))

        node = AgentNode(emulator=emulator, table=table, metrics=metrics,
                         task=asyncio.create_task(serve()), serve=serve)
        self.started.append(node)
        return node

    async def stop_all(self) -> None:
        try:
            for node in self.started:
                await node.stop_service()
                await node.emulator.stop(delete_node=True)
        finally:
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)


async def create_instance(
    kube: AsyncClient,
    namespace: str,
    *,
    configuration: str,
    digest: str,
    nodes: list[str],
    capacity: int,
    shared: bool = False,
) -> str:
    """Create an Instance as the agent's discovery side would; returns its name."""
    name = f"{configuration}-{digest}"
    await kube.create(
        InstanceResource.from_dict(
            {
                "apiVersion": "edgeplug.io/v1alpha1",
                "kind": "Instance",
                # Labelled for each node as the agents' publishers label what they list:
                # an agent's Instance watch selects its node's label (agent.kube.node_instances).
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {serves_label(n): LABEL_VALUE for n in nodes}},
                "spec": {
                    "configurationName": configuration,
                    "cdiName": f"edgeplug.io/{configuration}={digest}",
                    "capacity": capacity,
                    "shared": shared,
                    "nodes": nodes,
                    "brokerProperties": {"DEBUG_ECHO_DESCRIPTION": f"desc-{digest}"},
                },
            }
        )
    )
    return name


def node_device(namespace: str, configuration: str, instance: str) -> NodeDevice:
    """The node-device table entry the discovery side keeps for ``instance``."""
    digest = instance.rpartition("-")[2]
    return NodeDevice(
        instance=instance,
        namespace=namespace,
        configuration=configuration,
        device=Device(
            id=f"desc-{digest}",
            properties={"DEBUG_ECHO_DESCRIPTION": f"desc-{digest}"},
            mounts=(MOUNT,),
            device_specs=(DEVICE,),
        ),
        cdi_name=f"edgeplug.io/{configuration}={digest}",
    )


async def read_instance(kube: AsyncClient, namespace: str, name: str) -> Instance:
    """The Instance as the API server holds it now."""
    return Instance.from_object(
        as_dict(await kube.get(InstanceResource, name, namespace=namespace))
    )


async def share_instance(
    kube: AsyncClient,
    namespace: str,
    *,
    configuration: str,
    digest: str,
    nodes: tuple[AgentNode, ...],
    capacity: int,
) -> tuple[str, str]:
    """A shared Instance served by every one of ``nodes``, once each advertises its fair share.

    Returns the Instance's name and its extended resource. The fair share is ``capacity``
    divided evenly between the nodes.
    """
    name = await create_instance(
        kube,
        namespace,
        configuration=configuration,
        digest=digest,
        nodes=[node.name for node in nodes],
        capacity=capacity,
        shared=True,
    )
    for node in nodes:
        await node.table.put(node_device(namespace, configuration, name))
    resource = f"edgeplug.io/{name}"
    share = str(capacity // len(nodes))
    for node in nodes:
        await wait_allocatable(kube, node.name, resource, share)
    return name, resource


def pinned_pod(
    namespace: str, name: str, *, resource: str, node: str, by_affinity: bool = False,
    stop_at_once: bool = False,
) -> Pod:
    """A pod asking one unit of ``resource`` that can only run on ``node``, pinned the two ways
    the controller may pin (``by_affinity``: node affinity on ``metadata.name``; else a
    ``kubernetes.io/hostname`` node selector), and labelled for the node as the controller
    labels broker pods (the agent's demand watch selects by that label). ``stop_at_once``:
    a zero termination grace period."""
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                        "resources": {"limits": {resource: "1"}}}],
    }
    if by_affinity:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    else:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if stop_at_once:
        spec["terminationGracePeriodSeconds"] = 0
    return cast(Pod, Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL_TARGET_NODE: target_node_label(node)}},
        "spec": spec,
    }))
