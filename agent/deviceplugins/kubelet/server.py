"""One device plugin's gRPC server on its Unix socket.

The kubelet dials each plugin on a socket in its plugin directory and calls the
``DevicePlugin`` service. This module translates between that wire API and a ``PluginBackend``
(plain Python types, ``PluginError`` for refusals) and owns the socket file: it is created on
``start`` (replacing a stale one) and removed on ``stop``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import grpc
from grpc import aio

from agent.deviceplugins.kubelet.backend import (
    ContainerAllocation,
    PluginError,
    PluginSpec,
)
from agent.deviceplugins.kubelet.cancelling import cancellation_kept
from agent.deviceplugins.kubelet.feed import AdvertisedDevice
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.settings import current

log = logging.getLogger(__name__)


HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


def _device_pb(device: AdvertisedDevice) -> pb.Device:
    return pb.Device(ID=device.id, health=HEALTHY if device.healthy else UNHEALTHY)


def _allocation_pb(allocation: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.device_specs
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
    )


class _Servicer(pb_grpc.DevicePluginServicer):
    """The wire-facing half: every call is logged with the resource name and errors mapped."""

    def __init__(self, spec: PluginSpec, on_hung_up: Callable[[], None]) -> None:
        self._spec = spec
        self._stopping = False
        self._on_hung_up = on_hung_up
        #: ListAndWatch streams open now.
        self.streams = 0

    def end_streams(self) -> None:
        """End every ListAndWatch stream, as a plugin that is going away does."""
        self._stopping = True
        self._spec.feed.wake()

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self._spec.pre_start_required,
            get_preferred_allocation_available=True,
        )

    async def ListAndWatch(
        self,
        request: pb.Empty,
        context: aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        resource = self._spec.resource_name
        log.info("ListAndWatch opened", extra={"resource": resource})
        self.streams += 1
        try:
            async for devices in self._updates_until_stopped():
                log.debug(
                    "ListAndWatch update",
                    extra={"resource": resource, "devices": [(d.id, d.healthy) for d in devices]},
                )
                yield pb.ListAndWatchResponse(devices=[_device_pb(d) for d in devices])
        finally:
            # No await here: the stream's task may be cancelled (the kubelet hung up).
            self.streams -= 1
            if not self._stopping and not self.streams:
                self._on_hung_up()

    def _updates_until_stopped(self) -> AsyncIterator[tuple[AdvertisedDevice, ...]]:
        # The stream's own task reads the feed: no task per stream waits for the stop besides
        # it (one plugin per Instance, so every task and future per stream counts at rest).
        # The kubelet hanging up cancels that task inside the feed's wait.
        return self._spec.feed.updates(until=lambda: self._stopping)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            try:
                ids = await self._spec.backend.preferred_allocation(
                    available=list(container.available_deviceIDs),
                    must_include=list(container.must_include_deviceIDs),
                    size=container.allocation_size,
                )
            except PluginError as error:
                await self._abort(context, "GetPreferredAllocation", error)
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=list(ids)))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        requests = [list(c.devices_ids) for c in request.container_requests]
        try:
            allocations = await self._spec.backend.allocate(requests)
        except PluginError as error:
            await self._abort(context, "Allocate", error)
        log.info(
            "Allocate answered", extra={"resource": self._spec.resource_name, "devices": requests}
        )
        return pb.AllocateResponse(container_responses=[_allocation_pb(a) for a in allocations])

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        try:
            await self._spec.backend.pre_start(list(request.devices_ids))
        except PluginError as error:
            await self._abort(context, "PreStartContainer", error)
        return pb.PreStartContainerResponse()

    async def _abort(self, context: aio.ServicerContext, call: str, error: PluginError) -> None:  # type: ignore[type-arg]
        message = f"{self._spec.resource_name}: {call}: {error.message}"
        log.warning(
            "%s refused",
            call,
            extra={"resource": self._spec.resource_name, "code": error.code.name, "error": message},
        )
        await context.abort(error.code, message)


class _GenericHandlersOnly:
    """What the generated ``add_DevicePluginServicer_to_server`` sees as the server: it keeps
    the generic handler and drops the "registered method" ones.

    A registered method makes ``grpc.aio`` keep one call requested from gRPC core per method
    and server at all times (a task, its call state and a core request each): five per plugin,
    one plugin per Instance, about 10 KiB each at rest. The generic handler serves the same
    five methods through the one request every server keeps anyway.
    """

    def __init__(self, server: aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(
        self, handlers: Sequence[grpc.GenericRpcHandler[Any, Any]]
    ) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        del service, handlers  # served by the generic handler


class PluginServer:
    """Serves one plugin on ``<plugin_dir>/<socket_name>``; restartable (stop, then start)."""

    def __init__(
        self, *, spec: PluginSpec, plugin_dir: Path, on_hung_up: Callable[[], None] = lambda: None
    ) -> None:
        """``on_hung_up``: called when the kubelet ends the last open ListAndWatch stream
        while this server is not stopping."""
        self.spec = spec
        self.socket_path = plugin_dir / spec.socket_name
        self._on_hung_up = on_hung_up
        self._server: aio.Server | None = None
        self._servicer: _Servicer | None = None
        self._inode: int | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def streams(self) -> int:
        """ListAndWatch streams open now."""
        return self._servicer.streams if self._servicer is not None else 0

    async def start(self) -> None:
        if self._server is not None:
            await self.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = aio.server()
        self._servicer = _Servicer(self.spec, self._on_hung_up)
        # The generated function calls only the two methods _GenericHandlersOnly has.
        only_generic = cast(aio.Server, _GenericHandlersOnly(server))
        pb_grpc.add_DevicePluginServicer_to_server(self._servicer, only_generic)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        self._server = server
        self._inode = os.stat(self.socket_path).st_ino
        log.info(
            "device plugin serving",
            extra={"resource": self.spec.resource_name, "socket": str(self.socket_path)},
        )

    def socket_intact(self) -> bool:
        """False when our socket file was deleted or replaced (the kubelet restarted)."""
        try:
            return os.stat(self.socket_path).st_ino == self._inode
        except FileNotFoundError:
            return False

    def end_streams(self) -> None:
        """End the ListAndWatch streams now (the kubelet drops the resource's devices when its
        stream ends); ``stop`` follows. Several plugins going at once end theirs together."""
        if self._servicer is not None:
            self._servicer.end_streams()

    async def stop(self) -> None:
        server, self._server = self._server, None
        servicer, self._servicer = self._servicer, None
        if servicer is not None:
            servicer.end_streams()
        # grpc.aio's stop can swallow a cancellation (agent.deviceplugins.kubelet.cancelling).
        with cancellation_kept():
            if server is not None:
                await server.stop(current().device_plugins.stop_grace_s)
            if self._inode is not None and self.socket_intact():
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path.unlink()
            self._inode = None
