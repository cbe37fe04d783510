"""Faults the agent must ride out, each tried for real: the API server stopped under it, the API
server down when it starts, the kubelet restarting under open ListAndWatch streams.

Outage tests run on a control plane of their own (stopping the shared one would disturb other
tests); the real kube-apiserver process is stopped and started again.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient

from agent.discovery import instance_publisher
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness.agent_nodes import StartNode, create_instance, node_device
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_allocatable

NAMESPACE = "default"
KUBELET_RESTARTS = 5


@pytest.fixture
def own_control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        yield plane


async def test_device_gone_during_an_api_outage_is_removed_once_the_server_returns(
    own_control_plane: ControlPlane, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cp = own_control_plane
    caplog.set_level(logging.WARNING, logger=instance_publisher.__name__)
    node = harness.new_node(cp)
    offline = tmp_path / "offline"
    harness.apply(cp, NAMESPACE, harness.debug_echo_configuration(
        "cams", descriptions=["cam0", "cam1"], shared=True, availability_file=offline, grace=1,
    ))
    client = harness.api_client(cp)
    gone = instance_name("cams", "cam1", shared=True, node=node)
    kept = instance_name("cams", "cam0", shared=True, node=node)
    try:
        async with harness.agent_in_process(cp, node_name=node, namespace=NAMESPACE):
            async def both() -> bool:
                return {gone, kept} <= set(await harness.instances(client, NAMESPACE))

            await harness.eventually(both, what="both Instances")

            flags = await asyncio.to_thread(cp.stop_server, "kube-apiserver")
            offline.write_text("cam1\n")  # unplugged while the API server is away

            async def leave_failed() -> bool:
                return any("could not leave Instance" in r.getMessage() and gone in r.getMessage()
                           for r in caplog.records)

            await harness.eventually(leave_failed, what="the leave after grace to meet the outage")
            await asyncio.to_thread(cp.start_server, "kube-apiserver", flags)

            async def removed() -> bool:
                names = set(await harness.instances(client, NAMESPACE))
                return gone not in names and kept in names

            await harness.eventually(removed, what=f"{gone} removed after the outage")
    finally:
        await client.close()


async def test_agent_started_while_the_api_server_is_down_waits_and_then_serves(
    own_control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = own_control_plane
    node = harness.new_node(cp)
    log_path = tmp_path / "agent.log"
    flags = await asyncio.to_thread(cp.stop_server, "kube-apiserver")
    agent = harness.AgentSubprocess(cp, node_name=node, namespace=NAMESPACE, log_path=log_path)
    agent.start()
    client = harness.api_client(cp)
    try:
        async def retrying() -> bool:
            assert agent.process is not None
            assert agent.process.poll() is None, log_path.read_text()
            return "starting:" in log_path.read_text() and "retrying" in log_path.read_text()

        await harness.eventually(retrying, what="the agent retrying its start")
        await asyncio.to_thread(cp.start_server, "kube-apiserver", flags)
        harness.apply(cp, NAMESPACE, harness.debug_echo_configuration(
            "late", descriptions=["d0"], shared=True))
        name = instance_name("late", "d0", shared=True, node=node)

        async def published() -> bool:
            return name in await harness.instances(client, NAMESPACE)

        await harness.eventually(published, what=f"{name} published after the outage",
                                 deadline=40.0)
        assert "Traceback" not in log_path.read_text()
    finally:
        agent.stop()
        await client.close()


async def test_kubelet_restarts_under_open_streams_log_no_error(
    kube: AsyncClient, pod_namespace: str, start_node: StartNode,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    node = await start_node()
    name = await create_instance(kube, ns, configuration=configuration, digest="d4d4d4",
                                 nodes=[node.name], capacity=2)
    await node.table.put(node_device(ns, configuration, name))
    resource = f"edgeplug.io/{name}"
    await wait_allocatable(kube, node.name, resource, "2")
    for _ in range(KUBELET_RESTARTS):
        before = len(node.emulator.registrations)
        await node.emulator.restart_kubelet()
        await node.emulator.wait_for(
            lambda before=before: len(  # type: ignore[misc]
                [r for r in node.emulator.registrations[before:] if r.resource_name == resource]
            ) == 1,
            timeout=20.0, what="re-registration",
        )
        await node.emulator.wait_for(
            lambda: len(node.emulator.healthy_device_ids(resource)) == 2,
            timeout=20.0, what="the new ListAndWatch stream",
        )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]
    assert not any("already running" in r.getMessage() for r in caplog.records)
