"""Cross-node slot hand-off after a pod is deleted, timed step by step.

A shared slot held by a pod on node A must reach a pod pinned to node B, which waits Pending,
within a second of A's pod being deleted. Two nodes run the kubelet's own device manager
(``tests/harness/devicenode.py``) and the agent's device-plugin side, through
``tests/harness/agent_nodes.py``; the real scheduler places the pods. Each run deletes the pod
holding a slot on one node while a pod pinned to the other waits, and times, from the delete:
the slot freed in ``deviceUsage`` (the holder's sweep), its reservation given back (the holder's
release), reserved for the waiting node (its agent's write), the waiting pod bound (the
scheduler), the slot claimed in ``deviceUsage`` by the waiting node, and the pod Running. The
slot then moves the other way in the next run. Every time is taken from watch events as this
process receives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final, cast
from unittest import mock

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod

from agent.kube.client import InstanceResource, as_dict
from agent.settings import SlotSettings, current, in_use
from tests.bench.stats import summary
from tests.harness import agent_nodes
from tests.harness.agent_nodes import (
    AgentNode,
    AgentNodes,
    create_instance,
    node_device,
    pinned_pod,
)
from tests.harness.aio_process import cancel_and_wait
from tests.harness.controlplane import ControlPlane
from tests.harness.kube_waits import (
    running,
    unschedulable,
    wait_pod,
    wait_service_account,
    wait_until,
)

CONFIGURATION: Final = "handoff"
DIGEST: Final = "b0b0b0"
#: Slots of the shared Instance; every one is held by a pod at all times.
CAPACITY: Final = 2
#: How long a step may take before the run is a failure, not a figure.
STEP_DEADLINE_S: Final = 60.0
#: ConfigMaps created to show the API server's speed in the same run.
SPEED_OBJECTS: Final = 200
SPEED_CONCURRENCY: Final = 8
#: The waiting pod has been Pending at least this long before the holder's pod is deleted
#: (the scheduler's first backoff, 1 s, has run out, as for a pod that waits), and the deleted
#: pod has run at least the agent's ``settings.slots.orphan_grace_s`` (a broker runs for minutes; a
#: pod deleted sooner waits for its claim to be that old, see docs/benchmarks.md); plus a random
#: part up to ``SETTLE_SPREAD_S`` so the delete does not fall in step with the holder's sweep.
SETTLE_S: Final = 1.0
SETTLE_SPREAD_S: Final = 1.0
#: How long the agents' CPU is sampled with a pod waiting and with none.
CPU_WINDOW_S: Final = 5.0

#: The steps, in the order a hand-off goes through them.
STEPS: Final = ("freed", "released", "reserved", "bound", "running", "claimed")
LABELS: Final = {
    "freed": "slot freed in deviceUsage by the holder",
    "released": "reservation given back by the holder",
    "reserved": "slot reserved for the waiting node",
    "bound": "waiting pod bound by the scheduler",
    "running": "waiting pod Running",
    "claimed": "slot claimed in deviceUsage by the waiting node",
}


@dataclass
class Timeline:
    """When each step of one hand-off was seen, in seconds after the delete."""

    slot: str
    holder: str
    waiter: str
    pod: str
    started: float
    seen: dict[str, float] = field(default_factory=dict)

    def mark(self, step: str) -> None:
        self.seen.setdefault(step, time.monotonic() - self.started)


class Observer:
    """Watches the Instance and the namespace's pods; marks the current timeline's steps."""

    def __init__(self, kube: AsyncClient, namespace: str, instance: str) -> None:
        self._kube, self._ns, self._instance = kube, namespace, instance
        self.current: Timeline | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._instances()), asyncio.create_task(self._pods())]

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)

    async def _instances(self) -> None:
        async for _, obj in self._kube.watch(
            InstanceResource, namespace=self._ns, fields={"metadata.name": self._instance}
        ):
            t = self.current
            if t is None:
                continue
            body = as_dict(obj)
            usage = (body.get("spec") or {}).get("deviceUsage") or {}
            reservations = (body.get("status") or {}).get("reservations") or {}
            value = str(usage.get(t.slot) or "")
            if value == "":
                t.mark("freed")
            if "freed" in t.seen and t.waiter in value:
                t.mark("claimed")
            holder = reservations.get(t.slot)
            if holder != t.holder:
                t.mark("released")
            if holder == t.waiter:
                t.mark("reserved")

    async def _pods(self) -> None:
        async for _, pod in self._kube.watch(Pod, namespace=self._ns):
            t = self.current
            if t is None or pod.metadata is None or pod.metadata.name != t.pod:
                continue
            if pod.spec is not None and pod.spec.nodeName:
                t.mark("bound")
            if running(pod):
                t.mark("running")


async def create_rate(kube: AsyncClient, namespace: str) -> float:
    """ConfigMaps the API server creates per second here and now (the machine's speed)."""
    names = iter(range(SPEED_OBJECTS))

    async def worker() -> None:
        for i in names:
            await kube.create(cast(ConfigMap, ConfigMap.from_dict({
                "metadata": {"name": f"speed-{i}", "namespace": namespace}, "data": {"k": "v"}})))

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(SPEED_CONCURRENCY)))
    return SPEED_OBJECTS / (time.monotonic() - started)


