"""A virtual id handed out again is never freed on evidence from before the hand-out.

The kubelet re-uses a configuration-level device id (``<configuration>-v<k>``) as soon as the
pod that held it has left. The agent maps it onto the slot the id still holds in
``deviceUsage`` (``C:<virtual id>:<node>``, the very value the departed pod's claim had), so a
pod-resources ``List`` taken just before that ``Allocate`` (the new pod not listed yet) looks
exactly like "its pod ended". Before the hand-out count (agent/deviceplugins/slots/rules.py,
"hand-outs"), the orphan freer freed the slot a few milliseconds after handing it out, and the
Instance plugin then gave the same slot to a second pod.

Real parts: the API server (the Instance and its conditioned writes), the agent's own
configuration backend, ledger and orphan freer, and a pod-resources server over a real gRPC Unix
socket. That server stands for the kubelet's pod-resources ``List`` at the moment it matters: it
answers from the pods the test says are live, and holds its answer until the test lets it go,
so the ``Allocate`` lands between the ``List`` being asked and its answer being acted on.

A slot no ``List`` ever showed held (its pod lived less than a sweep interval) is freed as an
orphan one grace after the first ``List`` since its latest hand-out missed it. The freer used to
start that clock only once the claim was a grace old: two graces, a 10.4 s hand-off in issue
21's third case. That test runs the freer on the test's clock.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import grpc
import grpc.aio
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from agent.deviceplugins.kubelet.feed import AdvertisedDevice, DeviceFeed
from agent.deviceplugins.kubelet.podresources import PodResourcesClient
from agent.deviceplugins.slots.backends import ConfigurationBackend
from agent.deviceplugins.slots.bound_pods import BoundPodsReader
from agent.deviceplugins.slots.freeing import OrphanFreer
from agent.deviceplugins.slots.ledger import SlotLedger
from agent.deviceplugins.slots.rules import SlotRef
from agent.discovery.node_devices import NodeDevice
from agent.kube.client import InstanceResource
from agent.kube.node_reads import NodeReads
from agent.kubeletapi import podresources_v1_pb2 as pr
from agent.kubeletapi import podresources_v1_pb2_grpc as pr_grpc
from agent.metrics import AgentMetrics
from crds.instance import Instance, SlotUsage
from discovery_handlers.contract import HEALTHY, Device
from tests.harness.agent_nodes import create_instance, read_instance
from tests.harness.kube_waits import until
from tests.harness.unix_grpc import SocketServer

pytestmark = pytest.mark.timeout(60)

NODE = "node-a"
CONFIGURATION = "reuse"
RESOURCE = f"edgeplug.io/{CONFIGURATION}"
VID = f"{CONFIGURATION}-v0"


class GatedPodResources(pr_grpc.PodResourcesListerServicer):
    """``List`` answers with the virtual ids the test calls live, once ``gate`` is open."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        #: The pod the live ids are listed for: (namespace, name); None: no pod is listed (a
        #: kubelet that has not admitted its pods again since it restarted).
        self.pod: tuple[str, str] | None = ("ns", "broker")
        self.gate = asyncio.Event()
        self.gate.set()
        self.asked = 0

    async def List(
        self, request: pr.ListPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.ListPodResourcesRequest, pr.ListPodResourcesResponse],
    ) -> pr.ListPodResourcesResponse:
        live, pod = sorted(self.live), self.pod  # what the kubelet knows when it is asked
        self.asked += 1
        await self.gate.wait()
        if pod is None:
            return pr.ListPodResourcesResponse()
        devices = [pr.ContainerDevices(resource_name=RESOURCE, device_ids=live)] if live else []
        return pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(
            name=pod[1], namespace=pod[0],
            containers=[pr.ContainerResources(name="c", devices=devices)])])


    async def Get(
        self, request: pr.GetPodResourcesRequest,
        context: grpc.aio.ServicerContext[pr.GetPodResourcesRequest, pr.GetPodResourcesResponse],
    ) -> pr.GetPodResourcesResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent only lists")
        raise AssertionError("abort returned")

    async def GetAllocatableResources(
        self, request: pr.AllocatableResourcesRequest,
        context: grpc.aio.ServicerContext[pr.AllocatableResourcesRequest,
                                          pr.AllocatableResourcesResponse],
    ) -> pr.AllocatableResourcesResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the agent only lists")
        raise AssertionError("abort returned")


