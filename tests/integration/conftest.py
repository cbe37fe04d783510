"""Fixtures the integration tests share: a lightkube client, a pod-ready namespace, agent nodes,
the controller as a process, and the choice of kubelet stand-in.

The device-plugin, slot-demand, slot-ledger and node-emulator tests all need a
client on the real control plane, and the pod-running ones a namespace whose default
ServiceAccount exists (pods are refused before it does); the ONVIF tests a namespaced camera
network and processes stopped after the test. Defined once here rather than per file.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Protocol

import pytest
from lightkube import AsyncClient, KubeConfig

from tests.harness.agent_nodes import AgentNodes, StartNode
from tests.harness.controller_process import FAST_ARGS, ControllerProcess, install_peering_crds
from tests.harness.controlplane import ControlPlane, free_port
from tests.harness.kube_waits import wait_service_account
from tests.harness.node_emulator import KUBELET_ENV
from tests.harness.offer_grants import offer_grants
from tests.harness.onvif_netns import NetnsBed


@pytest.fixture(autouse=True)
def kubelet_stand_in(monkeypatch: pytest.MonkeyPatch) -> str:
    """Integration tests run their kubelet stand-ins on the kubelet's own device manager
    (``DeviceNode``) unless ``EDGEPLUG_KUBELET=emulator`` asks for the Python emulator; the
    emulator's own tests use ``PythonNodeEmulator`` either way."""
    choice = os.environ.get(KUBELET_ENV) or "devicenode"
    monkeypatch.setenv(KUBELET_ENV, choice)
    return choice


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


@pytest.fixture(scope="session")
def peering(control_plane: ControlPlane) -> ControlPlane:
    """The control plane with kopf's peering CRDs (and the bare test nodes) installed."""
    install_peering_crds(control_plane)
    return control_plane


@pytest.fixture
def metrics_port() -> int:
    """A free loopback port for the controller's metrics endpoint (a module's
    ``controller_args`` passes it on)."""
    return free_port()


@pytest.fixture
def controller_args() -> tuple[str, ...]:
    """Flags for the ``controller`` fixture; a test module overrides this to change them."""
    return FAST_ARGS


@pytest.fixture
def controller(
    peering: ControlPlane, namespace: str, tmp_path: Path, controller_args: tuple[str, ...]
) -> Iterator[ControllerProcess]:
    """The controller as its own process, watching the test's namespace; its log on teardown."""
    process = ControllerProcess(
        peering, namespaces=[namespace], log_path=tmp_path / "ctl.log",
        extra_args=controller_args,
    )
    process.start()
    yield process
    process.stop()
    print(f"--- controller log ---\n{process.log_tail(60)}")


@pytest.fixture(scope="module")
def bed() -> Iterator[NetnsBed]:
    """The namespaced ONVIF camera network (``tests.harness.onvif_netns``), one per module."""
    with NetnsBed() as network:
        yield network


class Stoppable(Protocol):
    async def stop(self) -> None: ...


@pytest.fixture
async def processes() -> AsyncIterator[list[Stoppable]]:
    """What a test started in the camera network (runners, cameras), stopped after it in order."""
    started: list[Stoppable] = []
    yield started
    for process in started:
        await process.stop()


@pytest.fixture(scope="module")
def offers(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[None]:
    """The controller's offer grants, kept on its own token while the module runs, for modules
    whose agents write with their own token and run no controller
    (tests/harness/offer_grants.py)."""
    with offer_grants(control_plane, tmp_path_factory.mktemp("offers")):
        yield
