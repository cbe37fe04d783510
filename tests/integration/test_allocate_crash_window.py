"""The Allocate fast path across an agent crash: a slot answered but not yet recorded.

An Instance plugin answers ``Allocate`` for a slot free and reserved for its node at once and
records it in ``deviceUsage`` right after (``agent.deviceplugins.slots.rules`` says why that is
safe). Here the agent (``python -m agent.main``, a real subprocess) reaches the real API server
through a TCP relay of the test's own that can be cut: with the relay cut, the agent answers the
emulated kubelet's Allocate (no API call needed) but cannot record it; it is then SIGKILLed in
exactly that window, and started again. The restarted agent must record the slot for the pod that
has it (the emulator's pod-resources lists it), and hand it to no other pod: a second pod asking
for the Configuration's resource, which the agent maps onto any free slot, stays Pending.

The same must hold when the Instance reaches the restarted agent only after its first pass
(its watch event late, or this node listed in it later): the slot is recorded before any
plugin serves the Instance. That case runs the device-plugin side in-process
(``serve_device_plugins``, restarted on the same kubelet) so the order is the test's to set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient
from lightkube.types import PatchType

from agent.deviceplugins.slots.service import socket_name
from agent.kube.client import InstanceResource
from agent.kube.node_instances import LABEL_VALUE, serves_label
from crds.naming import instance_name, instance_resource_name, slot_id
from tests.harness import agent_process as harness
from tests.harness.agent_nodes import StartNode, create_instance, node_device, read_instance
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import running, unschedulable, wait_pod, wait_until
from tests.harness.node_emulator import NodeEmulator
from tests.integration.test_device_plugin_service import create_pod, run_pod

pytestmark = pytest.mark.timeout(180)

#: Bytes read per relay step.
CHUNK = 65536


class ApiRelay:
    """A TCP relay to the API server on loopback; ``cut`` drops every byte from then on (both
    ways, so requests in flight never arrive) and refuses new connections."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server: asyncio.Server | None = None
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        self._cut = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self._target)
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer),
                             return_exceptions=True)
        for w in (writer, up_writer):
            w.close()
            self._writers.discard(w)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK):
            if not self._cut:
                writer.write(data)
                await writer.drain()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()


def _api_address(plane: ControlPlane) -> tuple[str, int]:
    config: dict[str, Any] = yaml.safe_load(plane.kubeconfig.read_text())
    host, _, port = config["clusters"][0]["cluster"]["server"].removeprefix(
        "https://").rpartition(":")
    return host, int(port)


def _relayed_kubeconfig(plane: ControlPlane, port: int, path: Path) -> Path:
    """A copy of the control plane's kubeconfig whose server is the relay."""
    config: dict[str, Any] = yaml.safe_load(plane.kubeconfig.read_text())
    host, _ = _api_address(plane)
    config["clusters"][0]["cluster"]["server"] = f"https://{host}:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


async def _usage(client: AsyncClient, namespace: str, name: str) -> dict[str, str]:
    found = await harness.instances(client, namespace)
    spec: dict[str, Any] = found.get(name, {}).get("spec", {})
    return dict(spec.get("deviceUsage") or {})


