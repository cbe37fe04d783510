"""The emulated kubelet's device manager: kubelet.sock, plugin endpoints and their devices.

Device plugins only ever talk to a kubelet, and we cannot run one here. This
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
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

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
_T = TypeVar("_T")

KUBELET_SOCKET = "kubelet.sock"
#: Deadline of every unary call to a plugin (options, preferred allocation, allocate, pre-start).
PLUGIN_RPC_TIMEOUT_S = 10.0
#: How long stopping the registration server lets in-flight Register calls finish.
SERVER_STOP_GRACE_S = 0.5
#: How long the kubelet keeps a gone plugin's devices in capacity (its endpointStopGracePeriod).
ENDPOINT_STOP_GRACE_S = 300.0
#: The HTTP/2 ``:authority`` the kubelet sends on every plugin call (its dialer's
#: ``grpc.WithAuthority("localhost")``). gRPC core would otherwise send the socket path,
#: percent-encoded, which HTTP/2 stacks that validate the authority (tonic/h2) refuse.
PLUGIN_AUTHORITY = "localhost"
#: How long the kubelet's dialer waits for a plugin's socket to accept (its ``dial`` timeout).
PLUGIN_DIAL_TIMEOUT_S = 10.0


def plugin_channel(socket_path: Path) -> grpc.aio.Channel:
    """A channel to a plugin's socket that speaks as the kubelet's plugin client does."""
    return grpc.aio.insecure_channel(
        f"unix:{socket_path}", options=[("grpc.default_authority", PLUGIN_AUTHORITY)])


class PluginGone(Exception):
    """A call to a plugin ended because its channel closed under it (a kubelet restart or a
    re-registration replaced the endpoint): the kubelet sees an RPC error, not a crash."""


def cancelled_by_caller() -> bool:
    """Whether the running task itself is being cancelled (not merely a call inside it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def _unary(call: Awaitable[_T], what: str) -> _T:
    """Await one unary plugin call; a call cancelled by its channel closing is PluginGone."""
    try:
        return await call
    except asyncio.CancelledError:
        if cancelled_by_caller():
            raise
        raise PluginGone(f"{what}: the connection to the plugin was closed") from None


class PluginEndpoint:
    """One registered plugin: its channel, options, and the devices its stream last reported."""

    def __init__(self, *, resource_name: str, socket_path: Path) -> None:
        self.resource_name = resource_name
        self.socket_path = socket_path
        self.devices: dict[str, str] = {}  # device id -> health
        self.pre_start_required = False
        self.preferred_allocation_available = False
        self.streaming = False  # True once the first ListAndWatch response arrived
        self.first_healthy: list[str] | None = None  # that first response's healthy ids
        self._channel = plugin_channel(socket_path)
        self._stub = pb_grpc.DevicePluginStub(self._channel)
        self.task: asyncio.Task[None] | None = None

    def healthy_ids(self) -> list[str]:
        return sorted(d for d, health in self.devices.items() if health == HEALTHY)

    async def connect(self) -> None:
        """Dial the plugin and fetch its options, as the kubelet does inside Register: wait
        (up to its dial timeout) for the socket to accept, then GetDevicePluginOptions."""
        async with asyncio.timeout(PLUGIN_DIAL_TIMEOUT_S):
            await self._channel.channel_ready()
        options = await self._stub.GetDevicePluginOptions(pb.Empty(), timeout=PLUGIN_RPC_TIMEOUT_S)
        self.pre_start_required = options.pre_start_required
        self.preferred_allocation_available = options.get_preferred_allocation_available

    async def watch(self, on_change: Callable[[], None]) -> None:
        """Follow ListAndWatch until the plugin ends it or goes away."""
        stream = self._stub.ListAndWatch(pb.Empty())
        async for response in stream:
            self.devices = {device.ID: device.health for device in response.devices}
            if self.first_healthy is None:
                self.first_healthy = self.healthy_ids()
            self.streaming = True
            log.debug("%s: %d devices, %d healthy", self.resource_name,
                      len(self.devices), len(self.healthy_ids()))
            on_change()

    async def preferred(self, *, available: Sequence[str], size: int) -> list[str]:
        request = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(available), allocation_size=size)
        ])
        response = await _unary(
            self._stub.GetPreferredAllocation(request, timeout=PLUGIN_RPC_TIMEOUT_S),
            "GetPreferredAllocation")
        if len(response.container_responses) != 1:
            raise ValueError(f"{len(response.container_responses)} container responses, want 1")
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=list(device_ids))])
        response = await _unary(self._stub.Allocate(request, timeout=PLUGIN_RPC_TIMEOUT_S),
                                "Allocate")
        if len(response.container_responses) != 1:
            raise ValueError(f"{len(response.container_responses)} container responses, want 1")
        return response.container_responses[0]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        request = pb.PreStartContainerRequest(devices_ids=list(device_ids))
        await _unary(self._stub.PreStartContainer(request, timeout=PLUGIN_RPC_TIMEOUT_S),
                     "PreStartContainer")

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
        # The kubelet answers Register only once it has dialled the plugin back and read its
        # options; a plugin it cannot reach gets an error, not a registration.
        failure = await self._manager.add_endpoint(request)
        if failure is not None:
            log.warning("registration of %r failed: %s", request.resource_name, failure)
            await context.abort(grpc.StatusCode.UNKNOWN, failure)
        return pb.Empty()


