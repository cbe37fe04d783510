"""Moves the pods off devices their handler separated, for devices the kubelet allocates.

A device plugin can only say Unhealthy, and the kubelet evicts nobody for that. For a device whose
health says ``moves_pods`` (an Ascend chip at ``SeparateNPU``), ``SeparatedDeviceEvictor`` evicts
each pod holding it (the Eviction API: budgets and grace periods kept), from the pod-resources
``List`` of the slot sweep, as the kubelet where its certificate is given (``NodeReads``). Each
pod once per set of devices; a refusal is tried again at the next ``List``.
docs/handlers/ascend.md, "Health".
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
