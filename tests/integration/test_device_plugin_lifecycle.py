"""The generic plugin lifecycle over real gRPC on Unix sockets.

A small kubelet stand-in (a real ``Registration`` gRPC server on ``kubelet.sock``) records what
the plugin manager registers; the tests then dial the plugin socket as the kubelet would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agent.deviceplugins.kubelet.backend import (
    ContainerAllocation,
    PluginError,
    PluginSpec,
)
from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.kubelet.manager import PluginManager
from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.metrics import AgentMetrics
from discovery_handlers.contract import DeviceSpec, Mount
from tests.harness.unix_grpc import SocketServer

DEADLINE_SECONDS = 5.0
POLL_SECONDS = 0.01


class _Registrar(pb_grpc.RegistrationServicer):
    def __init__(self) -> None:
        self.requests: list[pb.RegisterRequest] = []

    async def Register(self, request: pb.RegisterRequest, context: object) -> pb.Empty:
        self.requests.append(request)
        return pb.Empty()


class KubeletStandIn:
    """Serves Registration on ``kubelet.sock``; ``restart`` does what a kubelet restart does."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.registrar = _Registrar()
        self._grpc = SocketServer(
            plugin_dir / "kubelet.sock",
            add_services=lambda server: pb_grpc.add_RegistrationServicer_to_server(
                self.registrar, server
            ),
            stop_grace_s=None,
        )

    async def start(self) -> None:
        await self._grpc.start()

    async def stop(self) -> None:
        await self._grpc.stop()

    async def wait_registrations(self, count: int, what: str) -> None:
        """Wait until ``count`` Register calls in all have arrived."""
        await eventually(lambda: len(self.registrar.requests) == count, what)

    async def restart(self) -> None:
        """Stop, delete every socket in the plugin directory, start on a new kubelet.sock."""
        await self.stop()
        for path in self.plugin_dir.iterdir():
            path.unlink()
        await self.start()


class RecordingBackend:
    def __init__(self) -> None:
        self.pre_started: list[list[str]] = []

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        for ids in requests:
            for device_id in ids:
                if device_id.startswith("bad"):
                    raise PluginError(
                        grpc.StatusCode.INVALID_ARGUMENT, f"unknown device {device_id}"
                    )
        return [
            ContainerAllocation(
                envs={"IDS": ",".join(ids)},
                mounts=(Mount(container_path="/c", host_path="/h", read_only=True),),
                device_specs=(DeviceSpec(container_path="/dev/x", host_path="/dev/y"),),
                cdi_devices=("edgeplug.io/conf=abc123",),
            )
            for ids in requests
        ]

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        rest = [d for d in reversed(available) if d not in must_include]
        return [*must_include, *rest][:size]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        self.pre_started.append(list(device_ids))


async def eventually(check: Callable[[], bool], what: str) -> None:
    try:
        async with asyncio.timeout(DEADLINE_SECONDS):
            while not check():  # noqa: ASYNC110 - polling a condition with a deadline
                await asyncio.sleep(POLL_SECONDS)
    except TimeoutError:
        pytest.fail(f"expected within {DEADLINE_SECONDS} s: {what}")


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short path: Unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dp-") as d:
        yield Path(d)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[KubeletStandIn]:
    stand_in = KubeletStandIn(plugin_dir)
    await stand_in.start()
    yield stand_in
    await stand_in.stop()


@pytest.fixture
async def manager(plugin_dir: Path) -> AsyncIterator[tuple[PluginManager, AgentMetrics]]:
    metrics = AgentMetrics()
    mgr = PluginManager(plugin_dir=plugin_dir, metrics=metrics)
    task = asyncio.create_task(mgr.run())
    yield mgr, metrics
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _spec(
    name: str = "edgeplug.io/cam-abc123", devices: Sequence[str] = ("cam-abc123-0",)
) -> PluginSpec:
    return PluginSpec(
        resource_name=name,
        socket_name=name.replace("/", "-") + ".sock",
        backend=RecordingBackend(),
        feed=DeviceFeed(AdvertisedDevice(d) for d in devices),
        pre_start_required=True,
    )


