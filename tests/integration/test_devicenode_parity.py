"""The kubelet stand-ins speak to device plugins as the real kubelet does.

Why this exists: every agent test trusts a kubelet stand-in, so where the Python emulator once
differed from the kubelet's device manager (``pkg/kubelet/cm/devicemanager``) a test here pins
the kubelet's behaviour: the HTTP/2 ``:authority`` of plugin calls (the kubelet dials with
``localhost``; the emulator used to send the socket path, which tonic/h2 plugins refuse), the
plugin dialled back inside Register, admission surviving a kubelet restart that closes a
plugin channel mid-Allocate (the emulator used to stop admitting pods for good), and CDI names
resolved as a runtime does. Real parts throughout: the real control plane, real gRPC over Unix
sockets, and a device plugin on another gRPC stack (grpc-go) that checks the authority.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode_plugin import GoPlugin
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


async def test_a_grpc_go_plugin_that_checks_the_authority_registers_and_serves(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    # The plugin refuses calls whose :authority is not a plain host, as tonic/h2 plugins do;
    # the kubelet's client sends "localhost".
    plugin = GoPlugin(plugin_dir=emulator.plugin_dir, resource=new_resource(),
                      devices=["g0", "g1"])
    await plugin.start()
    try:
        assert plugin.authorities == ["localhost"]
        await wait_allocatable(kube, emulator.node_name, plugin.resource, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("go", resources={plugin.resource: "1"}))
        await wait_phase(kube, pod_namespace, "go", "Running")
        [allocation] = emulator.allocations(pod_namespace, "go")
        assert allocation.envs["GO_PLUGIN_DEVICES"] in {"g0", "g1"}
    finally:
        await plugin.stop()


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


async def test_capacity_counts_unhealthy_and_gone_devices_as_the_kubelet_does(
    emulator: NodeEmulator, kube: AsyncClient,
) -> None:
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"h0": HEALTHY, "h1": HEALTHY, "u0": "Unhealthy"})
    await plugin.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        assert await capacity(kube, emulator.node_name, plugin.resource_name) == "3"
    finally:
        await plugin.stop()
    # Gone, within the kubelet's stop grace: nothing allocatable, all three still capacity.
    await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "0")
    assert await capacity(kube, emulator.node_name, plugin.resource_name) == "3"


async def capacity(kube: AsyncClient, node: str, resource: str) -> str | None:
    found = await kube.get(Node, node)
    return (found.status.capacity or {}).get(resource) if found.status is not None else None


async def test_pre_start_comes_after_admission_and_its_failure_fails_the_container(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"p0": HEALTHY, "p1": HEALTHY}, pre_start_required=True,
                        fail_pre_start=True)
    await plugin.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        await create_pod(kube, pod_namespace,
                         pod_manifest("prestart", resources={plugin.resource_name: "1"}))
        failed = await wait_phase(kube, pod_namespace, "prestart", "Failed")
        # Admitted (Allocate answered), then the kubelet's PreStartContainer call at container
        # start failed: the container's config could not be made, not an admission error.
        assert failed.status is not None
        assert failed.status.reason == "CreateContainerConfigError"
        assert "test plugin told to fail PreStart" in (failed.status.message or "")
        assert len(plugin.calls.allocate) == 1
        assert plugin.calls.pre_start == plugin.calls.allocate
    finally:
        await plugin.stop()
