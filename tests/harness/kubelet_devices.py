"""The emulated kubelet's device manager: kubelet.sock, plugin endpoints and their devices.

Why this exists: device plugins only ever talk to a kubelet, and we cannot run one here. This
module plays the kubelet's device-manager part over the real ``deviceplugin/v1beta1`` gRPC API:
it serves ``Registration`` on ``<plugin_dir>/kubelet.sock``, dials each registered plugin back
on its own socket, keeps the ``ListAndWatch`` stream open and remembers the devices it reports,
and makes the per-container calls (GetPreferredAllocation, Allocate, PreStartContainer) that pod
admission needs. A plugin that misbehaves is logged and dropped; it never takes the manager down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import grpc
import grpc.aio

from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from tests.harness.kubelet_records import (
    DEVICE_PLUGIN_VERSION,
    HEALTHY,
    Registration,
    is_extended_resource_name,
)
from tests.harness.unix_grpc import SocketServer

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
#: Deadline of every unary call to a plugin (options, preferred allocation, allocate, pre-start).
PLUGIN_RPC_TIMEOUT_S = 10.0
#: How long stopping the registration server lets in-flight Register calls finish.
SERVER_STOP_GRACE_S = 0.5


class PluginEndpoint:
    """One registered plugin: its channel, options, and the devices its stream last reported."""

    def __init__(self, *, resource_name: str, socket_path: Path) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self.devices: dict[str, str] = {}  # device id -> health
        self.pre_start_required = False
        self.preferred_allocation_available = False
        self.streaming = False  # True once the first ListAndWatch response arrived
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self._stub = pb_grpc.DevicePluginStub(self._channel)
        self.task: asyncio.Task[None] | None = None

    def healthy_ids(self) -> list[str]:
        return sorted(d for d, health in self.devices.items() if health == HEALTHY)

    async def watch(self, on_change: Callable[[], None]) -> None:
        """Fetch options, then follow ListAndWatch until the plugin ends it or goes away."""
        options = await self._stub.GetDevicePluginOptions(pb.Empty(), timeout=PLUGIN_RPC_TIMEOUT_S)
        self.pre_start_required = options.pre_start_required
        self.preferred_allocation_available = options.get_preferred_allocation_available
        stream = self._stub.ListAndWatch(pb.Empty())
        async for response in stream:
            self.devices = {device.ID: device.health for device in response.devices}
            self.streaming = True
            log.debug("%s: %d devices, %d healthy", self.resource_name,
                      len(self.devices), len(self.healthy_ids()))
            on_change()

    async def preferred(self, *, available: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), allocation_size=size)
        ])
        response = await self._stub.GetPreferredAllocation(request, timeout=PLUGIN_RPC_TIMEOUT_S)
        if len(response.container_responses) != 1:
            raise ValueError(f"{len(response.container_responses)} container responses, want 1")
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))])
        response = await self._stub.Allocate(request, timeout=PLUGIN_RPC_TIMEOUT_S)
        if len(response.container_responses) != 1:
            raise ValueError(f"{len(response.container_responses)} container responses, want 1")
        return response.container_responses[0]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        await self._stub.PreStartContainer(request, timeout=PLUGIN_RPC_TIMEOUT_S)

    async def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self._channel.close(None)


class _RegistrationService(pb_grpc.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self._manager = manager

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext[object, object],
    ) -> pb.Empty:
        problem = self._manager.validate(request)
        if problem is not None:
            log.warning("rejected registration of %r: %s", request.resource_name, problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        self._manager.add_endpoint(request)
        return pb.Empty()


class DeviceManager:
    """Serves kubelet.sock and owns one PluginEndpoint per registered resource name."""

    def __init__(self, *, plugin_dir: Path, on_change: Callable[[], None]) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[Registration] = []
        self._on_change = on_change
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._known: set[str] = set()  # every resource ever registered: reported even at 0
        self._grpc = SocketServer(
            self.socket_path,
            add_services=lambda server: pb_grpc.add_RegistrationServicer_to_server(
                _RegistrationService(self), server
            ),
            stop_grace_s=SERVER_STOP_GRACE_S,
        )
        self._closing: set[asyncio.Task[None]] = set()  # replaced endpoints being closed

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self._grpc.start()

    async def stop(self) -> None:
        await self._grpc.stop()
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()
        for endpoint in endpoints:
            await endpoint.close()
        self._on_change()

    async def restart(self) -> None:
        """As a kubelet restarts: drop every plugin, delete every socket, serve anew."""
        await self.stop()
        for path in self.plugin_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()
        await self.start()

    # -- registration ----------------------------------------------------------------------

    def validate(self, request: pb.RegisterRequest) -> str | None:
        """Why the kubelet would refuse this request, or None."""
        if request.version != DEVICE_PLUGIN_VERSION:
            return (f"unsupported version {request.version!r}, "
                    f"this kubelet speaks {DEVICE_PLUGIN_VERSION!r}")
        if not is_extended_resource_name(request.resource_name):
            return f"invalid extended resource name {request.resource_name!r}"
        endpoint = request.endpoint
        if not endpoint or "/" in endpoint or endpoint in (".", "..", KUBELET_SOCKET):
            return f"invalid endpoint {endpoint!r}: a socket file name in the plugin directory"
        return None

    def add_endpoint(self, request: pb.RegisterRequest) -> None:
        """Accept a registration: a new endpoint replaces any earlier one for the resource."""
        resource = request.resource_name
        self.registrations.append(Registration(
            resource_name=resource,
            endpoint=request.endpoint,
            time=datetime.now(UTC),
            pre_start_required=request.options.pre_start_required,
            get_preferred_allocation_available=request.options.get_preferred_allocation_available,
        ))
        endpoint = PluginEndpoint(resource_name=resource,
                                  socket_path=self.plugin_dir / request.endpoint)
        old = self._endpoints.get(resource)
        self._endpoints[resource] = endpoint
        self._known.add(resource)
        endpoint.task = asyncio.create_task(self._follow(endpoint), name=f"plugin {resource}")
        if old is not None:
            log.info("%s re-registered: replacing the old endpoint %s", resource, old.socket_path)
            closing = asyncio.create_task(old.close(), name=f"close old plugin {resource}")
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    async def _follow(self, endpoint: PluginEndpoint) -> None:
        try:
            await endpoint.watch(self._on_change)
            log.info("%s: plugin ended its ListAndWatch stream", endpoint.resource_name)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            log.warning("%s: plugin at %s failed: %s %s", endpoint.resource_name,
                        endpoint.socket_path, error.code(), error.details())
        except Exception:
            log.exception("%s: plugin at %s misbehaved", endpoint.resource_name,
                          endpoint.socket_path)
        finally:
            if self._endpoints.get(endpoint.resource_name) is endpoint:
                # The plugin is gone: its devices are no longer allocatable.
                endpoint.devices = {}
                del self._endpoints[endpoint.resource_name]
                self._on_change()

    # -- queries ---------------------------------------------------------------------------

    def endpoint(self, resource_name: str) -> PluginEndpoint | None:
        return self._endpoints.get(resource_name)

    def knows(self, resource_name: str) -> bool:
        """Whether a plugin ever registered this resource (else the kubelet ignores it)."""
        return resource_name in self._known

    def healthy_counts(self) -> dict[str, int]:
        """Healthy devices per known resource: what the Node's capacity/allocatable say."""
        counts = dict.fromkeys(self._known, 0)
        for name, endpoint in self._endpoints.items():
            counts[name] = len(endpoint.healthy_ids())
        return counts

    def healthy_ids(self, resource_name: str) -> list[str]:
        endpoint = self._endpoints.get(resource_name)
        return endpoint.healthy_ids() if endpoint is not None else []
