"""Unpinned pods scheduled onto a node at the moment its agent gives its reserved slot away.

A slot hand-off in the shape a user meets it: a pod that is not pinned to a node (no
``nodeName``, ``nodeSelector`` or hostname affinity, no ``edgeplug.io/target-node`` label) asks
for a shared device's Instance resource. The scheduler may bind it to node a on an allocatable
that still counts the slot a's agent is handing to node b, whose pinned pods want it; a's
kubelet then finds no healthy device and fails the pod with ``UnexpectedAdmissionError``.

Real parts: two kubelets' device managers (``DeviceNode``), an agent process beside each, the
real scheduler, one shared debugEcho device of capacity 2 (no brokers, no controller: the
pinned pods carry the target-node label, so b's agent sees their demand itself). Every turn
starts from the fair share (one free slot reserved for each node), then creates two pods pinned
to b (one more than b has, so a's reservation must move to b) and one unpinned pod, created at
one of three moments, in rotation: with the pinned pods; when b's demand appears on the
Instance; when a's slot is reserved for b. The turn must settle with both slots used and the
third pod Pending, bound to no node, judged unschedulable (a waiting pod while a slot is free, or
one bound but not admitted, does not count as settled); then every pod is deleted and the fair
share must come back. Throughout, no pod fails and no slot is held by two live pods, judged by
what containers got (tests/faults/invariants.py). Each turn's times and where its pods went are
printed, never asserted.

What it catches: an agent that gives a slot away before lowering its Node's allocatable and
checking the pods bound to it (the unpinned pod is refused at admission: "no healthy devices
present", or "cannot claim slot ...: reserved elsewhere"); a kubelet status write that puts the
old count back; a pass that advertises a released slot again from an Instance copy older than
the release.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kube.client import as_dict
from crds.instance import Instance
from crds.naming import instance_resource_name
from tests.faults.cluster import FaultCluster, delete_pod
from tests.faults.invariants import InvariantRecorder
from tests.harness.agent_nodes import pinned_pod, read_instance
from tests.harness.kube_waits import allocatable, until, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CAPACITY = 2
#: Pods pinned to b each turn: one more than the slot b holds, so a's must move to b.
PINNED_PER_TURN = 2
#: Each moment twice.
TURNS = 6
#: How often the recorder's view of the Instance (its own watch, in memory) is looked at while
#: a moment is awaited: the moment lasts as long as an agent's reaction to a watch event.
MOMENT_POLL_S = 0.005
#: Bound on a turn settling, and on the fair share coming back (a loaded 2-core machine).
SETTLE_S = 30.0


def unpinned_pod(namespace: str, name: str, *, resource: str) -> Pod:
    """A user's pod asking one unit of ``resource``, free to run on any node."""
    return cast(Pod, Pod.from_dict({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "main", "image": "registry.invalid/pause:1",
                                 "resources": {"limits": {resource: "1"}}}]},
    }))


def unschedulable(pod: dict[str, Any]) -> bool:
    """Pending, bound to no node, and judged by the scheduler to fit none (a pod bound but
    Pending is still being admitted: its kubelet may yet refuse it)."""
    status = pod.get("status") or {}
    return (status.get("phase") == "Pending" and not (pod.get("spec") or {}).get("nodeName")
            and any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                    for c in status.get("conditions") or []))


def _instance(recorder: InvariantRecorder, name: str) -> Instance | None:
    obj = recorder.instances.get(name)
    return None if obj is None else Instance.from_object(obj)


