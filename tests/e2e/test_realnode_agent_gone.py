"""An agent killed for 15 s on one of two real nodes (the DRA default): after the grace no pod is
bound there for the shared device, and pods waiting for it get the slots freed on the other node.

Two real nodes (kubelet, containerd, runc) see one shared debugEcho device of capacity 2. Each
node's agent runs beside its kubelet with ``DRA=on`` and its liveness Lease (renewed every
0.5 s); the controller runs with ``--dra --agent-grace 3``. Node B's agent is SIGKILLed: once
the controller has dropped B from the device's selector, a Deployment of three replicas asking
for ``edgeplug.io/<configuration>: 1`` runs two, both on A, the third Pending (Unschedulable);
a running replica deleted, a waiting one gets its slot and runs on A; nothing is ever bound to
B and nothing is refused at admission. B's agent started again 15 s after the kill: B is in
the selector again. What ran is judged by the containers (Running, the device's env).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient, KubeConfig

from agent.dra.slices import device_name, shared_pool
from crds import agent_liveness
from crds.naming import configuration_resource_name, instance_name
from tests.e2e.test_realnode_akri_dra import pod_env
from tests.harness import dra as h
from tests.harness.agent_process import debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import wait_service_account
from tests.harness.realnode import RealNode
from tests.harness.realnode_brokers import (
    Broker,
    akri_style_deployment,
    app_pods,
    is_running,
    is_unschedulable,
    refusal,
    start_agent,
)

pytestmark = pytest.mark.timeout(600)
GRACE_S = 3
LEASES = "edgeplug-system"
#: The issue's outage: the agent is away this long.
DEAD_S = 15.0
DEADLINE_S = 90.0


def _checked(plane: ControlPlane, ns: str, app: str, gone: str) -> list[dict[str, Any]]:
    """The app's pods, after checking none is bound to ``gone`` or refused at admission."""
    pods = app_pods(plane, ns, app)
    assert not [p["metadata"]["name"] for p in pods if refusal(p)], "refused at admission"
    on_gone = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == gone]
    assert not on_gone, f"bound to the node whose agent is gone: {on_gone}"
    assert sum(map(is_running, pods)) <= 2, "more slots used than the capacity"
    return pods


async def test_a_killed_agents_node_gets_no_pod_and_waiting_pods_get_the_other_nodes_slots(
    plane: ControlPlane, node: RealNode, tmp_path: Path,
) -> None:
    other = RealNode(plane, node_name=f"real-{uuid.uuid4().hex[:6]}")
    other.start()
    ns = f"gone-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", ns)
    plane.kubectl("create", "namespace", LEASES, check=False)
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    agent_log = f"agent-{ns}"
    env = {"DRA": "on", "LIVENESS_LEASE_NAMESPACE": LEASES, "LIVENESS_RENEW_SECONDS": "0.5"}
    broker = Broker(ns, "", "", agent_log)
    ctl = ControllerProcess(plane, namespaces=[ns], log_path=tmp_path / "ctl.log",
                            extra_args=(*FAST_ARGS, "--dra", "--agent-grace", str(GRACE_S)))
    alive, gone = node.node_name, other.node_name
    try:
        await wait_service_account(kube, ns)
        for each in (node, other):
            start_agent(each, plane, broker, extra_env=env)
        ctl.start()
        h.apply(plane, ns, debug_echo_configuration("cam", descriptions=["cam"], shared=True,
                                                    capacity=2))
        camera = instance_name("cam", "cam", shared=True, node=alive)
        pool = shared_pool(ns, "cam", camera)

        async def selector_is(nodes: list[str]) -> bool:
            return h.device_nodes(await h.pool_slices(kube, pool),
                                  device_name(camera)) == sorted(nodes)

        await eventually(lambda: selector_is([alive, gone]), what="the device on both nodes",
                         deadline=DEADLINE_S)

        other.kill_process(agent_log)
        killed_at = time.monotonic()
        await eventually(lambda: selector_is([alive]), what="B dropped from the selector",
                         deadline=DEADLINE_S)
        print(f"figure: agent SIGKILLed -> its node no longer offered the shared device "
              f"{time.monotonic() - killed_at:.2f} s (grace {GRACE_S} s, renewals 0.5 s)")

        h.apply(plane, ns, akri_style_deployment(
            "users", configuration_resource_name("cam", None), 3))

        async def two_run_one_waits() -> list[dict[str, Any]] | None:
            pods = _checked(plane, ns, "users", gone)
            running = [p for p in pods if is_running(p)]
            waiting = [p for p in pods if is_unschedulable(p)]
            return running if len(running) == 2 and len(waiting) == 1 else None

        running = await eventually(two_run_one_waits, what="two replicas on A, one waiting",
                                   deadline=DEADLINE_S)
        assert {p["spec"]["nodeName"] for p in running} == {alive}
        for found in running:
            assert (await pod_env(plane, found))["DEBUG_ECHO_DESCRIPTION"] == "cam"
        freed = running[0]["metadata"]["name"]
        freed_at = time.monotonic()
        plane.kubectl("delete", "pod", freed, "-n", ns, "--wait=false")

        async def slot_taken_on_a() -> list[dict[str, Any]] | None:
            pods = _checked(plane, ns, "users", gone)
            now = [p for p in pods if is_running(p) and p["metadata"]["name"] != freed
                   and not p["metadata"].get("deletionTimestamp")]
            return now if len(now) == 2 else None

        now = await eventually(slot_taken_on_a, what="a waiting replica Running in the freed slot",
                               deadline=DEADLINE_S)
        assert {p["spec"]["nodeName"] for p in now} == {alive}
        print(f"figure: a slot freed on A -> a waiting replica Running there "
              f"{time.monotonic() - freed_at:.2f} s")

        # B's agent back after the outage: B offered again.
        await asyncio.sleep(max(0.0, DEAD_S - (time.monotonic() - killed_at)))  # the outage
        start_agent(other, plane, broker, extra_env=env)
        await eventually(lambda: selector_is([alive, gone]), what="B offered again",
                         deadline=DEADLINE_S)
        lease = json.loads(plane.kubectl(
            "get", "lease", "-n", LEASES, f"{agent_liveness.LEASE_PREFIX}{gone}",
            "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"] == gone
    finally:
        ctl.stop()
        for each in (node, other):
            each.stop_process(agent_log)
        print(f"--- controller log ---\n{ctl.log_tail(20)}")
        plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        for each in (node, other):
            await h.delete_slices(kube, each.node_name)
        await h.delete_controller_slices(kube, ns)
        await kube.close()
        other.cleanup()