class DeviceManager:
    """Serves kubelet.sock and owns one PluginEndpoint per registered resource name."""

    def __init__(self, *, plugin_dir: Path, on_change: Callable[[], None]) -> None:
        self.plugin_dir = plugin_dir
        self.registrations: list[Registration] = []
        self._on_change = on_change
        self._endpoints: dict[str, PluginEndpoint] = {}
        self._known: set[str] = set()  # every resource ever registered: reported even at 0
        # Resources whose plugin went away: (devices it last reported, loop time it went).
        self._gone: dict[str, tuple[int, float]] = {}
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

    async def add_endpoint(self, request: pb.RegisterRequest) -> str | None:
        """Connect to a registering plugin; once connected it replaces any earlier endpoint
        for the resource. Returns why the connection failed, or None."""
        resource = request.resource_name
        endpoint = PluginEndpoint(resource_name=resource,
                                  socket_path=self.plugin_dir / request.endpoint)
        try:
            await endpoint.connect()
        except (TimeoutError, grpc.aio.AioRpcError) as error:
            await endpoint.close()
            detail = (f"{error.code().name}: {error.details()}"
                      if isinstance(error, grpc.aio.AioRpcError) else "dial timed out")
            return f"failed to dial device plugin at {endpoint.socket_path}: {detail}"
        self.registrations.append(Registration(
            resource_name=resource,
            endpoint=request.endpoint,
            time=datetime.now(UTC),
            pre_start_required=request.options.pre_start_required,
            get_preferred_allocation_available=request.options.get_preferred_allocation_available,
        ))
        old = self._endpoints.get(resource)
        self._endpoints[resource] = endpoint
        self._known.add(resource)
        endpoint.task = asyncio.create_task(self._follow(endpoint), name=f"plugin {resource}")
        if old is not None:
            log.info("%s re-registered: replacing the old endpoint %s", resource, old.socket_path)
            closing = asyncio.create_task(old.close(), name=f"close old plugin {resource}")
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        return None

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
                # The plugin is gone: its devices are no longer allocatable, but the kubelet
                # counts them (unhealthy) in capacity until its stop grace expires.
                self._gone[endpoint.resource_name] = (
                    len(endpoint.devices), asyncio.get_running_loop().time())
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
        """Healthy devices per known resource: what the Node's allocatable says."""
        counts = dict.fromkeys(self._known, 0)
        for name, endpoint in self._endpoints.items():
            counts[name] = len(endpoint.healthy_ids())
        return counts

    def capacity_counts(self) -> dict[str, int]:
        """Devices per known resource, healthy or not, as the kubelet's capacity counts them:
        a gone plugin's last count while within ENDPOINT_STOP_GRACE_S, then 0."""
        counts = dict.fromkeys(self._known, 0)
        now = asyncio.get_running_loop().time()
        for name, (total, gone_at) in self._gone.items():
            if now - gone_at < ENDPOINT_STOP_GRACE_S:
                counts[name] = total
        for name, endpoint in self._endpoints.items():
            counts[name] = len(endpoint.devices)
        return counts

    def healthy_ids(self, resource_name: str) -> list[str]:
        endpoint = self._endpoints.get(resource_name)
        return endpoint.healthy_ids() if endpoint is not None else []