class OneNodeWorld:
    """The slot service's view for one Instance on ``NODE`` (what ``SlotService`` keeps), with
    real ledgers on the API server and the real freer."""

    node = NODE

    def __init__(self, kube: AsyncClient, instance: Instance) -> None:
        self.metrics = AgentMetrics()
        self.instances = {instance.name: instance}
        self.ledgers: dict[str, SlotLedger] = {}
        self._kube = kube
        self.freer: OrphanFreer | None = None
        self.device_record = NodeDevice(
            instance=instance.name, namespace=instance.namespace, configuration=CONFIGURATION,
            device=Device(id="cam0"), health=HEALTHY)

    def ledger(self, namespace: str, instance: str) -> SlotLedger:
        if instance not in self.ledgers:
            self.ledgers[instance] = SlotLedger(
                client=self._kube, node=NODE, namespace=namespace, name=instance)
        return self.ledgers[instance]

    def instance(self, namespace: str, instance: str) -> Instance | None:
        return self.instances.get(instance)

    def remember(self, instance: Instance) -> None:
        self.instances[instance.name] = instance

    def device(self, namespace: str, instance: str) -> NodeDevice | None:
        return self.device_record if instance in self.instances else None

    def configuration_instances(self, namespace: str, configuration: str) -> list[Instance]:
        return list(self.instances.values())

    def slots_changed(self, refs: Iterable[SlotRef]) -> None:
        assert self.freer is not None
        self.freer.claimed(refs)

    @property
    def answers_before_recording(self) -> bool:
        return False  # every hand-out is a conditioned claim: the test needs no recorder

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        raise AssertionError("the fast path is off in this test")


@pytest.fixture
async def pod_resources(tmp_path: Path) -> AsyncIterator[tuple[GatedPodResources, Path]]:
    servicer = GatedPodResources()
    socket = tmp_path / "pod-resources.sock"
    server = SocketServer(
        socket, add_services=lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(
            servicer, s), stop_grace_s=0.1)
    await server.start()
    yield servicer, socket
    servicer.gate.set()
    await server.stop()


@dataclass
class OneVirtualId:
    """One Instance of capacity 1 on ``NODE``, its slot reserved there (what the node's first
    reconcile pass does), the configuration backend handing out ``VID``, and the real freer
    asking the pod-resources socket given."""

    kube: AsyncClient
    namespace: str
    name: str
    world: OneNodeWorld
    client: PodResourcesClient
    backend: ConfigurationBackend

    @classmethod
    async def create(
        cls, kube: AsyncClient, namespace: str, socket: Path, *, digest: str,
        nodes: tuple[str, ...] = (NODE,),
    ) -> OneVirtualId:
        name = await create_instance(kube, namespace, configuration=CONFIGURATION,
                                     digest=digest, nodes=list(nodes), capacity=1, shared=True)
        world = OneNodeWorld(kube, await read_instance(kube, namespace, name))
        client = PodResourcesClient(socket)
        world.freer = OrphanFreer(client=client, node=NODE, ledger=world.ledger)
        backend = ConfigurationBackend(
            world=world, namespace=namespace, configuration=CONFIGURATION,
            feed=DeviceFeed([AdvertisedDevice(VID)]))
        one = cls(kube, namespace, name, world, client, backend)
        ledger = world.ledger(namespace, name)
        async with ledger.lock:
            await ledger.reserve([one.slot])
        await one.current()
        return one

    @property
    def slot(self) -> str:
        return f"{self.name}-0"

    @property
    def usage(self) -> str:
        """The slot's ``deviceUsage`` value now (as the last ``current`` read it)."""
        return self.world.instances[self.name].spec.device_usage.get(self.slot, "")

    async def current(self) -> Instance:
        self.world.remember(fresh := await read_instance(self.kube, self.namespace, self.name))
        return fresh

    async def sweep(self) -> None:
        assert self.world.freer is not None
        await self.world.freer.sweep([await self.current()],
                                     {(self.namespace, CONFIGURATION): RESOURCE})
        await self.current()


