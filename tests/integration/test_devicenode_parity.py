"""The kubelet stand-ins speak to device plugins as the real kubelet does.

Why this exists: every agent test trusts a kubelet stand-in, so where the Python emulator once
differed from the kubelet's device manager (``pkg/kubelet/cm/devicemanager``) a test here pins
the kubelet's behaviour: the HTTP/2 ``:authority`` of plugin calls (the kubelet dials with
``localhost``; the emulator used to send the socket path, which tonic/h2 plugins refuse), and
admission surviving a kubelet restart that closes a plugin channel mid-Allocate (the emulator
used to stop admitting pods for good). Real parts throughout: the real control plane, real
gRPC over Unix sockets, and a plugin whose HTTP/2 layer is the ``h2`` library, so the test
sees the exact header frame the kubelet sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import h2.config
import h2.connection
import h2.events
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_allocatable
from tests.harness.node_emulator import ADMISSION_ERROR, NodeEmulator, PythonNodeEmulator
from tests.harness.testplugin import CDI_KIND, TestPlugin, write_cdi_spec
from tests.integration.test_node_emulator import create_pod, pod_manifest, wait_phase

pytestmark = pytest.mark.timeout(180)

HEALTHY = "Healthy"
#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
WAIT_S = 60.0


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short paths: a Unix socket path must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="ep-pa-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def emulator(control_plane: ControlPlane, plugin_dir: Path) -> AsyncIterator[NodeEmulator]:
    # CDI specs live beside the plugin sockets here; the runtime reads only its spec files.
    node = PythonNodeEmulator(node_name=f"emu-{uuid.uuid4().hex[:8]}",
                        kubeconfig=control_plane.kubeconfig, plugin_dir=plugin_dir,
                        cdi_spec_dirs=[plugin_dir])
    await node.start()
    yield node
    await node.stop(delete_node=True)


def new_resource() -> str:
    return f"test.edgeplug.io/dev-{uuid.uuid4().hex[:8]}"


class AuthorityProbe:
    """A plugin socket whose HTTP/2 server (h2) records the headers of the first request.

    It answers nothing, so the registration that made the kubelet dial it fails; what matters
    is the request the kubelet sent."""

    def __init__(self) -> None:
        self.headers: asyncio.Future[dict[bytes, bytes]] = (
            asyncio.get_running_loop().create_future())

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        connection.initiate_connection()
        writer.write(connection.data_to_send())
        try:
            while data := await reader.read(65535):
                for event in connection.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived) and not self.headers.done():
                        self.headers.set_result(dict(event.headers or []))
                writer.write(connection.data_to_send())
                await writer.drain()
        finally:
            writer.close()


async def test_plugin_calls_carry_the_kubelets_authority(emulator: NodeEmulator) -> None:
    probe = AuthorityProbe()
    socket_name = "probe.sock"
    server = await asyncio.start_unix_server(probe.handle,
                                             path=str(emulator.plugin_dir / socket_name))
    try:
        registrant = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                                socket_name=socket_name, devices={})
        with contextlib.suppress(grpc.aio.AioRpcError):
            await registrant.register()  # refused: the probe never answers
        headers = await asyncio.wait_for(probe.headers, WAIT_S)
    finally:
        server.close()
        await server.wait_closed()
    # The kubelet's plugin client: grpc.WithAuthority("localhost"), and options come first.
    assert headers[b":authority"] == b"localhost"
    assert headers[b":path"] == b"/v1beta1.DevicePlugin/GetDevicePluginOptions"
    assert emulator.registrations == []


async def test_a_plugin_that_is_not_serving_cannot_register(emulator: NodeEmulator) -> None:
    # The kubelet dials the plugin back before it answers Register.
    early = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                       devices={"e0": HEALTHY})
    with pytest.raises(grpc.aio.AioRpcError):
        await early.register()
    assert emulator.registrations == []
    await early.start()  # serving first, as a plugin must
    try:
        assert [r.resource_name for r in emulator.registrations] == [early.resource_name]
        assert early.calls.options == 1  # fetched inside Register, before it returned
    finally:
        await early.stop()


async def test_admission_survives_a_kubelet_restart_during_allocate(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    gate = asyncio.Event()
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"s0": HEALTHY, "s1": HEALTHY}, allocate_gate=gate)
    write_cdi_spec(emulator.plugin_dir, ["s0", "s1"])
    await plugin.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("caught", resources={plugin.resource_name: "1"}))
        await emulator.wait_for(lambda: len(plugin.calls.allocate) == 1, timeout=WAIT_S,
                                what="the first Allocate to reach the plugin")

        await emulator.restart_kubelet()  # closes the plugin channel under that Allocate

        # The kubelet reports the interrupted admission as it reports any failed Allocate...
        failed = await wait_phase(kube, pod_namespace, "caught", "Failed")
        assert failed.status is not None
        assert failed.status.reason == ADMISSION_ERROR
        # ...and goes on admitting pods once the plugin is back.
        gate.set()
        await plugin.stop()
        await plugin.start()
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("after", resources={plugin.resource_name: "1"}))
        running: Pod = await wait_phase(kube, pod_namespace, "after", "Running")
        assert running.spec is not None
        assert running.spec.nodeName == emulator.node_name
        assert emulator.pod_admitted(pod_namespace, "after")
    finally:
        gate.set()
        await plugin.stop()


async def test_cdi_names_are_resolved_as_a_runtime_does_or_the_pod_fails(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"c0": HEALTHY, "c1": HEALTHY})
    spec = write_cdi_spec(emulator.plugin_dir, ["c0", "c1"])
    await plugin.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("resolved", resources={plugin.resource_name: "1"}))
        await wait_phase(kube, pod_namespace, "resolved", "Running")
        [allocation] = emulator.allocations(pod_namespace, "resolved")
        [device] = allocation.device_ids
        assert allocation.cdi_devices == (f"{CDI_KIND}={device}",)
        assert allocation.cdi_edits is not None
        assert allocation.cdi_edits.env["CDI_DEVICE"] == device
        assert [n.path for n in allocation.cdi_edits.device_nodes] == ["/dev/null"]

        spec.unlink()  # the runtime can no longer resolve the plugin's names
        await create_pod(kube, pod_namespace,
                         pod_manifest("unresolved", resources={plugin.resource_name: "1"}))
        failed = await wait_phase(kube, pod_namespace, "unresolved", "Failed")
        assert failed.status is not None
        assert failed.status.reason == "CreateContainerError"
        assert "unresolvable CDI devices" in (failed.status.message or "")
        assert not emulator.pod_admitted(pod_namespace, "unresolved")
    finally:
        await plugin.stop()
