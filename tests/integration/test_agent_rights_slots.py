"""Slots still move between nodes when each agent holds only its own node's rights.

The Instance admission policy (deploy/manifests/agent-instance-policy.yaml)
lets an agent write only its own node's slots, reservations and demand. Moving a slot to the
node whose pinned pods wait takes writes by both nodes' agents: the waiting node publishes its
demand, the idle node gives its reservation back, the waiting node reserves and claims it, and
later frees it. Here two emulated nodes each run the agent's device-plugin side with its own
ServiceAccount token bound to a pod on that node (as its DaemonSet pod's token is) and that
node's kubelet certificate for the pods bound there, the real
scheduler places pinned pods, and the scenario of tests/integration/test_slot_demand.py must
still end with every pod Running on its node and no write refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.deviceplugins.slots.service import serve_device_plugins
from agent.discovery.node_devices import NodeDeviceTable
from agent.kube.client import ConfigurationResource
from agent.kube.node_reads import NodeReads, node_reads
from agent.metrics import AgentMetrics
from tests.harness.agent_nodes import (
    STOP_WAIT_S,
    TEST_ORPHAN_GRACE_S,
    AgentNode,
    kubelet_class,
    pinned_pod,
    read_instance,
    serving_with,
    share_instance,
)
from tests.harness.agent_process import debug_echo_configuration
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import unschedulable, wait_pod, wait_until
from tests.harness.offer_grants import wait_offer
from tests.harness.service_accounts import (
    agent_on,
    apply_compat,
    apply_manifests,
    kubelet_certificate,
    release_agent_pod,
)
from tests.integration import test_slot_demand as slot_demand
from tests.integration.test_slot_demand import assert_quiet, demand_of, fill_from, hand_over

# The agents write with their own token: the offer grants name their Configurations.
pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("offers")]

POLICY_FILES = ("namespace.yaml", "agent-rbac.yaml", "agent-instance-policy.yaml")
#: Log text of a write the API server refused (RBAC or the admission policy).
REFUSALS = ("denied request", "Forbidden", "forbidden")

StartNode = Callable[[], Awaitable[AgentNode]]
#: Every Failed or admission-rejected pod status seen in the test's namespace (a fixture).
failures = slot_demand.failures


@pytest.fixture
async def token_node(
    control_plane: ControlPlane, tmp_path: Path
) -> AsyncIterator[StartNode]:
    """Starts emulated nodes whose device-plugin side uses its own node-bound agent token."""
    cp = control_plane
    apply_manifests(cp, POLICY_FILES)
    apply_compat(cp)  # shared slots move between the nodes: the compatibility mode
    started: list[tuple[AgentNode, AsyncClient, NodeReads]] = []
    dirs: list[str] = []

    async def start() -> AgentNode:
        plugin_dir = Path(tempfile.mkdtemp(prefix="ep-rs-dp-", dir="/tmp"))
        resources_dir = Path(tempfile.mkdtemp(prefix="ep-rs-pr-", dir="/tmp"))
        dirs.extend([str(plugin_dir), str(resources_dir)])
        emulator = kubelet_class()(
            node_name=f"rights-{uuid.uuid4().hex[:8]}", kubeconfig=cp.kubeconfig,
            plugin_dir=plugin_dir, pod_resources_socket=resources_dir / "kubelet.sock",
        )
        await emulator.start()
        identity = await asyncio.to_thread(agent_on, cp, emulator.node_name, tmp_path)
        config = KubeConfig.from_file(str(identity.kubeconfig))
        client = AsyncClient(config)
        # The node's own reads (the pods bound here) as its kubelet, as the DaemonSet has it.
        reads = node_reads(own=client, base=config, node_name=emulator.node_name, cert=(
            kubelet_certificate(cp, emulator.node_name, tmp_path)), key=None)
        table, metrics = NodeDeviceTable(), AgentMetrics()
        def serve() -> Coroutine[Any, Any, None]:
            return serving_with(TEST_ORPHAN_GRACE_S, serve_device_plugins(
                client=client, node_name=emulator.node_name, plugin_dir=plugin_dir,
                pod_resources_socket=resources_dir / "kubelet.sock", devices=table,
                metrics=metrics, reads=reads,
            ))

        node = AgentNode(emulator=emulator, table=table, metrics=metrics,
                         task=asyncio.create_task(serve()), serve=serve)
        started.append((node, client, reads))
        return node

    try:
        yield start
    finally:
        for node, client, reads in started:
            node.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(node.task, STOP_WAIT_S)
            await node.emulator.stop(delete_node=True)
            await reads.close()
            await client.close()
            release_agent_pod(cp, node.name)
        for folder in dirs:
            shutil.rmtree(folder, ignore_errors=True)


async def test_a_slot_moves_to_the_waiting_node_under_node_rights(
    control_plane: ControlPlane,
    kube: AsyncClient,
    pod_namespace: str,
    token_node: StartNode,
    failures: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    ns, configuration = pod_namespace, f"cam{uuid.uuid4().hex[:6]}"
    # The Configuration the Instance names, which every node may offer (the offer grants).
    await kube.apply(ConfigurationResource.from_dict(debug_echo_configuration(
        configuration, descriptions=[]) | {"metadata": {"name": configuration, "namespace": ns}}),
        field_manager="test")
    await asyncio.to_thread(wait_offer, control_plane, ns, configuration, "any-node")
    a, b = await token_node(), await token_node()
    # Fair share: each agent reserves one slot (its own status.reservations entry).
    name, resource = await share_instance(
        kube, ns, configuration=configuration, digest="e7e7e7", nodes=(a, b), capacity=2
    )

    # Two pods that can only run on a: a publishes demand, b gives back, a reserves and claims.
    held_a = await fill_from(kube, ns, name, resource, a)
    # Answered at once, recorded right after (the fast path): the record is the agent's write.
    async def recorded() -> bool:
        instance = await read_instance(kube, ns, name)
        return instance.spec.device_usage == dict.fromkeys(held_a, a.name)

    await wait_until(recorded, what="a's claims recorded in deviceUsage under its token")

    # A pod pinned to b waits; a pod on a goes: a frees the slot and gives the reservation back,
    # b reserves and claims it.
    await kube.create(pinned_pod(ns, "b-1", resource=resource, node=b.name, by_affinity=False))
    await wait_pod(kube, ns, "b-1", unschedulable, "Unschedulable")
    await hand_over(kube, ns, resource, a, b)

    async def demand_met() -> bool:
        return await demand_of(kube, ns, name) == {}

    await wait_until(demand_met, what=f"status.demand of {name} cleared once b's pod runs")
    assert_quiet((a, b), ns, configuration, failures)
    refused = [record.getMessage() for record in caplog.records
               if record.name.startswith("agent")
               and any(text in record.getMessage() for text in REFUSALS)]
    assert not refused, f"an agent's write was refused: {refused}"
