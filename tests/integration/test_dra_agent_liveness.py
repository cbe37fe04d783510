"""A node whose agent is gone stops being offered, and is offered again when it is back, on the
real control plane (API server, scheduler, controller-manager) with the controller process
(``--dra --agent-grace``).

Two Ready nodes without a kubelet (``tests.harness.dra``), each with an in-process agent
(discovery, the DRA publisher, the liveness Lease as ``agent.kube.liveness`` renews it). A shared
camera both nodes see (capacity 3) and two local devices per node. Node A's agent stops (its
publisher and Lease end, as a killed agent's would): within the grace the controller drops A
from the camera's selector and taints A's local pool; pods asking for the camera are all bound
to B, a claim for A's local device waits, and the pod that held A's other local device keeps
it. A's agent back: A is in the selector again, the taint goes, and the waiting claim is
allocated on A. A pod is judged by its claim's allocation (nothing runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from agent.dra import slices
from agent.dra.publisher import DraPublisher
from agent.kube.client import as_dict
from agent.kube.liveness import LivenessLease
from crds import agent_liveness, dra
from crds.naming import instance_name
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controller_process import FAST_ARGS, ControllerProcess
from tests.harness.controlplane import ControlPlane

SCHEDULE_DEADLINE = 60.0
#: The controller's grace and the agents' renewal: short for the test, with room for a loaded
#: machine's stalls (the Lease says it lasts three renewals, under the grace).
GRACE_S = 3
RENEW_S = 0.5
SYSTEM_NAMESPACE = "edgeplug-system"
RuleV1 = "devicetaintrules.resource.k8s.io"


def _rules_on(cp: ControlPlane, node: str) -> list[dict[str, Any]]:
    found = json.loads(cp.kubectl("get", RuleV1, "-l", f"edgeplug.io/node={node}",
                                  "-o", "json").stdout)
    return list(found["items"])


def _taint_rules_served(cp: ControlPlane) -> bool:
    return "devicetaintrules" in cp.kubectl(
        "api-resources", "--api-group=resource.k8s.io", "-o", "name").stdout


async def _ensure_namespace(kube: AsyncClient, name: str) -> None:
    with contextlib.suppress(ApiError):  # there already
        await kube.create(Namespace(metadata=ObjectMeta(name=name)))


async def test_an_agent_gone_stops_its_node_being_offered_until_it_is_back(
    control_plane: ControlPlane, pod_namespace: str, kube: AsyncClient, tmp_path: Path
) -> None:
    cp, ns = control_plane, pod_namespace
    served = _taint_rules_served(cp)
    node_a, node_b = harness.new_node(cp), harness.new_node(cp)
    await _ensure_namespace(kube, SYSTEM_NAMESPACE)
    cams = harness.debug_echo_configuration("cams", descriptions=["cam"], shared=True,
                                            capacity=3, allocator="dra")
    usb = harness.debug_echo_configuration("usb", descriptions=["l1", "l2"], shared=False,
                                           allocator="dra")
    camera = instance_name("cams", "cam", shared=True, node=node_a)
    camera_pool = slices.shared_pool(ns, "cams", camera)
    a_pool = slices.local_pool(ns, "usb", node_a)

    def local(device: str) -> str:
        return (f'device.attributes["{dra.DRIVER}"].instance == '
                f'"{instance_name("usb", device, shared=False, node=node_a)}"')

    controller = ControllerProcess(
        cp, namespaces=[ns], log_path=tmp_path / "controller.log",
        extra_args=(*FAST_ARGS, "--standalone", "--dra", "--agent-grace", str(GRACE_S)))
    leases: dict[str, asyncio.Task[None]] = {}

    def renew(agent: h.DraAgent, node: str) -> None:
        leases[node] = asyncio.create_task(LivenessLease(
            agent.agent.client, node=node, namespace=SYSTEM_NAMESPACE, renew_s=RENEW_S).run())

    controller.start()
    try:
        async with (h.ready_nodes(kube, [node_a, node_b]),
                    h.dra_agents(cp, [node_a, node_b], ns) as agents,
                    contextlib.AsyncExitStack() as stack):
            stack.callback(lambda: [task.cancel() for task in leases.values()])
            for node in (node_a, node_b):
                renew(agents[node], node)
            harness.apply(cp, ns, cams)
            harness.apply(cp, ns, usb)

            async def camera_on(nodes: list[str]) -> bool:
                return h.device_nodes(await h.pool_slices(kube, camera_pool),
                                      slices.device_name(camera)) == sorted(nodes)

            await harness.eventually(lambda: camera_on([node_a, node_b]),
                                     what="the camera offered on both nodes",
                                     deadline=SCHEDULE_DEADLINE)
            h.apply(cp, ns, h.claim_template("l1", dra.device_class_name(ns, "usb"), local("l1")),
                    h.claim_template("l2", dra.device_class_name(ns, "usb"), local("l2")),
                    h.claim_template("cam", dra.device_class_name(ns, "cams")),
                    h.claim_pod("holder", "l1"))
            held = await harness.eventually(lambda: h.pod_claim(kube, ns, "holder"),
                                            what="holder bound to A's l1",
                                            deadline=SCHEDULE_DEADLINE)
            assert held.node == node_a

            # A's agent stops: no more slices, no more renewals.
            stopped_at = time.monotonic()
            agents[node_a].task.cancel()
            leases.pop(node_a).cancel()
            await harness.eventually(lambda: camera_on([node_b]),
                                     what="A dropped from the camera's selector",
                                     deadline=SCHEDULE_DEADLINE)
            dropped_s = time.monotonic() - stopped_at
            if served:
                async def tainted() -> list[dict[str, Any]] | None:
                    return await asyncio.to_thread(_rules_on, cp, node_a) or None

                rules = await harness.eventually(tainted, what="A's local pool tainted",
                                                 deadline=SCHEDULE_DEADLINE)
                assert [r["spec"]["deviceSelector"]["pool"] for r in rules] == [a_pool]
                assert {k: v for k, v in rules[0]["spec"]["taint"].items()
                        if k != "timeAdded"} == {
                    "key": agent_liveness.TAINT_AGENT_GONE, "value": node_a,
                    "effect": "NoSchedule"}, rules
            print(f"\nagent stopped → no longer offered: {dropped_s:.2f} s "
                  f"(grace {GRACE_S} s, renewals every {RENEW_S} s)")

            # Every pod asking for the camera goes to B; the claim on A's l2 waits.
            h.apply(cp, ns, *(h.claim_pod(f"viewer-{i}", "cam") for i in range(3)),
                    h.claim_pod("waiting", "l2"))
            for viewer in (f"viewer-{i}" for i in range(3)):
                got = await harness.eventually(
                    functools.partial(h.pod_claim, kube, ns, viewer), what=f"{viewer} bound",
                    deadline=SCHEDULE_DEADLINE)
                assert got.node == node_b, (viewer, got)
            if served:
                await harness.eventually(lambda: h.unschedulable(kube, ns, "waiting"),
                                         what="the claim on A's l2 unschedulable",
                                         deadline=SCHEDULE_DEADLINE)
                assert await h.pod_claim(kube, ns, "waiting") is None
            # The pod that held a device of A keeps it (NoSchedule, never NoExecute).
            assert await h.pod_claim(kube, ns, "holder") == held

            # A's agent is back.
            agents[node_a].task = asyncio.create_task(DraPublisher(
                client=agents[node_a].agent.client, node_name=node_a, namespace=ns,
                devices=agents[node_a].agent.devices).run())
            back_at = time.monotonic()
            renew(agents[node_a], node_a)
            await harness.eventually(lambda: camera_on([node_a, node_b]),
                                     what="A back in the camera's selector",
                                     deadline=SCHEDULE_DEADLINE)
            print(f"agent back → offered again: {time.monotonic() - back_at:.2f} s")
            if served:
                async def untainted() -> bool:
                    return await asyncio.to_thread(_rules_on, cp, node_a) == []

                await harness.eventually(untainted, what="A's taint rule deleted",
                                         deadline=SCHEDULE_DEADLINE)
            waiting = await harness.eventually(lambda: h.pod_claim(kube, ns, "waiting"),
                                               what="the claim on A's l2 allocated",
                                               deadline=SCHEDULE_DEADLINE)
            assert waiting.node == node_a
            body = as_dict(await kube.get(Pod, "holder", namespace=ns))
            assert not body["metadata"].get("deletionTimestamp")
    finally:
        controller.stop()
        await h.delete_controller_slices(kube, ns)
        for node in (node_a, node_b):
            cp.kubectl("delete", RuleV1, "-l", f"edgeplug.io/node={node}", check=False)
            cp.kubectl("delete", "lease", "-n", SYSTEM_NAMESPACE,
                       f"{agent_liveness.LEASE_PREFIX}{node}", check=False)
