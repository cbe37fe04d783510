"""The emulated kubelet's Node object: registration, heartbeat Lease, status with device counts.

The scheduler places pods only on a Node that is Ready, untainted and has the
requested resources in ``status.allocatable``; the real kube-controller-manager marks a Node
NotReady (and taints it) when its kubelet stops renewing its Lease in ``kube-node-lease`` or its
Ready condition. ``NodeReporter`` creates or adopts the Node, renews the Lease often enough,
writes device counts into capacity/allocatable whenever the device manager says they changed,
and otherwise writes the status as seldom as the kubelet does (``NODE_STATUS_REPORT_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from tests.harness.kubebin import KUBE_VERSION

log = logging.getLogger(__name__)

#: How often the Lease is renewed. The node-lifecycle controller's grace period is 40 s or more,
#: so 5 s leaves a wide margin on a busy machine.
HEARTBEAT_INTERVAL_S = 5.0
#: With nothing changed, the Node's status (its conditions' heartbeat times) is written again
#: this often: the kubelet's ``nodeStatusReportFrequency`` default. As the kubelet does since
#: its Lease took over the heartbeat, a status write comes on a change or after this long, so
#: whatever watches the Node (the agent) sees an idle node as quiet as a real one.
NODE_STATUS_REPORT_S = 300.0
#: After a failed status write, try again this soon.
STATUS_RETRY_S = 0.5
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_S = 40
FIELD_MANAGER = "edgeplug-node-emulator"
KUBELET_VERSION = KUBE_VERSION  # what the emulated node reports: the control plane's pin
#: Taints that say a node is not (yet) ready. The API server's TaintNodesByCondition admission
#: puts the first on every new Node, and the node-lifecycle controller removes them some seconds
#: after it sees the Node Ready. The emulator removes them itself once it posted Ready, so the
#: node is schedulable as soon as ``start`` returns; the controller would reach the same state.
READINESS_TAINTS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})
#: What every emulated node offers besides devices: enough for many small test pods.
BASE_RESOURCES: Mapping[str, str] = {"cpu": "16", "memory": "64Gi", "pods": "250",
                                     "ephemeral-storage": "100Gi"}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeReporter:
    """Keeps one Node and its Lease alive and in step with the device counts."""

    def __init__(self, *, client: AsyncClient, node_name: str, labels: Mapping[str, str],
                 device_counts: Callable[[], Mapping[str, int]],
                 device_capacity: Callable[[], Mapping[str, int]] | None = None) -> None:
        """``device_counts``: healthy devices per resource (allocatable); ``device_capacity``:
        all devices per resource, unhealthy ones too (capacity; default: the same counts)."""
        self._client = client
        self.node_name = node_name
        self._labels = {
            "kubernetes.io/hostname": node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "edgeplug.io/emulated-node": "true",
            **labels,
        }
        self._device_counts = device_counts
        self._device_capacity = device_capacity or device_counts
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._boot_time = _now()
        self._ready = True
        self._ready_since = self._boot_time

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._ensure_node()
        await self._write_status()
        await self._renew_lease()
        await self._clear_readiness_taints()
        self._task = asyncio.create_task(self._heartbeat(), name=f"heartbeat {self.node_name}")

    async def stop(self, *, delete_node: bool) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if delete_node:
            with contextlib.suppress(ApiError):
                await self._client.delete(Lease, self.node_name, namespace=LEASE_NAMESPACE)
            with contextlib.suppress(ApiError):
                await self._client.delete(Node, self.node_name)

    async def set_ready(self, ready: bool) -> None:
        """Post Ready=True or Ready=False now (as a kubelet whose runtime broke or recovered)."""
        if ready != self._ready:
            self._ready = ready
            self._ready_since = _now()
        await self._write_status()
        if ready:
            await self._clear_readiness_taints()

    def poke(self) -> None:
        """The device counts changed: write them soon."""
        self._changed.set()

    # -- the loop --------------------------------------------------------------------------

    async def _heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        next_lease = loop.time() + HEARTBEAT_INTERVAL_S
        next_report = loop.time() + NODE_STATUS_REPORT_S
        while True:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(next_lease, next_report)):
                    await self._changed.wait()
            changed = self._changed.is_set()
            self._changed.clear()
            try:
                if changed or loop.time() >= next_report:
                    await self._write_status()
                    next_report = loop.time() + NODE_STATUS_REPORT_S
                if loop.time() >= next_lease:
                    await self._renew_lease()
                    next_lease = loop.time() + HEARTBEAT_INTERVAL_S
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                log.warning("node %s: status write failed: %s", self.node_name, error)
                if error.status.code == 404:
                    await self._recreate()
                self._changed.set()
                await asyncio.sleep(STATUS_RETRY_S)
            except Exception:
                log.exception("node %s: heartbeat failed", self.node_name)
                self._changed.set()
                await asyncio.sleep(STATUS_RETRY_S)

    async def _recreate(self) -> None:
        with contextlib.suppress(ApiError):
            await self._ensure_node()

    # -- the objects -----------------------------------------------------------------------

    async def _ensure_node(self) -> None:
        node = cast(Node, Node.from_dict({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self._labels},
            "spec": {},
            "status": self._status(),
        }))
        try:
            await self._client.create(node, field_manager=FIELD_MANAGER)
            log.info("node %s: created", self.node_name)
        except ApiError as error:
            if error.status.code != 409:
                raise
            # Adopt the existing Node, as a kubelet does on restart: our labels, schedulable.
            await self._client.patch(
                Node, self.node_name,
                {"metadata": {"labels": self._labels}, "spec": {"unschedulable": False}},
                field_manager=FIELD_MANAGER,
            )
            log.info("node %s: adopted", self.node_name)

    async def _clear_readiness_taints(self) -> None:
        node = await self._client.get(Node, self.node_name)
        assert node.metadata is not None
        taints = list(node.spec.taints or []) if node.spec is not None else []
        kept = [t for t in taints if t.key not in READINESS_TAINTS]
        if len(kept) == len(taints):
            return
        patch = {"metadata": {"resourceVersion": node.metadata.resourceVersion},
                 "spec": {"taints": [t.to_dict() for t in kept]}}
        try:
            await self._client.patch(Node, self.node_name, patch, field_manager=FIELD_MANAGER)
        except ApiError as error:
            if error.status.code != 409:
                raise
            # Someone (the node-lifecycle controller) changed the taints meanwhile: it will
            # clear them itself now that the Node is Ready.

    def _status(self) -> dict[str, Any]:
        resources = {**BASE_RESOURCES,
                     **{name: str(n) for name, n in self._device_counts().items()}}
        capacity = {**BASE_RESOURCES,
                    **{name: str(n) for name, n in self._device_capacity().items()}}
        now = _now()

        def condition(kind: str, status: str, reason: str, message: str,
                      since: str) -> dict[str, str]:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": since}

        return {
            "capacity": capacity,
            "allocatable": resources,
            "conditions": [
                condition("Ready", "True", "KubeletReady",
                          "emulated kubelet is posting ready status", self._ready_since)
                if self._ready else
                condition("Ready", "False", "KubeletNotReady",
                          "emulated kubelet was told it is not ready", self._ready_since),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "emulated", self._boot_time),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                          "emulated", self._boot_time),
                condition("PIDPressure", "False", "KubeletHasSufficientPID",
                          "emulated", self._boot_time),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node_name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": self.node_name, "systemUUID": self.node_name,
                "bootID": self._boot_time, "kernelVersion": "emulated",
                "osImage": "edgeplug node emulator", "containerRuntimeVersion": "emulated://1",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    async def _write_status(self) -> None:
        await self._client.patch(Node.Status, self.node_name, {"status": self._status()},
                                 field_manager=FIELD_MANAGER)

    async def _renew_lease(self) -> None:
        try:
            await self._client.patch(Lease, self.node_name,
                                     {"spec": {"renewTime": _micro_now(),
                                               "holderIdentity": self.node_name}},
                                     namespace=LEASE_NAMESPACE, field_manager=FIELD_MANAGER)
        except ApiError as error:
            if error.status.code != 404:
                raise
            node = await self._client.get(Node, self.node_name)
            assert node.metadata is not None
            lease = cast(Lease, Lease.from_dict({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.node_name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
                                         "name": self.node_name, "uid": node.metadata.uid}],
                },
                "spec": {"holderIdentity": self.node_name,
                         "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": _micro_now()},
            }))
            await self._client.create(lease, field_manager=FIELD_MANAGER)
