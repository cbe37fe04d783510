"""The kubelet stand-ins speak to device plugins as the real kubelet does.

Every agent test trusts a kubelet stand-in, so where the Python emulator once
differed from the kubelet's device manager (``pkg/kubelet/cm/devicemanager``) a test here pins
the kubelet's behaviour: the HTTP/2 ``:authority`` of plugin calls (the kubelet dials with
``localhost``; the emulator used to send the socket path, which tonic/h2 plugins refuse), the
plugin dialled back inside Register, admission surviving a kubelet restart that closes a
plugin channel mid-Allocate (the emulator used to stop admitting pods for good), and CDI names
resolved as a runtime does. Each test runs against both stand-ins, the Python emulator and the
kubelet's device manager (``DeviceNode``), so the two cannot drift apart (set-up in
tests/harness/stand_ins.py). Real parts throughout: the real control plane, real gRPC over Unix
sockets, and a device plugin on another gRPC stack (grpc-go) that checks the authority.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import grpc.aio
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod

from tests.harness.controlplane import ControlPlane
from tests.harness.devicenode_plugin import GoPlugin
from tests.harness.kube_waits import wait_allocatable
from tests.harness.node_emulator import ADMISSION_ERROR, KUBELET_ENV, NodeEmulator
from tests.harness.stand_ins import HEALTHY, NodeDirs, new_resource, node_dirs, running_node
from tests.harness.testplugin import CDI_KIND, TestPlugin, write_cdi_spec
from tests.integration.test_node_emulator import (
    create_pod,
    fail_pod,
    pod_manifest,
    run_pod,
    wait_phase,
)

pytestmark = pytest.mark.timeout(180)

#: Generous deadline for a shared 2-core machine; never a pass/fail timing.
WAIT_S = 60.0


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with node_dirs() as made:
        yield made


@pytest.fixture(params=["emulator", pytest.param("devicenode", marks=pytest.mark.slow)])
async def emulator(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                   control_plane: ControlPlane, dirs: NodeDirs) -> AsyncIterator[NodeEmulator]:
    """Each test runs on both stand-ins: the Python emulator and the kubelet's device manager
    (``EDGEPLUG_KUBELET`` picks which one ``NodeEmulator(...)`` is)."""
    monkeypatch.setenv(KUBELET_ENV, request.param)
    async with running_node(NodeEmulator, control_plane.kubeconfig, dirs) as node:
        yield node


async def test_a_grpc_go_plugin_that_checks_the_authority_registers_and_serves(
    emulator: NodeEmulator, kube: AsyncClient, pod_namespace: str,
) -> None:
    # The plugin refuses calls whose :authority is not a plain host, as tonic/h2 plugins do;
    # the kubelet's client sends "localhost" (its grpc.WithAuthority).
    plugin = GoPlugin(plugin_dir=emulator.plugin_dir, resource=new_resource("go"),
                      devices=["g0", "g1"])
    await plugin.start()
    try:
        assert plugin.authorities == ["localhost"]
        await wait_allocatable(kube, emulator.node_name, plugin.resource, "2")
        assert [r.resource_name for r in emulator.registrations] == [plugin.resource]
        await run_pod(kube, pod_namespace, "go", {plugin.resource: "2"})
        [allocation] = emulator.allocations(pod_namespace, "go")
        assert sorted(allocation.device_ids) == ["g0", "g1"]
        assert set(allocation.envs["GO_PLUGIN_DEVICES"].split(",")) == {"g0", "g1"}
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
    emulator: NodeEmulator, dirs: NodeDirs, kube: AsyncClient, pod_namespace: str,
) -> None:
    gate = asyncio.Event()
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"s0": HEALTHY, "s1": HEALTHY}, allocate_gate=gate)
    write_cdi_spec(dirs.cdi_dir, ["s0", "s1"])
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
        running: Pod = await run_pod(kube, pod_namespace, "after", {plugin.resource_name: "1"})
        assert running.spec is not None
        assert running.spec.nodeName == emulator.node_name
        assert emulator.pod_admitted(pod_namespace, "after")
    finally:
        gate.set()
        await plugin.stop()


async def test_cdi_names_are_resolved_as_a_runtime_does_or_the_pod_fails(
    emulator: NodeEmulator, dirs: NodeDirs, kube: AsyncClient, pod_namespace: str,
) -> None:
    plugin = TestPlugin(plugin_dir=emulator.plugin_dir, resource_name=new_resource(),
                        devices={"c0": HEALTHY, "c1": HEALTHY})
    spec = write_cdi_spec(dirs.cdi_dir, ["c0", "c1"])
    await plugin.start()
    try:
        await wait_allocatable(kube, emulator.node_name, plugin.resource_name, "2")
        await run_pod(kube, pod_namespace, "resolved", {plugin.resource_name: "1"})
        [allocation] = emulator.allocations(pod_namespace, "resolved")
        [device] = allocation.device_ids
        assert allocation.cdi_devices == (f"{CDI_KIND}={device}",)
        assert allocation.cdi_edits is not None
        assert allocation.cdi_edits.env["CDI_DEVICE"] == device
        assert [n.path for n in allocation.cdi_edits.device_nodes] == ["/dev/null"]

        spec.unlink()  # the runtime can no longer resolve the plugin's names
        await fail_pod(kube, pod_namespace, "unresolved", {plugin.resource_name: "1"},
                       reason="CreateContainerError", says="unresolvable CDI devices")
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
    assert not emulator.plugin_connected(plugin.resource_name)


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
        # Admitted (Allocate answered), then the kubelet's PreStartContainer call at container
        # start failed: the container's config could not be made, not an admission error.
        await fail_pod(kube, pod_namespace, "prestart", {plugin.resource_name: "1"},
                       reason="CreateContainerConfigError",
                       says="test plugin told to fail PreStart")
        assert len(plugin.calls.allocate) == 1
        assert plugin.calls.pre_start == plugin.calls.allocate
    finally:
        await plugin.stop()
