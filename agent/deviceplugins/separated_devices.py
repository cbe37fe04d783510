"""Moves the pods off devices their handler separated, for devices the kubelet allocates.

Why this exists: a device plugin can only tell the kubelet a device is Unhealthy, and the
kubelet evicts nobody for that; the pods holding it keep running against it. Some faults
need the pod elsewhere: an Ascend chip at Huawei's ``SeparateNPU`` level is broken, and
Huawei's stack (Volcano's rescheduling) restarts the job on other chips. A handler says so
through its device's health (``moves_pods`` true: ``discovery_handlers.ascend.faults``). The
agent then evicts each pod holding such a device (the Eviction API: PodDisruptionBudgets are
honoured, the pod's grace period is kept), and the pod's controller (a Job, a Deployment)
makes a new one, which the scheduler places and the kubelet gives healthy devices. A bare pod
is evicted too: nothing brings it back, as with a node drain.

Which pods hold what comes from the kubelet's pod-resources ``List`` the slot sweep makes
(``PodResourcesClient.on_pods``), mapped to devices as the pod annotator maps them. The
evictions are made as the kubelet where its certificate is given (``NodeReads``): the Node
authorizer grants a node ``create`` on ``pods/eviction`` and NodeRestriction lets it evict only
pods bound to itself, so the agent's token needs no right of its own; without the certificate
the evictions go with the agent's token, which the shipped manifests do not grant (one warning,
then retried at each ``List``). Each pod is evicted once per set of devices it holds; a refusal
(a budget not allowing it now) is tried again at the next ``List``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.kubelet.podresources import LatestPods, PodDevices
from agent.discovery.node_devices import NodeDevice, NodeDeviceTable
from agent.kube.node_reads import NodeReads

log = logging.getLogger(__name__)

#: A pod and the device ids it holds: evicted once per such key.
_PodKey = tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]]


def moves_pods(device: NodeDevice) -> bool:
    """The handler says the pods holding this device must run elsewhere."""
    return not device.healthy and bool(getattr(device.device.health, "moves_pods", False))


class SeparatedDeviceEvictor:
    """Evicts the pods that hold a device whose handler separated it."""

    def __init__(self, *, reads: NodeReads,
                 resolve: Callable[[str, Sequence[str]], list[NodeDevice] | None],
                 devices: NodeDeviceTable | None = None) -> None:
        """``resolve(resource, ids)``: ``agent.deviceplugins.pod_annotations.devices_of`` over the
        slot service's current view; ``devices``: the table whose changes (a device separated) have
        the pods of the last ``List`` looked at again at once, not at the next ``List``."""
        self._reads = reads
        self._resolve = resolve
        self._devices = devices
        self._pods = LatestPods()
        self._last: Sequence[PodDevices] = ()
        self._done: set[_PodKey] = set()
        self._warned = False

    def offer(self, pods: Sequence[PodDevices]) -> None:
        """A pod-resources ``List`` answered: look at its pods (the latest answer wins)."""
        self._pods.offer(pods)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            if self._devices is not None:
                tasks.create_task(self._on_device_changes(self._devices))
            tasks.create_task(self._evict_loop())

    async def _on_device_changes(self, table: NodeDeviceTable) -> None:
        version = table.version
        while True:
            version = await table.wait_changed(version)
            self._pods.offer(self._last)

    async def _evict_loop(self) -> None:
        while True:
            pods = self._last = await self._pods.next()
            self._done &= {(p.namespace, p.name, p.devices) for p in pods}
            for pod in pods:
                key = (pod.namespace, pod.name, pod.devices)
                if key in self._done:
                    continue
                separated = self._separated(pod)
                if not separated:
                    continue
                if await self._evict(pod, separated):
                    self._done.add(key)

    def _separated(self, pod: PodDevices) -> list[NodeDevice]:
        found = []
        for resource, ids in pod.devices:
            for device in self._resolve(resource, ids) or ():
                if moves_pods(device) and device not in found:
                    found.append(device)
        return found

    async def _evict(self, pod: PodDevices, separated: list[NodeDevice]) -> bool:
        """Evict ``pod``; whether that is settled (evicted, or gone)."""
        reasons = "; ".join(f"{d.namespace}/{d.instance}: {d.health.reason}" for d in separated)
        extra = {"pod": f"{pod.namespace}/{pod.name}", "devices": reasons}
        body = Pod.Eviction(metadata=ObjectMeta(name=pod.name, namespace=pod.namespace))
        try:
            client = await self._reads.client()
            await client.create(body, pod.name, namespace=pod.namespace)
        except ApiError as error:
            code = error.status.code
            if code == 404:
                return True
            if code == 403 and not self._warned:
                self._warned = True
                log.warning("may not evict a pod off a separated device as %s (%s): the pod "
                            "keeps the device; give the agent the kubelet's certificate "
                            "(KUBELET_CLIENT_CERT)", self._reads.identity,
                            error.status.message, extra=extra)
            elif code != 403:
                log.warning("evicting a pod off a separated device failed (tried again at the "
                            "next pod-resources List): %s", error.status.message, extra=extra)
            return False
        except Exception as error:  # the API server away: tried again at the next List
            log.warning("evicting a pod off a separated device failed (tried again at the next "
                        "pod-resources List): %s", error, extra=extra)
            return False
        log.warning("evicted a pod off a separated device; its controller makes a new one",
                    extra=extra)
        return True