async def _demand(kube: AsyncClient, namespace: str, instance: str) -> dict[str, int]:
    obj = as_dict(await kube.get(InstanceResource, instance, namespace=namespace))
    return dict((obj.get("status") or {}).get("demand") or {})


async def _wait_steps(timeline: Timeline) -> None:
    async def done() -> bool:
        return all(step in timeline.seen for step in STEPS)

    await wait_until(done, what=f"every step of the hand-off of {timeline.slot}",
                     within=STEP_DEADLINE_S)


async def _hand_off(
    kube: AsyncClient, observer: Observer, ns: str, instance: str, *,
    holder: AgentNode, waiter: AgentNode, run: int, held: dict[str, tuple[str, float]],
    rng: random.Random,
) -> Timeline:
    """One hand-off: a pod pinned to ``waiter`` waits; ``holder``'s pod ``held`` is deleted."""
    resource = f"edgeplug.io/{instance}"
    new = f"{waiter.name[-8:]}-r{run:03d}"
    await kube.create(pinned_pod(ns, new, resource=resource, node=waiter.name))
    await wait_pod(kube, ns, new, unschedulable, "Unschedulable")

    async def demanded() -> bool:
        return (await _demand(kube, ns, instance)).get(waiter.name) == 1

    await wait_until(demanded, what=f"status.demand of {waiter.name}")
    old = next(pod for pod, (node, _) in held.items() if node == holder.name)
    settle = max(SETTLE_S, held[old][1] + SlotSettings().orphan_grace_s - time.monotonic())
    await asyncio.sleep(settle + rng.uniform(0.0, SETTLE_SPREAD_S))
    slot = holder.emulator.allocations(ns, old)[0].device_ids[0]
    timeline = Timeline(slot=slot, holder=holder.name, waiter=waiter.name, pod=new,
                        started=time.monotonic())
    observer.current = timeline
    await kube.delete(Pod, old, namespace=ns)
    await _wait_steps(timeline)
    observer.current = None
    del held[old]
    held[new] = (waiter.name, timeline.started + timeline.seen["running"])
    return timeline


@dataclass
class Result:
    """One configuration's hand-offs, and the agents' CPU with and without a pod waiting."""

    timelines: list[Timeline]
    rate: float
    cpu_waiting: float  # CPU seconds per second of this process (both agents) while one waits
    cpu_quiet: float  # the same with every slot held and nobody waiting


async def _cpu_per_s() -> float:
    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(CPU_WINDOW_S)
    return (time.process_time() - cpu) / (time.monotonic() - wall)


async def _cpu_waiting(kube: AsyncClient, ns: str, instance: str, waiter: AgentNode) -> float:
    """This process's CPU while a pod pinned to ``waiter`` waits for a slot the other holds."""
    name = f"{waiter.name[-8:]}-cpu"
    await kube.create(pinned_pod(ns, name, resource=f"edgeplug.io/{instance}", node=waiter.name))

    async def demanded() -> bool:
        return (await _demand(kube, ns, instance)).get(waiter.name) == 1

    await wait_until(demanded, what=f"status.demand of {waiter.name}")
    cpu = await _cpu_per_s()
    await kube.delete(Pod, name, namespace=ns)

    async def quiet() -> bool:
        return not await _demand(kube, ns, instance)

    await wait_until(quiet, what="status.demand cleared")
    return cpu


