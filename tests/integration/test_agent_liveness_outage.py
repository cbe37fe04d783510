"""An API server outage takes no agent for gone; an agent that stops renewing still is; a
rule an earlier controller left for an agent alive now is removed.

On a control plane of its own (the API server is stopped mid-test): two nodes' Leases renewed
as ``agent.kube.liveness`` renews them, the controller's ``AgentLiveness`` following them with a 2 s
grace. The API server stops for longer than two graces: neither agent can renew, nor can the
controller read; once it is back and the controller has judged again, neither node was ever
taken for gone. Then one agent stops renewing, and its node alone is taken for gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.kube.liveness import LivenessLease
from controller.dra.agent_gone_taints import AgentGoneTaints, rule_body
from controller.dra.agent_liveness import AgentLiveness
from controller.kube.rest import Rest
from tests.harness.agent_process import eventually
from tests.harness.controlplane import ControlPlane, running

pytestmark = pytest.mark.timeout(240)

GRACE_S = 2.0
RENEW_S = 0.4
OUTAGE_S = 5.0
LEASES = "edgeplug-system"


@pytest.fixture(scope="module")
def own_plane() -> Iterator[ControlPlane]:
    with running(install_crds=False) as cp:
        cp.kubectl("create", "namespace", LEASES)
        yield cp


@contextlib.asynccontextmanager
async def _renewing(cp: ControlPlane, node: str) -> AsyncIterator[LivenessLease]:
    async with AsyncClient(KubeConfig.from_file(str(cp.kubeconfig))) as client:
        lease = LivenessLease(client, node=node, namespace=LEASES, renew_s=RENEW_S)
        task = asyncio.create_task(lease.run())
        try:
            yield lease
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_an_api_outage_takes_no_agent_for_gone_and_a_silent_agent_is(
        own_plane: ControlPlane) -> None:
    cp = own_plane
    single = KubeConfig.from_file(str(cp.kubeconfig)).get()
    assert single is not None
    http = Rest(single, connections=0)
    seen: list[frozenset[str]] = []
    liveness = AgentLiveness(http, namespace=LEASES, grace_s=GRACE_S, listeners=(seen.append,))
    watching = asyncio.create_task(liveness.run())
    try:
        async with _renewing(cp, "node-x") as x, _renewing(cp, "node-y"):
            # Two graces' worth of renewals seen, and none judged gone.
            start = liveness.confirmations

            async def watched_a_while() -> bool:
                return x.renewals >= 2 + int(2 * GRACE_S / RENEW_S)

            await eventually(watched_a_while, what="renewals over two graces", deadline=60)
            assert not any(seen), seen  # told (after the first grace) that nobody is gone

            args = await asyncio.to_thread(cp.stop_server, "kube-apiserver")
            down = asyncio.get_running_loop().time()

            async def outage_over() -> bool:
                # Polls the outage's own length: the API server stays down this long.
                return asyncio.get_running_loop().time() - down >= OUTAGE_S

            await eventually(outage_over, what="the outage's length", deadline=60)
            during = liveness.confirmations
            assert during > start, "the controller judged nobody during the outage"
            await asyncio.to_thread(cp.start_server, "kube-apiserver", args)
            renewed = x.renewals

            async def renewed_over_two_graces() -> bool:
                return x.renewals >= renewed + int(2 * GRACE_S / RENEW_S)

            await eventually(renewed_over_two_graces, what="renewals over two graces after",
                             deadline=60)
            assert not any(seen), f"taken for gone across an API outage: {seen}"
            assert liveness.gone == frozenset()

            async with _renewing(cp, "node-z") as z:
                async def z_renewed() -> bool:
                    return z.renewals >= 3

                await eventually(z_renewed, what="node-z's Lease renewed")
            # node-z's agent stopped: only it is taken for gone.

            async def z_gone() -> bool:
                return liveness.gone == frozenset({"node-z"})

            await eventually(z_gone, what="the silent agent taken for gone", deadline=60)
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await http.close()



async def test_a_rule_an_earlier_controller_left_for_an_agent_alive_now_is_removed(
        own_plane: ControlPlane) -> None:
    """A controller that stopped while node W's agent was gone left W's local pool tainted;
    W's agent came back meanwhile. The next controller removes the rule once W's Lease has had
    its grace, though no node's state changed under it."""
    cp = own_plane
    stale = rule_body("v1", "node-w", "ns/usb/node/node-w")
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(stale))
    single = KubeConfig.from_file(str(cp.kubeconfig)).get()
    assert single is not None
    http = Rest(single, connections=0)
    async with AsyncClient(KubeConfig.from_file(str(cp.kubeconfig))) as kube, \
            _renewing(cp, "node-w"):
        taints = AgentGoneTaints(kube, http)
        liveness = AgentLiveness(http, namespace=LEASES, grace_s=GRACE_S,
                                 listeners=(taints.set_gone,))
        tasks = [asyncio.create_task(taints.run()), asyncio.create_task(liveness.run())]
        try:
            async def removed() -> bool:
                out = cp.kubectl("get", "devicetaintrules", "-o", "name").stdout
                return stale["metadata"]["name"] not in out

            await eventually(removed, what="the stale rule removed", deadline=60)
            assert "node-w" not in liveness.gone
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await http.close()