async def test_agent_killed_between_answer_and_record_keeps_the_slot_for_its_pod(
    control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    node = f"crash-{uuid.uuid4().hex[:6]}"
    plugin_dir = Path(tempfile.mkdtemp(prefix="ep-cw-", dir="/tmp"))  # short socket paths
    pod_resources = plugin_dir.parent / f"{plugin_dir.name}-pr.sock"
    emulator = NodeEmulator(node_name=node, kubeconfig=control_plane.kubeconfig,
                            plugin_dir=plugin_dir, pod_resources_socket=pod_resources)
    config = harness.debug_echo_configuration("crashcfg", descriptions=["dev0"], capacity=1)
    instance = instance_name("crashcfg", "dev0", shared=True, node=node)
    resource = instance_resource_name(instance)
    slot = slot_id(instance, 0)
    client = harness.api_client(control_plane)
    log = tmp_path / "agent.log"
    relay = ApiRelay(*_api_address(control_plane))
    kubeconfig = _relayed_kubeconfig(control_plane, await relay.start(),
                                     tmp_path / "relayed.kubeconfig")
    env = {"POD_RESOURCES_SOCKET": str(pod_resources), "KUBECONFIG": str(kubeconfig)}
    agent = harness.AgentSubprocess(control_plane, node_name=node, namespace=namespace,
                                    serve_device_plugins=True, plugin_dir=plugin_dir,
                                    log_path=log, extra_env=env)
    await emulator.start()
    try:
        harness.apply(control_plane, namespace, config)
        agent.start()

        async def served() -> bool:
            return bool(emulator.healthy_device_ids(resource)) and bool(
                emulator.healthy_device_ids("edgeplug.io/crashcfg"))

        await wait_until(served, what=f"{resource} and the configuration resource advertised "
                                      f"healthy (log: {log})")
        relay.cut()  # from here the agent can answer the kubelet but not write to the API
        await create_pod(client, namespace, "holder", {resource: "1"}, node=node)
        await wait_pod(client, namespace, "holder", running, "Running with the slot")
        assert [a.devices for a in emulator.allocations(namespace, "holder")] != []
        # The crash window is real: the pod runs on the slot, the API does not record it.
        assert (await _usage(client, namespace, instance)).get(slot) == ""
        agent.kill()

        agent = harness.AgentSubprocess(control_plane, node_name=node, namespace=namespace,
                                        serve_device_plugins=True, plugin_dir=plugin_dir,
                                        log_path=log,
                                        extra_env={"POD_RESOURCES_SOCKET": str(pod_resources)})
        agent.start()

        async def recorded() -> bool:
            return (await _usage(client, namespace, instance)).get(slot) == node

        await wait_until(recorded, what=f"{slot} recorded for {node} after the restart "
                                        f"(log: {log})")
        # Nobody else gets it: a pod for the Configuration's resource (mapped by the agent
        # onto any free slot) stays Pending, and the slot stays the holder's.
        await create_pod(client, namespace, "other", {"edgeplug.io/crashcfg": "1"}, node=node)
        await wait_pod(client, namespace, "other", unschedulable, "Unschedulable")
        assert (await _usage(client, namespace, instance)) == {slot: node}
        assert emulator.pod_admitted(namespace, "holder")
        assert not emulator.pod_admitted(namespace, "other")
    finally:
        agent.stop()
        await relay.stop()
        await emulator.stop(delete_node=True)
        await client.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pod_resources)
        shutil.rmtree(plugin_dir, ignore_errors=True)


async def test_an_instance_served_only_after_the_first_pass_gets_its_unrecorded_slot_recorded(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode
) -> None:
    ns, tag = pod_namespace, uuid.uuid4().hex[:6]
    late_config, early_config = f"late{tag}", f"early{tag}"
    node = await start_node()
    late = await create_instance(kube, ns, configuration=late_config, digest="c3c3c3",
                                 nodes=[node.name], capacity=1)
    early = await create_instance(kube, ns, configuration=early_config, digest="d4d4d4",
                                  nodes=[node.name], capacity=1)
    await node.table.put(node_device(ns, late_config, late))
    await node.table.put(node_device(ns, early_config, early))
    await run_pod(kube, ns, "holder", {f"edgeplug.io/{late}": "1"})
    [allocation] = node.emulator.allocations(ns, "holder")
    [slot] = allocation.device_ids

    async def recorded() -> bool:
        return (await read_instance(kube, ns, late)).spec.device_usage.get(slot) == node.name

    await wait_until(recorded, what=f"{slot} recorded for {node.name}")

    # The agent goes. Meanwhile the record is lost, as a crash between answering Allocate and
    # recording leaves it, and the Instance does not list this node yet.
    await node.stop_service()
    early_socket = node.emulator.plugin_dir / socket_name(f"edgeplug.io/{early}")
    assert not early_socket.exists(), "a stopped agent leaves no plugin socket"
    await kube.patch(InstanceResource, late, {"spec": {"deviceUsage": {slot: ""}, "nodes": []}},
                     namespace=ns, patch_type=PatchType.MERGE)

    await node.restart_service()

    async def early_served() -> bool:
        return early_socket.exists()

    await wait_until(early_served, what=f"{early} served again: the first pass ran")
    # Listed again as the publisher's apply lists a node: with its label
    # (agent.kube.node_instances).
    await kube.patch(InstanceResource, late, {
        "metadata": {"labels": {serves_label(node.name): LABEL_VALUE}},
        "spec": {"nodes": [node.name]}}, namespace=ns, patch_type=PatchType.MERGE)
    await wait_until(recorded, what=f"{slot}, which holder still has (pod-resources lists it), "
                                    f"recorded again once {late} lists {node.name}")
    # Nobody else gets it: a pod for the Configuration's resource stays Pending.
    await create_pod(kube, ns, "other", {f"edgeplug.io/{late_config}": "1"}, node=node.name)
    await wait_pod(kube, ns, "other", unschedulable, "Unschedulable")
    assert (await read_instance(kube, ns, late)).spec.device_usage == {slot: node.name}
