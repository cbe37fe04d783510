"""A tiny but real device plugin, used only to test the node emulator.

The emulator must be shown to speak the kubelet's side of
``deviceplugin/v1beta1`` correctly without depending on edgeplug's own plugins (which it exists
to test). ``TestPlugin`` serves the DevicePlugin service on a socket in the plugin directory,
registers on ``kubelet.sock``, streams a device list the test controls, answers Allocate with
envs, mounts, device specs, CDI names and annotations derived from the ids, and records every
request it gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from tests.harness.unix_grpc import SocketServer

#: Deadline of the plugin's Register call to the kubelet.
REGISTER_TIMEOUT_S = 5.0
#: How long stopping lets in-flight calls finish.
STOP_GRACE_S = 0.2
CDI_KIND = "edgeplug.test/device"


def write_cdi_spec(cdi_dir: Path, device_ids: Sequence[str]) -> Path:
    """A CDI spec defining this plugin's CDI names for ``device_ids`` (what a plugin that hands
    out CDI names installs for the runtime); each device sets CDI_DEVICE and adds /dev/null."""
    spec = {"cdiVersion": "0.6.0", "kind": CDI_KIND, "devices": [
        {"name": d, "containerEdits": {"env": [f"CDI_DEVICE={d}"],
                                       "deviceNodes": [{"path": "/dev/null"}]}}
        for d in device_ids]}
    path = cdi_dir / "edgeplug-test-device.json"
    path.write_text(json.dumps(spec))
    return path


def env_name(device_id: str) -> str:
    return "TEST_DEVICE_" + "".join(c if c.isalnum() else "_" for c in device_id).upper()


def expected_response(device_ids: Sequence[str]) -> pb.ContainerAllocateResponse:
    """What this plugin's Allocate answers for a container given these ids."""
    return pb.ContainerAllocateResponse(
        envs={"TEST_DEVICES": ",".join(device_ids), **{env_name(d): d for d in device_ids}},
        mounts=[pb.Mount(container_path=f"/var/test/{d}", host_path=f"/srv/test/{d}",
                         read_only=True) for d in device_ids],
        devices=[pb.DeviceSpec(container_path=f"/dev/test-{d}", host_path="/dev/null",
                               permissions="rw") for d in device_ids],
        cdi_devices=[pb.CDIDevice(name=f"{CDI_KIND}={d}") for d in device_ids],
        annotations={"test.edgeplug.io/devices": ",".join(device_ids)},
    )


@dataclass
class Calls:
    """Every request the plugin received, in order."""

    options: int = 0
    list_and_watch: int = 0
    preferred: list[tuple[tuple[str, ...], int]] = field(default_factory=list)  # (available, size)
    allocate: list[tuple[str, ...]] = field(default_factory=list)
    pre_start: list[tuple[str, ...]] = field(default_factory=list)


class TestPlugin(pb_grpc.DevicePluginServicer):
    """A device plugin for ``resource_name`` with the given devices (id -> health)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, *, plugin_dir: Path, resource_name: str, devices: Mapping[str, str],
                 socket_name: str | None = None, preferred: Sequence[str] | None = None,
                 pre_start_required: bool = False, fail_allocate: bool = False,
                 allocate_gate: asyncio.Event | None = None,
                 fail_pre_start: bool = False) -> None:
        self.plugin_dir = plugin_dir
        self.resource_name = resource_name
        self.socket_name = socket_name or resource_name.replace("/", "-") + ".sock"
        self.devices = dict(devices)
        self.preferred_order = list(preferred) if preferred is not None else None
        self.pre_start_required = pre_start_required
        self.fail_allocate = fail_allocate
        # When set, Allocate answers only once the event is set (a plugin slow to allocate).
        self.allocate_gate = allocate_gate
        self.fail_pre_start = fail_pre_start
        self.calls = Calls()
        self._updates: list[asyncio.Queue[dict[str, str] | None]] = []
        self._grpc = SocketServer(
            self.socket_path,
            add_services=lambda server: pb_grpc.add_DevicePluginServicer_to_server(self, server),
            stop_grace_s=STOP_GRACE_S,
        )

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / self.socket_name

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(
            pre_start_required=self.pre_start_required,
            get_preferred_allocation_available=self.preferred_order is not None)

    # -- lifecycle -------------------------------------------------------------------------

    async def serve(self) -> None:
        await self._grpc.start()

    async def register(self, *, version: str = "v1beta1") -> None:
        """Register on kubelet.sock (raises grpc.aio.AioRpcError when refused)."""
        async with grpc.aio.insecure_channel(f"unix:{self.plugin_dir / 'kubelet.sock'}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version=version, endpoint=self.socket_name,
                                   resource_name=self.resource_name, options=self.options()),
                timeout=REGISTER_TIMEOUT_S)

    async def start(self) -> None:
        await self.serve()
        await self.register()

    async def stop(self) -> None:
        for queue in self._updates:
            queue.put_nowait(None)
        await self._grpc.stop()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def set_devices(self, devices: Mapping[str, str]) -> None:
        """Change the device list; every open ListAndWatch stream sends it."""
        self.devices = dict(devices)
        for queue in self._updates:
            queue.put_nowait(dict(self.devices))

    # -- the DevicePlugin service ----------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.DevicePluginOptions],
    ) -> pb.DevicePluginOptions:
        self.calls.options += 1
        return self.options()

    async def ListAndWatch(
        self, request: pb.Empty,
        context: grpc.aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse],
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        self.calls.list_and_watch += 1
        queue: asyncio.Queue[dict[str, str] | None] = asyncio.Queue()
        self._updates.append(queue)
        try:
            devices: dict[str, str] | None = dict(self.devices)
            while devices is not None:
                yield pb.ListAndWatchResponse(devices=[
                    pb.Device(ID=d, health=health) for d, health in sorted(devices.items())])
                devices = await queue.get()
        finally:
            self._updates.remove(queue)

    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[pb.PreferredAllocationRequest,
                                          pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for container in request.container_requests:
            available = tuple(container.available_deviceIDs)
            self.calls.preferred.append((available, container.allocation_size))
            order = self.preferred_order or []
            ranked = [d for d in order if d in available] + [d for d in available if d not in order]
            responses.append(pb.ContainerPreferredAllocationResponse(
                deviceIDs=ranked[:container.allocation_size]))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(
        self, request: pb.AllocateRequest,
        context: grpc.aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        for container in request.container_requests:
            self.calls.allocate.append(tuple(container.devices_ids))
        if self.allocate_gate is not None:
            await self.allocate_gate.wait()
        if self.fail_allocate:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "test plugin told to fail Allocate")
        return pb.AllocateResponse(container_responses=[
            expected_response(list(c.devices_ids)) for c in request.container_requests])

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest,
        context: grpc.aio.ServicerContext[pb.PreStartContainerRequest,
                                          pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        self.calls.pre_start.append(tuple(request.devices_ids))
        if self.fail_pre_start:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "test plugin told to fail PreStart")
        return pb.PreStartContainerResponse()