#: ``deviceUsage`` of the slot while ``VID`` holds it.
HELD = SlotUsage.by_configuration(VID, NODE).format()


async def test_a_virtual_id_handed_out_again_is_not_freed_by_a_list_taken_before(
    kube: AsyncClient, namespace: str,
    pod_resources: tuple[GatedPodResources, Path],
) -> None:
    servicer, socket = pod_resources
    one = await OneVirtualId.create(kube, namespace, socket, digest="a1b2c3")
    world, backend, client = one.world, one.backend, one.client
    assert world.freer is not None
    slot, held, current = one.slot, HELD, one.current
    resources = {(namespace, CONFIGURATION): RESOURCE}
    try:
        await current()
        # The first pod gets the id, and a sweep sees it live.
        await backend.allocate([[VID]])
        assert (await current()).spec.device_usage[slot] == held
        servicer.live = {VID}
        await world.freer.sweep([await current()], resources)

        # That pod leaves; a List is asked (the kubelet lists nothing now) and, before its
        # answer is acted on, the kubelet hands the same id to a new pod.
        servicer.live = set()
        servicer.gate.clear()
        asked = servicer.asked
        sweep = asyncio.create_task(world.freer.sweep([await current()], resources))
        await until(lambda: servicer.asked > asked, what="the freer to ask pod-resources")
        await backend.allocate([[VID]])
        servicer.gate.set()
        await sweep

        # The new pod holds the slot: the evidence from before its hand-out frees nothing.
        assert (await current()).spec.device_usage[slot] == held, (
            "the slot handed to the new pod was freed on a List taken before the hand-out")

        # Once the new pod is gone too (listed live, then not), the slot is freed as before.
        servicer.live = {VID}
        await world.freer.sweep([await current()], resources)
        servicer.live = set()
        await world.freer.sweep([await current()], resources)
        assert (await current()).spec.device_usage[slot] == ""
    finally:
        await client.close()


#: The orphan grace of the one-grace test, and a step smaller than anything the freer could
#: mistake for it.
GRACE_S = 5.0
TICK_S = 0.01


