"""etcd restarted, and the API server stopped for 35 s and then for 90 s, while devices come and go.

Real parts: a control plane of this module's own (stopping the shared one would disturb every
other test), its etcd and kube-apiserver processes stopped and started again with the same
flags; a node (``DeviceNode``) with its agent as a process, the controller as a process, and a
pod holding one of a device's slots throughout. During each outage one shared device is
unplugged and another plugged in (debugEcho's availability file). The agent and the controller
must ride it out, and once the server is back the vanished device's Instance and broker must go,
the new device get both, the held slot stay its pod's, and every invariant hold
(tests/faults/invariants.py) the whole time, watched through the outage. After the 90 s one
(longer than kopf's own API retries) the controller must still heart-beat in its peering
object 20 s after the server's return.

The two API server outages run in one test, on one cluster, one after the other: a second
cluster would wait for Kubernetes' own scheduler and kubelet to recover from the first outage
(see RUNNING_AFTER_OUTAGE_S), and that wait is not edgeplug's. edgeplug's own state must have
converged after each outage before the next; pods must be running at the end. The etcd test
runs first, for the same reason (with etcd down the API server keeps its watches open, so
Kubernetes' own clients do not back off).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from crds.naming import instance_name, instance_resource_name
from tests.faults.cluster import FaultCluster, write_offline
from tests.harness.agent_nodes import pinned_pod
from tests.harness.controller_process import install_peering_crds, last_seen, unique, wait_until
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import running, wait_pod, wait_service_account

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

#: When, into the outage, the devices change (well before its end, so that the vanished
#: device's grace period runs out while the server is away); at most half-way in.
CHANGE_AFTER_S = 10.0
#: How long etcd stays down.
ETCD_DOWN_S = 10.0
#: The API server outages, one after the other.
OUTAGES_S = (35.0, 90.0)
#: How often the processes are checked to be alive during the outage.
ALIVE_POLL_S = 0.5
GRACE_S = 2
#: After an outage, pods run only once kube-scheduler and the kubelet watch again: their
#: client-go reflectors back off up to 30 s between failed lists, with up to as much jitter.
#: (edgeplug's own state must still converge within CONVERGED_WITHIN_S.)
RUNNING_AFTER_OUTAGE_S = 120.0
#: Once the API server is back from the 90 s outage (longer than kopf's default API retries,
#: 1+1+2+3+5+8+13+21 = 54 s, after which a controller left at kopf's defaults failed its peering
#: keep-alive and exited about 10 s after the server's return), the controller must still
#: heart-beat in its peering object this much later.
STILL_ALIVE_AFTER_S = 20.0
#: The controller's peering priority (so that it heart-beats in the namespace).
PRIORITY = 200
#: The device kept (a pod holds one of its slots throughout), and per outage the device that
#: vanishes during it and the one that appears.
KEPT = "d0"
CHANGES = (("g1", "n1"), ("g2", "n2"))


@pytest.fixture(scope="module")
def own_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as plane:
        install_peering_crds(plane)
        yield plane


@pytest.fixture
async def outage_cluster(own_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[FaultCluster]:
    namespace = unique("outage")
    own_plane.kubectl("create", "namespace", namespace)
    cluster = FaultCluster(own_plane, namespace, tmp_path)
    client = cluster.client()
    try:
        await wait_service_account(client, namespace)
        yield cluster
    finally:
        print(cluster.logs())
        await cluster.close()
        await client.close()


def assert_alive(cluster: FaultCluster) -> None:
    for node in cluster.nodes:
        assert node.agent.process is not None
        assert node.agent.process.poll() is None, f"the agent of {node.name} exited"
    for ctl in cluster.controllers:
        assert ctl.popen is not None
        assert ctl.popen.poll() is None, f"the controller exited:\n{ctl.log_tail()}"


def offline_after(changes: int) -> set[str]:
    """Devices offline once the first ``changes`` outages made their change."""
    return ({gone for gone, _ in CHANGES[:changes]}
            | {new for _, new in CHANGES[changes:]})


def visible_after(changes: int) -> list[str]:
    every = [KEPT, *(d for pair in CHANGES for d in pair)]
    return [d for d in every if d not in offline_after(changes)]


async def ride_out(cluster: FaultCluster, server: str, down_s: float, availability: Path,
                   changes: int) -> datetime:
    """Stop ``server`` for ``down_s`` seconds; ``CHANGE_AFTER_S`` in, make change number
    ``changes`` (one device unplugged, one plugged in). Every process must stay up throughout.
    Returns when the server was back."""
    args = await asyncio.to_thread(cluster.plane.stop_server, server)
    loop = asyncio.get_running_loop()
    began = loop.time()
    changed = False
    while (elapsed := loop.time() - began) < down_s:  # the outage itself, watched throughout
        if not changed and elapsed >= min(CHANGE_AFTER_S, down_s / 2):
            write_offline(availability, offline_after(changes))
            changed = True
        assert_alive(cluster)
        await asyncio.sleep(ALIVE_POLL_S)
    await asyncio.to_thread(cluster.plane.start_server, server, args)
    return datetime.now(UTC)


async def run_outages(cluster: FaultCluster, server: str, downs: tuple[float, ...]) -> None:
    availability = cluster.workdir / "offline"
    write_offline(availability, offline_after(0))
    node = await cluster.add_node()
    cluster.start_controller(priority=PRIORITY)
    cluster.configure("out", descriptions=[KEPT, *(d for pair in CHANGES for d in pair)],
                      availability=availability, capacity=2, grace=GRACE_S, brokers=True)
    client = cluster.client()
    try:
        await cluster.converged(client, cluster.expected("out", visible_after(0)), brokers=True,
                                running_within=RUNNING_AFTER_OUTAGE_S)
        kept = instance_resource_name(instance_name("out", KEPT, shared=True, node=""))
        await client.create(pinned_pod(
            cluster.namespace, "user", resource=kept, node=node.name, stop_at_once=True))
        await wait_pod(client, cluster.namespace, "user", running, "Running")
        async with cluster.recorder() as recorder:
            for number, down_s in enumerate(downs, start=1):
                gone, _ = CHANGES[number - 1]
                recorder.allow_gone(instance_name("out", gone, shared=True, node=""))
                back = await ride_out(cluster, server, down_s, availability, number)
                await cluster.converged(client, cluster.expected("out", visible_after(number)),
                                        brokers=True, running_within=None
                                        if number < len(downs) else RUNNING_AFTER_OUTAGE_S)
        recorder.assert_clean()
        if server == "kube-apiserver":  # (etcd down, the server keeps its watches open)
            assert recorder.events["watch errors"] > 0, "the recorder never saw the outage"
            await kept_alive_after(cluster, back)
        assert_alive(cluster)
    finally:
        await client.close()


async def kept_alive_after(cluster: FaultCluster, back: datetime) -> None:
    """The controller still heart-beats ``STILL_ALIVE_AFTER_S`` after the server's return."""

    def heart_beat_since() -> bool:
        seen = last_seen(cluster.plane, cluster.namespace, PRIORITY)
        return seen is not None and (seen - back).total_seconds() >= STILL_ALIVE_AFTER_S

    await asyncio.to_thread(
        wait_until, heart_beat_since, deadline=STILL_ALIVE_AFTER_S + 30,
        what=f"a peering keep-alive {STILL_ALIVE_AFTER_S:.0f} s after the server's return")


async def test_etcd_restart(outage_cluster: FaultCluster) -> None:
    await run_outages(outage_cluster, "etcd", (ETCD_DOWN_S,))


async def test_api_server_outages_of_35_s_then_90_s(outage_cluster: FaultCluster) -> None:
    await run_outages(outage_cluster, "kube-apiserver", OUTAGES_S)