async def test_unpinned_pods_are_never_refused_while_a_slot_moves(
    load: str, cluster: FaultCluster, client: AsyncClient
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    a, b = await cluster.add_node(), await cluster.add_node()
    expected = await cluster.one_shared_device(client, "handoff", capacity=CAPACITY,
                                               brokers=False)
    [instance] = expected
    resource = instance_resource_name(instance)
    ns = cluster.namespace

    async def fair_share() -> bool:
        """No pod left; each node reserves one free slot and its Node shows it allocatable."""
        if [p async for p in client.list(Pod, namespace=ns)]:
            return False
        found = await read_instance(client, ns, instance)
        return (sorted(found.reservations.values()) == sorted((a.name, b.name))
                and not found.demand and not any(found.spec.device_usage.values())
                and await allocatable(client, a.name, resource) == "1"
                and await allocatable(client, b.name, resource) == "1")

    def demand_of_b(recorder: InvariantRecorder) -> bool:
        found = _instance(recorder, instance)
        return found is not None and (found.demand.get(b.name, 0) > 0 or moved_to_b(recorder))

    def moved_to_b(recorder: InvariantRecorder) -> bool:
        found = _instance(recorder, instance)
        return found is not None and list(found.reservations.values()).count(b.name) == CAPACITY

    where: list[str] = []

    async def settled(names: list[str]) -> bool:
        """Both slots used, the rest unschedulable; a failed pod fails the scenario at once."""
        pods = {p["metadata"]["name"]: p for p in
                [as_dict(p) async for p in client.list(Pod, namespace=ns)]}
        phases = {n: (pods.get(n, {}).get("status") or {}).get("phase") for n in names}
        for name, phase in phases.items():
            if phase == "Failed":
                status: dict[str, Any] = pods[name]["status"]
                raise AssertionError(f"pod {name} (bound to {pods[name]['spec'].get('nodeName')})"
                                     f" failed: {status.get('reason')} {status.get('message')}")
        running = [n for n, p in phases.items() if p == "Running"]
        where[:] = [f"{n} {p} on {(pods.get(n, {}).get('spec') or {}).get('nodeName')}"
                    for n, p in phases.items()]
        return len(running) == CAPACITY and all(
            unschedulable(pods[n]) for n in names if n not in running)

    async with cluster.recorder() as recorder:
        moments: list[tuple[str, str, Callable[[], Awaitable[object]] | None]] = [
            ("with", "with the pinned pods", None),
            ("demand", "when b's demand appears", lambda: until(
                lambda: demand_of_b(recorder), what="b's demand", poll=MOMENT_POLL_S)),
            ("moved", "when a's slot is reserved for b", lambda: until(
                lambda: moved_to_b(recorder), what="a's slot reserved for b",
                poll=MOMENT_POLL_S)),
        ]
        loop = asyncio.get_running_loop()
        for turn in range(TURNS):
            began = loop.time()
            await wait_until(fair_share, what=f"the fair share before turn {turn}",
                             within=SETTLE_S)
            shared = loop.time()
            tag, moment, wait_for = moments[turn % len(moments)]
            pinned = [f"t{turn}-b{i}" for i in range(PINNED_PER_TURN)]
            unpinned = f"t{turn}-u-{tag}"

            async def create_unpinned(name: str = unpinned,
                                      wait: Callable[[], Awaitable[object]] | None = wait_for
                                      ) -> None:
                if wait is not None:
                    await wait()
                await client.create(unpinned_pod(ns, name, resource=resource))

            await asyncio.gather(
                *(client.create(pinned_pod(ns, n, resource=resource, node=b.name,
                                           stop_at_once=True)) for n in pinned),
                create_unpinned())
            names = [*pinned, unpinned]
            await wait_until(functools.partial(settled, names),
                             what=f"turn {turn} ({moment}): {CAPACITY} of {names} Running, "
                                  "the rest unschedulable", within=SETTLE_S)
            print(f"turn {turn} ({moment}): fair share back in {shared - began:.2f} s, "
                  f"settled in {loop.time() - shared:.2f} s: {', '.join(where)}")
            recorder.assert_clean()
            for name in names:
                await delete_pod(client, ns, name)
        await wait_until(fair_share, what="the fair share at the end", within=SETTLE_S)
        await cluster.converged(client, expected, brokers=False)
    recorder.assert_clean()