def _stub(plugin_dir: Path, spec: PluginSpec) -> tuple[aio.Channel, pb_grpc.DevicePluginAsyncStub]:
    channel = aio.insecure_channel(f"unix://{plugin_dir / spec.socket_name}")
    return channel, pb_grpc.DevicePluginStub(channel)


async def _next(
    stream: aio.UnaryStreamCall[pb.Empty, pb.ListAndWatchResponse],
) -> pb.ListAndWatchResponse:
    message = await asyncio.wait_for(stream.read(), DEADLINE_SECONDS)
    assert isinstance(message, pb.ListAndWatchResponse), "ListAndWatch ended early"
    return message


def _registrations(metrics: AgentMetrics, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "edgeplug_kubelet_registrations_total", {"kind": kind}
    )
    return value or 0.0


async def _added(mgr: PluginManager, kubelet: KubeletStandIn, what: str) -> PluginSpec:
    """A plugin (``_spec()``) added to the manager, once its registration reached the kubelet."""
    spec = _spec()
    await mgr.add(spec)
    await kubelet.wait_registrations(1, what)
    return spec


async def test_registers_with_version_endpoint_resource_and_options(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, metrics = manager
    spec = await _added(mgr, kubelet, "one registration")
    request = kubelet.registrar.requests[0]
    assert request.version == "v1beta1"
    assert request.endpoint == spec.socket_name
    assert request.resource_name == "edgeplug.io/cam-abc123"
    assert request.options.get_preferred_allocation_available
    assert request.options.pre_start_required
    assert (plugin_dir / spec.socket_name).is_socket()
    await eventually(lambda: _registrations(metrics, "first") == 1, "first counted")


async def test_list_and_watch_sends_full_list_then_only_real_changes(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, _ = manager
    spec = _spec(devices=("s-0", "s-1"))
    await mgr.add(spec)
    channel, stub = _stub(plugin_dir, spec)
    async with channel:
        stream = stub.ListAndWatch(pb.Empty())
        first = await _next(stream)
        assert [(d.ID, d.health) for d in first.devices] == [("s-0", "Healthy"), ("s-1", "Healthy")]
        # The same list again is not news; only the unhealthy s-1 is.
        assert not spec.feed.publish([AdvertisedDevice("s-1"), AdvertisedDevice("s-0")])
        assert spec.feed.publish([AdvertisedDevice("s-0"), AdvertisedDevice("s-1", healthy=False)])
        second = await _next(stream)
        assert [(d.ID, d.health) for d in second.devices] == [
            ("s-0", "Healthy"),
            ("s-1", "Unhealthy"),
        ]
        stream.cancel()


async def test_kubelet_restart_reserves_and_reregisters_every_plugin(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, metrics = manager
    specs = [_spec(f"edgeplug.io/dev-{i}", (f"dev-{i}-0",)) for i in range(3)]
    for spec in specs:
        await mgr.add(spec)
    await kubelet.wait_registrations(3, "three first registrations")

    await kubelet.restart()  # deletes every plugin socket and makes a new kubelet.sock

    await kubelet.wait_registrations(6, "three re-registrations")
    assert {r.resource_name for r in kubelet.registrar.requests[3:]} == {
        s.resource_name for s in specs
    }
    await eventually(lambda: _registrations(metrics, "re") == 3, "three re counted")
    for spec in specs:
        channel, stub = _stub(plugin_dir, spec)
        async with channel:
            options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=DEADLINE_SECONDS)
            assert options.get_preferred_allocation_available


async def test_own_socket_deleted_is_served_again_and_reregistered(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, _ = manager
    spec = await _added(mgr, kubelet, "first registration")
    (plugin_dir / spec.socket_name).unlink()
    await kubelet.wait_registrations(2, "re-registration")
    assert (plugin_dir / spec.socket_name).is_socket()


async def test_registers_once_the_kubelet_appears(
    plugin_dir: Path, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, metrics = manager
    await mgr.add(_spec())
    late = KubeletStandIn(plugin_dir)
    await late.start()
    try:
        await eventually(
            lambda: len(late.registrar.requests) == 1, "registration with late kubelet"
        )
        await eventually(lambda: _registrations(metrics, "first") == 1, "first counted")
    finally:
        await late.stop()


class _RefusingOnce(_Registrar):
    """A kubelet that is not ready for the first registration (as while it starts up)."""

    async def Register(self, request: pb.RegisterRequest, context: object) -> pb.Empty:
        self.requests.append(request)
        if len(self.requests) == 1:
            assert isinstance(context, aio.ServicerContext)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet starting")
        return pb.Empty()


async def test_a_refused_registration_is_tried_again(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    """Nothing in the directory changes after the refusal: only the retry timer brings it."""
    mgr, metrics = manager
    kubelet.registrar = refusing = _RefusingOnce()
    await kubelet.restart()
    await mgr.add(_spec())
    await eventually(lambda: len(refusing.requests) == 2, "a second Register after the refusal")
    await eventually(lambda: _registrations(metrics, "first") == 1, "the accepted one counted")


async def test_a_recreated_plugin_directory_is_followed(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    """The directory itself deleted and made again (a remounted kubelet directory): the
    inotify watch ends with it, and the manager still serves and registers there again."""
    mgr, _ = manager
    spec = await _added(mgr, kubelet, "first registration")
    await kubelet.stop()
    shutil.rmtree(plugin_dir)
    os.mkdir(plugin_dir)
    await kubelet.start()
    await kubelet.wait_registrations(2, "registration in the re-created directory")
    assert (plugin_dir / spec.socket_name).is_socket()


async def test_allocate_answers_and_refusals_carry_status_and_resource(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, _ = manager
    spec = _spec(devices=("a-0", "a-1", "a-2"))
    await mgr.add(spec)
    channel, stub = _stub(plugin_dir, spec)
    async with channel:
        response = await stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=["a-0"])]
            ),
            timeout=DEADLINE_SECONDS,
        )
        answer = response.container_responses[0]
        assert dict(answer.envs) == {"IDS": "a-0"}
        assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
            ("/c", "/h", True)
        ]
        assert [(d.container_path, d.host_path, d.permissions) for d in answer.devices] == [
            ("/dev/x", "/dev/y", "rwm")
        ]
        assert [c.name for c in answer.cdi_devices] == ["edgeplug.io/conf=abc123"]

        with pytest.raises(aio.AioRpcError) as refused:
            await stub.Allocate(
                pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=["bad-7"])]
                ),
                timeout=DEADLINE_SECONDS,
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "bad-7" in (refused.value.details() or "")
        assert spec.resource_name in (refused.value.details() or "")

        preferred = await stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["a-0", "a-1", "a-2"],
                        must_include_deviceIDs=["a-0"],
                        allocation_size=2,
                    )
                ]
            ),
            timeout=DEADLINE_SECONDS,
        )
        assert list(preferred.container_responses[0].deviceIDs) == ["a-0", "a-2"]

        await stub.PreStartContainer(
            pb.PreStartContainerRequest(devices_ids=["a-1"]), timeout=DEADLINE_SECONDS
        )
        assert isinstance(spec.backend, RecordingBackend)
        assert spec.backend.pre_started == [["a-1"]]


async def test_remove_deletes_socket_and_ends_the_stream(
    plugin_dir: Path, kubelet: KubeletStandIn, manager: tuple[PluginManager, AgentMetrics]
) -> None:
    mgr, _ = manager
    spec = _spec()
    await mgr.add(spec)
    channel, stub = _stub(plugin_dir, spec)
    async with channel:
        stream = stub.ListAndWatch(pb.Empty())
        await asyncio.wait_for(stream.read(), DEADLINE_SECONDS)
        await mgr.remove(spec.resource_name)
        assert not (plugin_dir / spec.socket_name).exists()
        end = await asyncio.wait_for(stream.read(), DEADLINE_SECONDS)
        assert end is aio.EOF, f"stream should end, got {end!r}"  # type: ignore[attr-defined]
        # Ended by the plugin, cleanly, before the server shut down: the kubelet sees a plugin
        # that went away, not a call cut off mid-stream.
        assert await stream.code() == grpc.StatusCode.OK
    assert spec.resource_name not in mgr.resource_names
