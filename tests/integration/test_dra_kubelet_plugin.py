"""The agent's DRA kubelet plugin, called over its Unix sockets as the kubelet calls it.

The gRPC client here stands for the kubelet's plugin watcher (GetInfo and
NotifyRegistrationStatus on the socket in ``plugins_registry``) and the kubelet's DRA manager
(NodePrepareResources / NodeUnprepareResources, and the health stream NodeWatchResources, on
the registered endpoint), speaking the kubelet's own ``dra/v1``, ``dra-health`` and
``pluginregistration/v1`` wire API; tests/e2e/test_realnode_dra.py has the real kubelet. The
claims are real: made by the kube-controller-manager from a template and allocated by the
kube-scheduler from the agent's ResourceSlices. The CDI specs are checked and resolved by the
CDI project's Go module (``tests.harness.cdi``), as containerd would.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc.aio
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from prometheus_client import start_http_server

from agent.discovery.node_devices import NodeDeviceTable
from agent.dra import claims as cl
from agent.dra import slices
from agent.dra.plugin import ClaimPreparer, DraKubeletPlugin
from agent.kube.client import as_dict
from agent.kube.node_reads import NodeReads
from agent.kubeletapi import dra_health_v1_pb2 as health_v1
from agent.kubeletapi import dra_health_v1_pb2_grpc as health_v1_grpc
from agent.kubeletapi import dra_health_v1alpha1_pb2 as health_v1alpha1
from agent.kubeletapi import dra_health_v1alpha1_pb2_grpc as health_v1alpha1_grpc
from agent.kubeletapi import dra_v1_pb2 as pb
from agent.kubeletapi import dra_v1_pb2_grpc as pb_grpc
from agent.kubeletapi import pluginregistration_v1_pb2 as reg_pb
from agent.kubeletapi import pluginregistration_v1_pb2_grpc as reg_grpc
from agent.metrics import AgentMetrics
from agent.settings import current
from crds import dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import cdi
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.metrics_scrape import scrape


@contextlib.asynccontextmanager
async def plugin_running(preparer: ClaimPreparer, tmp: Path, metrics: AgentMetrics | None = None
                         ) -> AsyncIterator[DraKubeletPlugin]:
    plugin = DraKubeletPlugin(preparer=preparer, plugins_dir=tmp / "plugins",
                              registry_dir=tmp / "plugins_registry", metrics=metrics)
    task = asyncio.create_task(plugin.run())
    try:
        await harness.eventually(lambda: _exists(plugin.registration_socket),
                                 what="the registration socket")
        yield plugin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


@contextlib.contextmanager
def metrics_served(metrics: AgentMetrics) -> Iterator[int]:
    """The agent's registry on ``/metrics`` (what ``METRICS_PORT`` serves), on loopback."""
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    try:
        yield port
    finally:
        server.shutdown()
        thread.join()