async def measure(plane: ControlPlane, runs: int, *, seed: int) -> Result:
    """``runs`` hand-offs, alternating direction; the API server's create rate; CPU."""
    kube = AsyncClient(KubeConfig.from_file(str(plane.kubeconfig)))
    nodes = AgentNodes(kube=kube, kubeconfig=plane.kubeconfig)
    ns = f"bench-handoff-{uuid.uuid4().hex[:6]}"
    rng = random.Random(seed)
    try:
        await kube.create(cast(Namespace, Namespace.from_dict({"metadata": {"name": ns}})))
        await wait_service_account(kube, ns)
        rate = await create_rate(kube, ns)
        a, b = await nodes.start(), await nodes.start()
        instance = await create_instance(kube, ns, configuration=CONFIGURATION, digest=DIGEST,
                                         nodes=[a.name, b.name], capacity=CAPACITY, shared=True)
        for node in (a, b):
            await node.table.put(node_device(ns, CONFIGURATION, instance))
        resource = f"edgeplug.io/{instance}"
        held: dict[str, tuple[str, float]] = {}  # pod → its node, when it was Running
        for i in range(CAPACITY):  # every slot held, all on a
            name = f"{a.name[-8:]}-init{i}"
            await kube.create(pinned_pod(ns, name, resource=resource, node=a.name))
            await wait_pod(kube, ns, name, running, "Running", within=STEP_DEADLINE_S)
            held[name] = (a.name, time.monotonic())
        observer = Observer(kube, ns, instance)
        observer.start()
        timelines = []
        try:
            for run in range(runs):
                holder, waiter = (a, b) if run % 2 == 0 else (b, a)
                timelines.append(await _hand_off(kube, observer, ns, instance, holder=holder,
                                                 waiter=waiter, run=run, held=held, rng=rng))
        finally:
            await observer.stop()
        quiet = await _cpu_per_s()
        # A pod waits on the node that holds none, for a slot the other holds.
        holders = {node for node, _ in held.values()}
        waiting = await _cpu_waiting(kube, ns, instance, b if a.name in holders else a)
        return Result(timelines=timelines, rate=rate, cpu_waiting=waiting, cpu_quiet=quiet)
    finally:
        await nodes.stop_all()
        with contextlib.suppress(Exception):
            await kube.delete(Namespace, ns)
        await kube.close()


def report(label: str, result: Result, out: Callable[[str], Any] = print) -> None:
    """Medians and p95 of every step, where the time goes between them, and the CPU."""
    timelines = result.timelines
    out(f"[{label}] API server speed in this run: {result.rate:.0f} ConfigMap creates/s "
        f"({SPEED_CONCURRENCY} concurrent)")
    for step in STEPS:
        out(summary(f"[{label}] hand-off, delete → {LABELS[step]}",
                    [t.seen[step] for t in timelines], unit="s", scale=1.0))
    ordered = sorted(STEPS, key=lambda s: statistics.median(t.seen[s] for t in timelines))
    previous, gaps = "delete", []
    for step in ordered:
        gap = statistics.median(t.seen[step] - t.seen.get(previous, 0.0) for t in timelines)
        gaps.append(f"{previous} → {step} {gap:.2f} s")
        previous = step
    out(f"[{label}] where the time goes (median of each gap): " + "; ".join(gaps))
    out(f"[{label}] CPU of both agents' device-plugin side (one process): "
        f"{result.cpu_quiet * 1000:.1f} ms/s with every slot held and nobody waiting, "
        f"{result.cpu_waiting * 1000:.1f} ms/s while a pod on the other node waits")


def main(runs: int, *, compare: bool = True, seed: int = 13) -> None:
    """The hand-off as built (sweep every ``settings.slots.sweep_awaited_s`` while a pod waits)
    and, with ``compare``, with the holder sweeping only every ``settings.slots.sweep_s`` as
    before."""
    slots = SlotSettings()
    configs = [("awaited sweep", slots.sweep_awaited_s)]
    if compare:
        configs.append(("1 s sweep only", slots.sweep_s))
    for label, every in configs:
        # The agents free orphans after the product's grace, not the tests' short one.
        tree = replace(current(), slots=replace(slots, sweep_awaited_s=every))
        with in_use(tree), \
                mock.patch.object(agent_nodes, "TEST_ORPHAN_GRACE_S", slots.orphan_grace_s), \
                ControlPlane() as plane:
            result = asyncio.run(measure(plane, runs, seed=seed))
        report(label, result)
