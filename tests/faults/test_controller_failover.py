"""The active controller SIGKILLed with a standby peering beside it, while devices come and go.

Real parts: two ``python -m controller.main`` replicas peering through kopf's peering object
(the controller's default peering lifetime), a node (``DeviceNode``) with its agent, debugEcho
devices switched through the availability file. Right after the active replica is killed one
device vanishes and another appears: the standby must take over, delete the vanished device's
broker and start one for the new device, with no duplicate broker, no re-created Instance and
no slot held twice at any moment (tests/faults/invariants.py).
"""

from __future__ import annotations

import pytest
from lightkube import AsyncClient

from crds.naming import instance_name
from tests.faults.cluster import FaultCluster, write_offline
from tests.harness.controller_process import FAST_ARGS
from tests.harness.kube_waits import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

PRIORITY_ACTIVE, PRIORITY_STANDBY = 200, 100
#: FAST_ARGS without their short peering lifetime: the takeover runs the controller's default.
DEFAULT_PEERING_ARGS = tuple(
    arg for i, arg in enumerate(FAST_ARGS)
    if arg != "--peering-lifetime" and (i == 0 or FAST_ARGS[i - 1] != "--peering-lifetime")
)


async def test_controller_sigkill_fails_over_while_devices_change(
    cluster: FaultCluster, client: AsyncClient
) -> None:
    availability = cluster.workdir / "offline"
    write_offline(availability, {"c2"})
    await cluster.add_node()
    active = cluster.start_controller(priority=PRIORITY_ACTIVE, args=DEFAULT_PEERING_ARGS)
    await until(lambda: "active in namespace" in active.log_path.read_text(),
                what="the active replica active")
    standby = cluster.start_controller(priority=PRIORITY_STANDBY, args=DEFAULT_PEERING_ARGS)
    await until(lambda: "every watch has listed" in standby.log_path.read_text(),
                what="the standby's watches listed")
    cluster.configure("fo", descriptions=["c0", "c1", "c2"], availability=availability,
                      capacity=2, grace=1, brokers=True)
    await cluster.converged(client, cluster.expected("fo", ["c0", "c1"]), brokers=True)

    async with cluster.recorder() as recorder:
        active.kill()
        recorder.allow_gone(instance_name("fo", "c1", shared=True, node=""))
        write_offline(availability, {"c1"})  # c1 unplugged, c2 plugged in, during the gap
        await cluster.converged(client, cluster.expected("fo", ["c0", "c2"]), brokers=True)
    recorder.assert_clean()
    assert standby.popen is not None
    assert standby.popen.poll() is None, standby.log_tail()
    assert "created Pod" in standby.log_path.read_text(), "the standby made no broker"
