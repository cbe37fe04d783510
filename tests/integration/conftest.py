"""Fixtures the integration tests share: a lightkube client, a pod-ready namespace, agent nodes.

Why this exists: the device-plugin, slot-demand, slot-ledger and node-emulator tests all need a
client on the real control plane, and the pod-running ones a namespace whose default
ServiceAccount exists (pods are refused before it does). Defined once here rather than per file.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from lightkube import AsyncClient, KubeConfig

from tests.harness.agent_nodes import AgentNodes, StartNode
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account


@pytest.fixture
async def kube(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    """A lightkube client on the real API server, closed after the test."""
    client = AsyncClient(KubeConfig.from_file(str(control_plane.kubeconfig)))
    yield client
    await client.close()


@pytest.fixture
async def pod_namespace(namespace: str, kube: AsyncClient) -> str:
    """The test's namespace once the controller-manager gave it its default ServiceAccount."""
    await wait_service_account(kube, namespace)
    return namespace


@pytest.fixture
async def start_node(
    control_plane: ControlPlane, kube: AsyncClient
) -> AsyncIterator[StartNode]:
    """Starts emulated nodes running the agent's device-plugin side; stops them afterwards."""
    nodes = AgentNodes(kube=kube, kubeconfig=control_plane.kubeconfig)
    yield nodes.start
    await nodes.stop_all()
