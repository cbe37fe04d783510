"""``python -m tests.bench agent_gone``: a node's agent stops → the node no longer offered its
shared device; the agent back → offered again; beside a floor from the same run.

On a control plane of its own: two Ready nodes without a kubelet, an in-process agent on each
(discovery, DRA publisher, liveness Lease renewed every ``RENEW_S``), the controller's parts as
``controller/main.py`` wires them with ``--dra`` (DeviceClasses with the shared pools,
AgentLiveness, AgentGoneTaints) in-process, a shared debugEcho device both nodes see. Per run:
node A's publisher and Lease stopped → A gone from the device's selector (and, where served,
its local pool's DeviceTaintRule written); started again → A back. The floor: the same
selector change caused by A's health verdict (``status.unhealthy.<A>`` written), which goes
through the same pool pass without a grace. Medians over ``RUNS``; nothing is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

from lightkube import KubeConfig
from lightkube.types import PatchType

from agent.dra import slices
from agent.dra.publisher import DraPublisher
from agent.kube.client import InstanceResource
from agent.kube.liveness import LivenessLease
from controller.dra.agent_gone_taints import AgentGoneTaints
from controller.dra.agent_liveness import AgentLiveness
from controller.dra.device_classes import DeviceClasses
from controller.kube.rest import Rest
from crds.naming import instance_name
from tests.bench.stats import machine_speed_line
from tests.harness import agent_process as harness
from tests.harness import dra as h
from tests.harness.controlplane import ControlPlane, running

RUNS = 5
GRACE_S = 3.0
RENEW_S = 0.5
POLL_S = 0.02
LEASES = "edgeplug-system"


async def _timed(change: Callable[[], Awaitable[None] | None],
                 done: Callable[[], Awaitable[bool]]) -> float:
    started = time.monotonic()
    result = change()
    if result is not None:
        await result
    while not await done():
        assert time.monotonic() - started < 60, "no change within a minute"
        await asyncio.sleep(POLL_S)  # the measurement's resolution
    return time.monotonic() - started


async def _measure(cp: ControlPlane) -> dict[str, list[float]]:
    cp.kubectl("create", "namespace", LEASES, check=False)
    ns = f"gone-{uuid.uuid4().hex[:6]}"
    cp.kubectl("create", "namespace", ns)
    kube = harness.api_client(cp)
    single = KubeConfig.from_file(str(cp.kubeconfig)).get()
    assert single is not None
    http = Rest(single, connections=0)
    node_a, node_b = harness.new_node(cp), harness.new_node(cp)
    figures: dict[str, list[float]] = {"stopped": [], "back": [], "floor_drop": [],
                                       "floor_back": []}
    classes = DeviceClasses(kube, namespaces=[ns])
    taints = AgentGoneTaints(kube, http)
    liveness = AgentLiveness(http, namespace=LEASES, grace_s=GRACE_S,
                             listeners=(classes.pools.set_gone_nodes, taints.set_gone))
    parts = [asyncio.create_task(p) for p in (classes.run(), taints.run(), liveness.run())]
    leases: dict[str, asyncio.Task[None]] = {}
    try:
        async with (h.ready_nodes(kube, [node_a, node_b]),
                    h.dra_agents(cp, [node_a, node_b], ns) as agents,
                    contextlib.AsyncExitStack() as stack):
            # The Leases end before their agents' clients close.
            stack.callback(lambda: [task.cancel() for task in leases.values()])

            def start(node: str) -> None:
                leases[node] = asyncio.create_task(LivenessLease(
                    agents[node].agent.client, node=node, namespace=LEASES,
                    renew_s=RENEW_S).run())

            for node in (node_a, node_b):
                start(node)
            harness.apply(cp, ns, harness.debug_echo_configuration(
                "cam", descriptions=["cam"], shared=True, capacity=2, allocator="dra"))
            camera = instance_name("cam", "cam", shared=True, node=node_a)
            pool = slices.shared_pool(ns, "cam", camera)

            def on(*nodes: str) -> Callable[[], Awaitable[bool]]:
                async def check() -> bool:
                    return h.device_nodes(await h.pool_slices(kube, pool),
                                          slices.device_name(camera)) == sorted(nodes)
                return check

            await harness.eventually(on(node_a, node_b), what="offered on both", deadline=60)
            for _ in range(RUNS):
                def stop() -> None:
                    agents[node_a].task.cancel()
                    leases.pop(node_a).cancel()

                figures["stopped"].append(await _timed(stop, on(node_b)))

                def restart() -> None:
                    agents[node_a].task = asyncio.create_task(DraPublisher(
                        client=agents[node_a].agent.client, node_name=node_a, namespace=ns,
                        devices=agents[node_a].agent.devices).run())
                    start(node_a)

                figures["back"].append(await _timed(restart, on(node_a, node_b)))

                async def verdict(unhealthy: str | None) -> None:
                    await kube.patch(InstanceResource.Status, camera, {"status": {
                        "unhealthy": {node_a: unhealthy}}}, namespace=ns,
                        patch_type=PatchType.MERGE)

                figures["floor_drop"].append(await _timed(
                    lambda: verdict("bench: unhealthy"), on(node_b)))
                figures["floor_back"].append(await _timed(lambda: verdict(None),
                                                          on(node_a, node_b)))
    finally:
        for task in [*leases.values(), *parts]:
            task.cancel()
        for task in [*leases.values(), *parts]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await h.delete_controller_slices(kube, ns)
        cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        await http.close()
        await kube.close()
    return figures


def main(argv: list[str]) -> None:
    del argv
    print(machine_speed_line())
    with running() as cp:
        figures = asyncio.run(_measure(cp))
    print(json.dumps({k: [round(v, 3) for v in vs] for k, vs in figures.items()}))
    for name, what in (("stopped", f"agent stopped → node no longer offered (grace {GRACE_S:g} s,"
                                   f" renewals every {RENEW_S:g} s)"),
                       ("floor_drop", "floor: unhealthy verdict written → node no longer offered"),
                       ("back", "agent back → node offered again"),
                       ("floor_back", "floor: healthy verdict written → node offered again")):
        print(f"{what}: median {statistics.median(figures[name]):.2f} s, "
              f"min {min(figures[name]):.2f}, max {max(figures[name]):.2f} (n={RUNS})")