class Clock:
    """The freer's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_slot_no_list_showed_held_is_freed_one_grace_after_the_first_list_missed_it(
    kube: AsyncClient, namespace: str,
    pod_resources: tuple[GatedPodResources, Path],
) -> None:
    _, socket = pod_resources  # no pod listed, ever
    one = await OneVirtualId.create(kube, namespace, socket, digest="0e1f2a")
    clock = Clock()
    one.world.freer = OrphanFreer(client=one.client, node=NODE, ledger=one.world.ledger,
                                  grace=GRACE_S, clock=clock)
    try:
        # A pod gets the id and ends before any List shows it (servicer.live stays empty).
        await one.backend.allocate([[VID]])
        await one.sweep()  # the first List since the hand-out misses it: the clock starts
        assert one.usage == HELD

        clock.now = GRACE_S - TICK_S
        await one.sweep()
        assert one.usage == HELD, "freed before a grace of absence"

        # The id is handed out again: the clock starts over at the next List.
        await one.backend.allocate([[VID]])
        clock.now = GRACE_S + TICK_S
        await one.sweep()
        assert one.usage == HELD, "freed on absence counted from before its latest hand-out"

        clock.now = 2 * GRACE_S
        await one.sweep()
        assert one.usage == HELD, "freed before a grace since the hand-out's first List"

        clock.now = 2 * GRACE_S + 2 * TICK_S
        await one.sweep()
        assert one.usage == "", "still held a grace after every List since its hand-out missed it"
    finally:
        await one.client.close()


OTHER = "node-b"


async def test_a_slot_another_node_awaits_is_freed_once_every_pod_here_is_accounted_for(
    kube: AsyncClient, namespace: str,
    pod_resources: tuple[GatedPodResources, Path],
) -> None:
    """A pod that lived less than a sweep interval left a slot no
    ``List`` ever showed held, while node-b's pod waited for it. With per-pod evidence (the
    pods bound here, read after the ``List``) the slot goes at the first sweep that accounts
    for every pod here asking for the resource, not one orphan grace later; while a pod bound
    here is not listed with its device (the kubelet between ``Allocate`` and its record), the
    slot stays. The clock never moves: only the evidence frees it."""
    servicer, socket = pod_resources
    one = await OneVirtualId.create(kube, namespace, socket, digest="4d5e6f", nodes=(NODE, OTHER))
    one.world.freer = OrphanFreer(client=one.client, node=NODE, ledger=one.world.ledger,
                                  grace=GRACE_S, clock=Clock(),
                                  bound_pods=BoundPodsReader(reads=NodeReads(kube), node=NODE))
    await kube.patch(InstanceResource.Status, one.name, {"status": {"demand": {OTHER: 1}}},
                     namespace=namespace, patch_type=PatchType.MERGE)
    first, second = (f"short-{uuid.uuid4().hex[:6]}" for _ in range(2))

    async def bind(pod: str) -> None:
        await kube.create(cast(Pod, Pod.from_dict({
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c", "image": "c:1", "resources": {"limits": {RESOURCE: "1"}}}]}})))

    try:
        await bind(first)
        await one.backend.allocate([[VID]])
        await one.sweep()
        assert one.usage == HELD, "freed while a pod bound here was not listed with its device"
        # The first pod ends before any List shows it; the kubelet hands the id to a second
        # pod, which pod-resources does not list yet (the first pod's record is gone).
        await kube.delete(Pod, first, namespace=namespace, grace_period=0)
        await bind(second)
        await one.backend.allocate([[VID]])
        await one.sweep()
        assert one.usage == HELD, "freed while the pod it was handed to was not listed yet"
        # The second pod is listed with another device of the resource: it cannot hold this
        # slot (it asks for one device), and no other pod bound here asks for the resource.
        servicer.pod, servicer.live = (namespace, second), {f"{CONFIGURATION}-v9"}
        await one.sweep()
        assert one.usage == "", "a slot no live pod can hold, awaited by node-b, was kept"
    finally:
        await one.client.close()


async def test_a_restarted_kubelet_frees_no_slot_of_a_pod_it_has_not_admitted_again(
    kube: AsyncClient, namespace: str, tmp_path: Path,
) -> None:
    """A restarted kubelet serves pod-resources before it has re-admitted the pods it
    still runs, and lists none of them until then. On a loaded machine that took the harness's
    kubelet longer than the orphan grace, and the freer freed the slot of a running pod (the
    configuration-level id it held was then offered again). A slot past its grace stays while a
    pod bound here that asks for its resource is missing from the ``List``; once that pod is
    listed again and then ends, its slot is freed at once, as before."""
    servicer = GatedPodResources()
    socket = tmp_path / "pod-resources.sock"
    kubelet = SocketServer(
        socket, add_services=lambda s: pr_grpc.add_PodResourcesListerServicer_to_server(
            servicer, s), stop_grace_s=0.1)
    await kubelet.start()
    one = await OneVirtualId.create(kube, namespace, socket, digest="7a8b9c")
    clock = Clock()
    one.world.freer = OrphanFreer(client=one.client, node=NODE, ledger=one.world.ledger,
                                  grace=GRACE_S, clock=clock,
                                  bound_pods=BoundPodsReader(reads=NodeReads(kube), node=NODE))
    holder = f"holder-{uuid.uuid4().hex[:6]}"
    try:
        await kube.create(cast(Pod, Pod.from_dict({
            "metadata": {"name": holder, "namespace": namespace},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c", "image": "c:1", "resources": {"limits": {RESOURCE: "1"}}}]}})))
        await one.backend.allocate([[VID]])
        servicer.pod, servicer.live = (namespace, holder), {VID}
        await one.sweep()
        assert one.usage == HELD

        # The kubelet restarts: pod-resources on a new socket, no pod listed for longer than
        # the grace (it has not re-admitted the holder yet).
        await kubelet.stop()
        servicer.pod, servicer.live = None, set()
        await kubelet.start()
        await one.sweep()
        clock.now = 2 * GRACE_S
        await one.sweep()
        assert one.usage == HELD, (
            "freed the slot of a running pod the restarted kubelet had not admitted again")

        # Admitted again, the holder is listed with its id; it ends, and its slot goes at once.
        servicer.pod, servicer.live = (namespace, holder), {VID}
        await one.sweep()
        await kube.delete(Pod, holder, namespace=namespace, grace_period=0)
        servicer.pod, servicer.live = None, set()
        await one.sweep()
        assert one.usage == "", "the slot of a pod that ended stayed held"
    finally:
        servicer.gate.set()
        await one.client.close()
        await kubelet.stop()


async def test_a_list_the_old_kubelet_answered_as_the_new_one_started_frees_nothing(
    kube: AsyncClient, namespace: str, tmp_path: Path,
) -> None:
    """The first ``List`` after a pod's ``Allocate`` was asked of the old kubelet,
    which listed the pod; by the time the agent read the socket's identity again, the kubelet
    had restarted. The freer took that answer as the new kubelet's, so the new one's next
    answer, which leaves out every pod it has not admitted again yet, read as the pod's end:
    the slot of a running pod was freed at once. An answer during which the kubelet changed is
    not used at all.

    The agent tells kubelets apart by their socket's identity alone: here a second server takes
    the socket's path while the first answers, and the first, which the agent's channel still
    reaches, then answers as the restarted kubelet does (no pod listed)."""
    kubelet = GatedPodResources()
    socket = tmp_path / "pod-resources.sock"

    def serving(servicer: GatedPodResources) -> SocketServer:
        return SocketServer(socket, add_services=lambda s: pr_grpc.
                            add_PodResourcesListerServicer_to_server(servicer, s),
                            stop_grace_s=0.1)

    first, restarted = serving(kubelet), serving(GatedPodResources())
    await first.start()
    one = await OneVirtualId.create(kube, namespace, socket, digest="5c6d7e")
    clock = Clock()
    one.world.freer = OrphanFreer(client=one.client, node=NODE, ledger=one.world.ledger,
                                  grace=GRACE_S, clock=clock,
                                  bound_pods=BoundPodsReader(reads=NodeReads(kube), node=NODE))
    holder = f"holder-{uuid.uuid4().hex[:6]}"
    try:
        await kube.create(cast(Pod, Pod.from_dict({
            "metadata": {"name": holder, "namespace": namespace},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c", "image": "c:1", "resources": {"limits": {RESOURCE: "1"}}}]}})))
        await one.backend.allocate([[VID]])
        # The old kubelet takes the List and lists the pod; before the answer is read, the
        # kubelet restarts: a new socket file at the path.
        kubelet.pod, kubelet.live = (namespace, holder), {VID}
        kubelet.gate.clear()
        sweep = asyncio.create_task(one.sweep())
        await until(lambda: kubelet.asked > 0, what="the freer to ask the old kubelet")
        socket.rename(tmp_path / "old-pod-resources.sock")
        await restarted.start()
        kubelet.gate.set()
        await sweep

        # The restarted kubelet lists no pod until it has admitted the holder again.
        kubelet.pod, kubelet.live = None, set()
        await one.sweep()
        assert one.usage == HELD, "the new kubelet's first answer freed the running pod's slot"
        clock.now = 2 * GRACE_S
        await one.sweep()
        assert one.usage == HELD, "freed while the holder, bound here, was not listed"
        assert kubelet.asked == 3
    finally:
        kubelet.gate.set()
        await one.client.close()
        await restarted.stop()
        await first.stop()
