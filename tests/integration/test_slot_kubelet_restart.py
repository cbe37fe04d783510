"""A restarted kubelet's first pod-resources answers free no slot.

A kubelet that restarts serves pod-resources again before it has re-admitted the pods its
runtime still runs (their devices kept from its checkpoint, without ``Allocate``): its first
``List`` answers leave those pods out. Without the rule in agent/deviceplugins/slots/rules.py
("a restarted kubelet"), the orphan freer would take that for "their pods ended" and free at
once every slot a ``List`` had shown held: a broker's slot freed right after a kubelet restart
and a configuration-level id then mapped onto it (one slot recorded for two live pods), and a
held slot freed for good (the configuration plugin advertising one device too many).

Real parts: the API server (the Instance, its conditioned writes), the agent's configuration
backend, ledger and orphan freer, and a pod-resources server on a real gRPC Unix socket that is
stopped and served anew on the same path, as a restarting kubelet does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube import AsyncClient

from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from tests.harness.unix_grpc import SocketServer
from tests.integration.test_slot_reuse import HELD, VID, GatedPodResources, OneVirtualId

pytestmark = pytest.mark.timeout(60)

#: Restarts tried until the new socket differs from the old in (inode, ctime): a kubelet
#: restart takes far longer than the file system's timestamp granularity, a test's may not.
RESTART_TRIES = 50


def _server(socket: Path, servicer: GatedPodResources) -> SocketServer:
    return SocketServer(
        socket, add_services=lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(
            servicer, s), stop_grace_s=0.1)


async def test_a_restarted_kubelet_that_has_not_readmitted_its_pods_frees_nothing(
    kube: AsyncClient, namespace: str, tmp_path: Path
) -> None:
    socket = tmp_path / "pod-resources.sock"
    before = GatedPodResources()
    server = _server(socket, before)
    await server.start()
    one = await OneVirtualId.create(kube, namespace, socket, digest="d1e2f3")
    try:
        await one.backend.allocate([[VID]])
        before.live = {VID}
        await one.sweep()  # seen live
        assert one.usage == HELD

        # The kubelet restarts: a new socket on the same path, no pod admitted again yet.
        after = GatedPodResources()
        old = one.client.server_identity()
        for _ in range(RESTART_TRIES):
            await server.stop()
            server = _server(socket, after)
            await server.start()
            if one.client.server_identity() != old:
                break
        assert one.client.server_identity() != old, "the socket was not served anew"
        await one.sweep()
        assert one.usage == HELD, (
            "a slot freed on the answer of a kubelet that had not re-admitted its pods")

        # Re-admitted, the pod shows again; once it ends, its slot is freed at once as before.
        after.live = {VID}
        await one.sweep()
        after.live = set()
        await one.sweep()
        assert one.usage == ""
    finally:
        await one.client.close()
        await server.stop()