async def test_prepare_writes_a_cdi_spec_per_claim_idempotently_across_restarts(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    ns = pod_namespace
    node = harness.new_node(control_plane)
    cdi_dir = tmp_path / "cdi"
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "echo", descriptions=["lamp", "fan"], shared=False, broker_properties={"ROOM": "7"}))
    lamp = instance_name("echo", "lamp", shared=False, node=node)
    async with (h.ready_nodes(kube, [node]), h.device_classes(kube, ns),
                h.dra_agents(control_plane, [node], ns) as agents):
        devices = agents[node].agent.devices
        metrics = agents[node].agent.metrics
        preparer = ClaimPreparer(reads=NodeReads(kube), node_name=node, devices=devices,
                                 cdi_dir=cdi_dir, state_dir=tmp_path / "plugins" / dra.DRIVER)
        cel = f'device.attributes["{dra.DRIVER}"].description == "lamp"'
        await harness.eventually(lambda: h.device_class(kube, ns, "echo"), what="class")
        h.apply(control_plane, ns,
                h.claim_template("lamp", dra.device_class_name(ns, "echo"), cel),
                h.claim_pod("user", "lamp"))
        claim = await h.allocated_claim(kube, ns, "user")

        async with plugin_running(preparer, tmp_path, metrics) as plugin:
            # The plugin watcher's side: what the driver says about itself.
            async with grpc.aio.insecure_channel(f"unix:{plugin.registration_socket}") as ch:
                registration = reg_grpc.RegistrationStub(ch)
                info = await registration.GetInfo(reg_pb.InfoRequest())
                assert (info.type, info.name, list(info.supported_versions)) == (
                    "DRAPlugin", "edgeplug.io",
                    ["v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"])
                assert info.endpoint == str(plugin.service_socket)
                await registration.NotifyRegistrationStatus(
                    reg_pb.RegistrationStatus(plugin_registered=True))
                assert plugin.registration.registered.is_set()

            # The DRA manager's side: prepare the claim, plus one that does not exist.
            ghost = pb.Claim(namespace=ns, name="ghost", uid="00000000-0000-0000-0000-0")
            async with grpc.aio.insecure_channel(f"unix:{info.endpoint}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)
                answer = await stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=[claim, ghost]))
                assert "cannot read claim" in answer.claims[ghost.uid].error
                mine = answer.claims[claim.uid]
                assert mine.error == ""
                (device,) = mine.devices
                assert (device.device_name, list(device.request_names)) == (lamp, ["dev"])
                ids = list(device.cdi_device_ids)
                assert ids == [cl.cdi_id(claim.uid, 0)]
                again = await stub.NodePrepareResources(
                    pb.NodePrepareResourcesRequest(claims=[claim]))
                assert again.claims[claim.uid] == mine

        # Each claim's prepare is timed on the agent's /metrics: two answered (the second
        # from the record), one failed (the ghost).
        with metrics_served(metrics) as port:
            seen = await asyncio.to_thread(scrape, port)
        name = "edgeplug_dra_prepare_duration_seconds"
        assert seen[f'{name}_count{{outcome="ok"}}'] == 2
        assert seen[f'{name}_count{{outcome="failed"}}'] == 1
        assert 0 < seen[f'{name}_sum{{outcome="ok"}}'] < 10

        names, errors = cdi.validate([cdi_dir])
        assert errors == {}
        assert names == ids
        edits = cdi.resolve([cdi_dir], ids)
        suffix = lamp.rpartition("-")[2].upper()
        assert edits.env == {"DEBUG_ECHO_DESCRIPTION": "lamp", f"DEBUG_ECHO_DESCRIPTION_{suffix}":
                             "lamp", "ROOM": "7", f"ROOM_{suffix}": "7"}

        # A reboot: the CDI directory (a tmpfs) emptied, the record on disk kept, the agent
        # started again with an empty device table. The spec is back, the same, before the
        # plugin registers; gone again, the kubelet's prepare writes it again; the record
        # answers, and the runtime resolves the same edits; unprepare cleans.
        spec = cl.claim_spec_path(cdi_dir, claim.uid)
        written = spec.read_text()
        shutil.rmtree(cdi_dir)
        restarted = ClaimPreparer(reads=NodeReads(kube), node_name=node,
                                  devices=NodeDeviceTable(), cdi_dir=cdi_dir,
                                  state_dir=tmp_path / "plugins" / dra.DRIVER)
        async with (plugin_running(restarted, tmp_path) as plugin,
                    grpc.aio.insecure_channel(f"unix:{plugin.service_socket}") as channel):
            assert spec.read_text() == written, "written again before registering"
            spec.unlink()
            stub = pb_grpc.DRAPluginStub(channel)
            after = await stub.NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[claim]))
            assert after.claims[claim.uid] == mine
            assert spec.read_text() == written, "the kubelet is told only what is on disk"
            assert cdi.resolve([cdi_dir], ids) == edits
            for _ in range(2):  # the second time: already unprepared, still no error
                gone = await stub.NodeUnprepareResources(
                    pb.NodeUnprepareResourcesRequest(claims=[claim]))
                assert gone.claims[claim.uid].error == ""
            assert not cl.claim_spec_path(cdi_dir, claim.uid).exists()
            assert restarted.checkpoint.claims == {}
        assert cl.Checkpoint(tmp_path / "plugins" / dra.DRIVER / "claims.json").claims == {}


