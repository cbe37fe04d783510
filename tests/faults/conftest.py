"""Fixtures of the fault suite: a namespace where pods may run, and a fault cluster in it.

Every scenario starts nodes, agents and controllers of its own and must stop
them all, whatever the outcome; the cluster is built here once. Scenarios that stop the API
server or etcd build theirs on a control plane of their own (test_api_outage.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from lightkube import AsyncClient, KubeConfig

from tests.faults.cluster import FaultCluster
from tests.faults.contention import CpuHog
from tests.harness.controller_process import install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account


@pytest.fixture
async def client(control_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    kube = AsyncClient(KubeConfig.from_file(str(control_plane.kubeconfig)))
    yield kube
    await kube.close()


@pytest.fixture
async def cluster(
    control_plane: ControlPlane, namespace: str, client: AsyncClient, tmp_path: Path
) -> AsyncIterator[FaultCluster]:
    """A fault cluster on the shared control plane, in the test's namespace (its pods may run:
    the default ServiceAccount exists). Every process it started is stopped afterwards, and
    their logs' ends printed."""
    install_peering_crds(control_plane)
    await wait_service_account(client, namespace)
    faults = FaultCluster(control_plane, namespace, tmp_path)
    try:
        yield faults
    finally:
        print(faults.logs())
        await faults.close()


@pytest.fixture(params=["quiet", "loaded"])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the scenario twice: on a quiet machine, and with every core busy (``CpuHog``)."""
    if request.param == "quiet":
        yield "quiet"
        return
    with CpuHog() as hog:
        assert hog.running == hog.cores
        yield "loaded"
        assert hog.running == hog.cores, "the CPU hog ended before the scenario did"
