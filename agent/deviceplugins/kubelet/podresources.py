"""The kubelet's pod-resources API: which device ids live pods hold right now.

A slot recorded in ``deviceUsage`` stays held until someone frees it, and the
kubelet never tells a device plugin that a pod went away. Its pod-resources ``List`` (a Unix
socket, normally ``/var/lib/kubelet/pod-resources/kubelet.sock``) is the authoritative answer;
this module is the one narrow seam to it.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from agent.kubeletapi import podresources_v1_pb2 as pb
from agent.kubeletapi import podresources_v1_pb2_grpc as pb_grpc
from agent.settings import current


@dataclass(frozen=True)
class PodDevices:
    """One pod as ``List`` shows it: (resource name, device ids) of its containers, in order."""

    namespace: str
    name: str
    devices: tuple[tuple[str, tuple[str, ...]], ...]


def _by_resource(devices: Iterable[tuple[str, Iterable[str]]]) -> dict[str, frozenset[str]]:
    grouped: dict[str, set[str]] = defaultdict(set)
    for resource, ids in devices:
        grouped[resource].update(ids)
    return {name: frozenset(ids) for name, ids in grouped.items()}


def devices_by_resource(pods: Iterable[PodDevices]) -> dict[str, frozenset[str]]:
    """Resource name → the device ids that the containers of ``pods`` hold."""
    return _by_resource(devices for pod in pods for devices in pod.devices)


class LatestPods:
    """The pods of the latest pod-resources ``List``, for a consumer that looks at them in a
    task of its own: ``offer`` is handed each answer, ``next`` waits for one (the latest wins,
    and answers not looked at yet are dropped)."""

    def __init__(self) -> None:
        self._latest: Sequence[PodDevices] | None = None
        self._wake = asyncio.Event()

    def offer(self, pods: Sequence[PodDevices]) -> None:
        self._latest = pods
        self._wake.set()

    async def next(self) -> Sequence[PodDevices]:
        await self._wake.wait()
        self._wake.clear()
        pods, self._latest = self._latest or (), None
        return pods


class PodResourcesClient:
    """A channel to the pod-resources socket, opened once and closed by ``close``.

    ``on_pods``, when set, is handed every ``List``'s pods (``agent.deviceplugins.pod_annotations``
    reads them), so one ``List`` serves both the slot sweep and the pod annotations."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self._channel = aio.insecure_channel(f"unix://{socket_path}")
        self._stub = pb_grpc.PodResourcesListerStub(self._channel)
        self.on_pods: Callable[[Sequence[PodDevices]], None] | None = None

    def server_identity(self) -> tuple[int, int] | None:
        """The socket file's (inode, ctime); None while there is none. A kubelet that
        restarts serves its pod-resources API on a new socket file, so a changed identity
        means a new kubelet, which lists no pod until it has admitted its pods again."""
        try:
            st = os.stat(self.socket_path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    async def pods(self) -> list[PodDevices]:
        """The pods holding devices (of any resource), as one ``List`` answers."""
        response = await self._stub.List(
            pb.ListPodResourcesRequest(), timeout=current().device_plugins.pod_resources_timeout_s)
        pods = [
            PodDevices(pod.namespace, pod.name, tuple(
                (devices.resource_name, tuple(devices.device_ids))
                for container in pod.containers for devices in container.devices))
            for pod in response.pod_resources
        ]
        if self.on_pods is not None:
            self.on_pods(pods)
        return pods

    async def allocatable(self) -> dict[str, frozenset[str]]:
        """Resource name → the device ids the kubelet's device manager holds healthy now
        (``GetAllocatableResources``): what it would admit a pod with."""
        response = await self._stub.GetAllocatableResources(
            pb.AllocatableResourcesRequest(),
            timeout=current().device_plugins.pod_resources_timeout_s)
        return _by_resource((d.resource_name, d.device_ids) for d in response.devices)

    async def devices_in_use(self) -> dict[str, frozenset[str]]:
        """Resource name → the device ids that containers of existing pods hold."""
        return devices_by_resource(await self.pods())

    async def close(self) -> None:
        await self._channel.close(None)