async def test_a_claim_from_the_controllers_shared_pool_is_prepared_on_the_chosen_node(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """A shared device two nodes see: its slice is the controller's (no node's), the scheduler
    allocates a claim from it and binds the pod to one of them, and that node's agent prepares
    the claim: the container's env from the claim's CDI spec."""
    ns = pod_namespace
    nodes = sorted([harness.new_node(control_plane), harness.new_node(control_plane)])
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "cams", descriptions=["cam"], shared=True, capacity=2, broker_properties={"ROOM": "9"}))
    cam = instance_name("cams", "cam", shared=True, node=nodes[0])
    pool = slices.shared_pool(ns, "cams", cam)
    async with (h.ready_nodes(kube, nodes), h.device_classes(kube, ns),
                h.dra_agents(control_plane, nodes, ns) as agents):
        async def published() -> list[dict[str, Any]] | None:
            found = await h.pool_slices(kube, pool)
            return found if len(found) == 1 and h.device_nodes(
                found, slices.device_name(cam)) == nodes else None

        (body,) = await harness.eventually(published, what=f"{pool} for both nodes")
        assert body["metadata"]["labels"][dra.LABEL_MANAGED_BY] == "edgeplug-controller"
        await harness.eventually(lambda: h.device_class(kube, ns, "cams"), what="class")
        h.apply(control_plane, ns, h.claim_template("cam", dra.device_class_name(ns, "cams")),
                h.claim_pod("user", "cam"))
        claim = await h.allocated_claim(kube, ns, "user")
        chosen = str(as_dict(await kube.get(Pod, "user", namespace=ns))["spec"]["nodeName"])
        assert chosen in nodes
        cdi_dir = tmp_path / "cdi"
        preparer = ClaimPreparer(reads=NodeReads(kube), node_name=chosen,
                                 devices=agents[chosen].agent.devices, cdi_dir=cdi_dir,
                                 state_dir=tmp_path / "plugins" / dra.DRIVER)
        async with (plugin_running(preparer, tmp_path) as plugin,
                    grpc.aio.insecure_channel(f"unix:{plugin.service_socket}") as channel):
            answer = await pb_grpc.DRAPluginStub(channel).NodePrepareResources(
                pb.NodePrepareResourcesRequest(claims=[claim]))
        prepared = answer.claims[claim.uid]
        assert prepared.error == ""
        (device,) = prepared.devices
        assert (device.pool_name, device.device_name) == (pool, cam)
        edits = cdi.resolve([cdi_dir], list(device.cdi_device_ids))
        assert edits.env["DEBUG_ECHO_DESCRIPTION"] == "cam"
        assert edits.env["ROOM"] == "9"


async def test_the_health_stream_follows_a_device_through_failure_and_recovery(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    """Both health APIs on the plugin's endpoint: the served device Healthy at once, Unhealthy
    with its reason when the agent finds it gone (a shared device keeps its Instance,
    unhealthy, for its grace period), Healthy again when it is back; each change is sent
    without the client asking again."""
    ns = pod_namespace
    node = harness.new_node(control_plane)
    offline = tmp_path / "offline"
    harness.apply(control_plane, ns, harness.debug_echo_configuration(
        "echo", descriptions=["lamp"], shared=True, availability_file=offline, grace=600))
    lamp = instance_name("echo", "lamp", shared=True, node=node)
    key = (slices.shared_pool(ns, "echo", lamp), lamp)
    async with (h.ready_nodes(kube, [node]), h.dra_agents(control_plane, [node], ns) as agents):
        devices = agents[node].agent.devices
        await harness.eventually(lambda: _served(devices, ns, lamp), what="the lamp served")
        preparer = ClaimPreparer(reads=NodeReads(kube), node_name=node, devices=devices,
                                 cdi_dir=tmp_path / "cdi", state_dir=tmp_path / "state")
        async with (plugin_running(preparer, tmp_path) as plugin,
                    grpc.aio.insecure_channel(f"unix:{plugin.service_socket}") as channel):
            v1 = health_v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1.NodeWatchResourcesRequest())
            alpha = health_v1alpha1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                health_v1alpha1.NodeWatchResourcesRequest())

            async def both() -> list[dict[tuple[str, str], tuple[int, str, int]]]:
                async with asyncio.timeout(30):
                    new, old = await v1.read(), await alpha.read()
                assert isinstance(new, health_v1.NodeWatchResourcesResponse)
                assert isinstance(old, health_v1alpha1.NodeWatchResourcesResponse)
                return [{(d.device.pool_name, d.device.device_name):
                         (d.health, d.message, d.health_check_timeout_seconds)
                         for d in a.devices} for a in (new, old)]

            timeout = current().dra.health_timeout_s
            assert await both() == [{key: (1, "", timeout)}] * 2, "Healthy at once"
            offline.write_text("lamp\n")
            gone = await both()
            assert [a[key][0] for a in gone] == [2, 2], "Unhealthy"
            assert all(a[key][1] for a in gone), "with the agent's reason"
            offline.write_text("")
            assert await both() == [{key: (1, "", timeout)}] * 2, "Healthy again"
            v1.cancel()
            alpha.cancel()


async def _served(devices: NodeDeviceTable, ns: str, instance: str) -> bool:
    device = devices.get(ns, instance)
    return device is not None and device.healthy
