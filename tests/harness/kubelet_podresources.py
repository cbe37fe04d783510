"""The emulated kubelet's pod-resources API (podresources/v1) on a Unix socket.

Node agents ask the kubelet which devices its live pods hold (the kubelet serves
``PodResourcesLister`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``) to reconcile their
slot bookkeeping after a restart. This serves the same API from the emulator's records.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import grpc
import grpc.aio

from agent.kubeletapi import podresources_v1_pb2 as pr
from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from tests.harness.kubelet_devices import DeviceManager
from tests.harness.kubelet_pods import PodManager, PodRecord
from tests.harness.unix_grpc import SocketServer

#: How long stopping the server lets in-flight calls finish.
SERVER_STOP_GRACE_S = 0.5


def _pod_resources(record: PodRecord) -> pr.PodResources:
    by_container: dict[str, list[pr.ContainerDevices]] = defaultdict(list)
    for allocation in record.allocations:
        if not allocation.init_container:
            by_container[allocation.container].append(pr.ContainerDevices(
                resource_name=allocation.resource_name, device_ids=list(allocation.device_ids)))
    return pr.PodResources(
        name=record.name, namespace=record.namespace,
        containers=[pr.ContainerResources(name=name, devices=by_container.get(name, []))
                    for name in record.containers],
    )


class _PodResourcesService(pr_grpc.PodResourcesListerServicer):
    def __init__(self, *, pods: PodManager, devices: DeviceManager) -> None:
        self._pods = pods
        self._devices = devices

    async def List(
        self, request: pr.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.ListPodResourcesRequest, pr.ListPodResourcesResponse],
    ) -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[_pod_resources(r) for r in self._pods.live_records()])

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[pr.AllocatableResourcesRequest,
                                          pr.AllocatableResourcesResponse],
    ) -> pr.AllocatableResourcesResponse:
        return pr.AllocatableResourcesResponse(devices=[
            pr.ContainerDevices(resource_name=name, device_ids=self._devices.healthy_ids(name))
            for name in sorted(self._devices.healthy_counts())
        ])

    async def Get(
        self, request: pr.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.GetPodResourcesRequest, pr.GetPodResourcesResponse],
    ) -> pr.GetPodResourcesResponse:
        record = self._pods.record(request.pod_namespace, request.pod_name)
        if record is None or not record.live:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"pod {request.pod_namespace}/{request.pod_name} not found")
        assert record is not None
        return pr.GetPodResourcesResponse(pod_resources=_pod_resources(record))


class PodResourcesServer(SocketServer):
    """Serves PodResourcesLister on one socket path (removed when stopped)."""

    def __init__(self, *, socket_path: Path, pods: PodManager, devices: DeviceManager) -> None:
        service = _PodResourcesService(pods=pods, devices=devices)
        super().__init__(
            socket_path,
            add_services=lambda server: pr_grpc.add_PodResourcesListerServicer_to_server(
                service, server
            ),
            stop_grace_s=SERVER_STOP_GRACE_S,
        )

    async def stop(self) -> None:
        await super().stop()
        self.socket_path.unlink(missing_ok=True)
