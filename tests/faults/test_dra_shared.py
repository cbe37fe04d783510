"""One shared device of capacity 2 that three nodes see, allocated by the real kube-scheduler
(the DRA default), while pods churn on all three nodes and the agents, the controller and the
API server are restarted; and the controller's pinned demand in that mode.

Real parts: kube-scheduler (DynamicResources with consumable capacity and extended-resource
mapping), kube-controller-manager (it deallocates and deletes a gone pod's claim), the agents
as ``python -m agent.main`` with ``DRA=on`` (discovery, the health marks and the local
ResourceSlice publisher; no kubelet plugin: ``DRA_REGISTRY_DIR`` empty) and their device
plugins on (which must leave the shared device alone), the controller as
``python -m controller.main --dra`` (the Configuration's choice, its DeviceClass mapping
``edgeplug.io/<configuration>`` and the shared device's ResourceSlice), on a
control plane of this module's own. The nodes are Ready Nodes without a kubelet
(``tests.harness.dra.ready_nodes``): the scheduler binds pods to them and nothing runs them, so
"a pod has its slot" is its claim allocated and itself bound. The Configuration does not choose
an allocator: the default.

Pods ask for ``edgeplug.io/<configuration>: 1`` in their limits, each pinned to one node by
``kubernetes.io/hostname``; two hold the device's two slots and two more wait. Each turn the
oldest holder is deleted; a waiting pod (on whichever node) must then be given the slot, and a
new pod is created on the deleted one's node, to wait in turn. Between turns the agent of the
device's first node (which published its slice before the controller did) is SIGKILLed and,
turns later, started again; then the controller, which publishes the device's slice; then the
kube-apiserver is restarted. ``tests.harness.dra_faults.ClaimRecorder``
watches every ResourceClaim, Pod and Instance throughout: never more than 2 allocations of the
device (each one ``slots: 1``), no pod failed, waiting pods Pending Unschedulable, no
``deviceUsage``/``reservations``/``demand`` on the Instance. The hand-off (the freed claim
deallocated or deleted → the waiting pod's claim allocated and the pod bound) is measured and
printed per phase, with pod deleted → waiting pod bound beside it; only a generous bound is
asserted, not a timing (docs/slots.md, DRA mode, has the figures).

Not in the compatibility run: v1.35.4 serves no extended-resource mapping, so the
Configuration falls back to device plugins there and nothing here would be allocated.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from agent.dra import slices
from agent.kube.client import InstanceResource, as_dict
from crds.naming import configuration_resource_name, instance_name
from crds.pinning import PINNED_DEMAND_ANNOTATION
from crds.resources import ConfigurationResource
from tests.faults.cluster import delete_pod
from tests.harness import dra as h
from tests.harness.agent_process import AgentSubprocess, debug_echo_configuration, eventually
from tests.harness.controller_process import FAST_ARGS, ControllerProcess, install_peering_crds
from tests.harness.controlplane import ControlPlane
from tests.harness.dra_faults import ClaimRecorder, freed_at, had_slot_at, summary
from tests.harness.kube_waits import wait_service_account

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CAPACITY = 2
#: Pods waiting beside the holders.
WAITERS = 2
#: Turns in each phase of the faults (at least; a restart's phase lasts until it is back).
FAULT_TURNS = 3
MAX_TURNS = 200
#: Generous: the scheduler's backoff on a loaded machine; the figure is what the test reports.
HANDOFF_WITHIN_S = 60.0
#: The scheduler tries a new pod at once; its verdict comes within this.
UNSCHEDULABLE_WITHIN_S = 60.0
SETUP_S = 60.0
#: kube-scheduler's default podInitialBackoffSeconds.
INITIAL_BACKOFF_S = 1.0


def _agent(cp: ControlPlane, node: str, ns: str, tmp: Path, plugin_dir: Path
           ) -> AgentSubprocess:
    """The agent as a process: DRA on (slices, no kubelet plugin) and its device plugins on,
    in a directory of its own (no kubelet registers them; the agent must not serve the shared
    device that way anyhow)."""
    (tmp / node / "plugins").mkdir(parents=True)
    (tmp / node / "cdi").mkdir()
    return AgentSubprocess(cp, node_name=node, namespace=ns, log_path=tmp / f"agent-{node}.log",
                           serve_device_plugins=True, plugin_dir=plugin_dir,
                           extra_env={"DRA": "on", "DRA_REGISTRY_DIR": "",
                                      "DRA_PLUGINS_DIR": str(tmp / node / "plugins"),
                                      "CDI_SPEC_DIR": str(tmp / node / "cdi")})


async def _published(client: AsyncClient, pool: str, device: str, nodes: list[str]
                     ) -> dict[str, Any] | None:
    """The device in its pool's one slice once it is usable on every node."""
    found = await h.pool_slices(client, pool)
    if len(found) != 1 or h.device_nodes(found, device) != nodes:
        return None
    return dict(h.pool_devices(found)[device])


async def _chosen(client: AsyncClient, ns: str, cfg: str) -> str | None:
    body = as_dict(await client.get(ConfigurationResource, cfg, namespace=ns))
    return (body.get("status") or {}).get("sharedDeviceAllocation")


async def _mapped(client: AsyncClient, ns: str, cfg: str) -> str | None:
    body = await h.device_class(client, ns, cfg)
    return None if body is None else body["spec"].get("extendedResourceName")


async def _advertised(client: AsyncClient, node: str) -> dict[str, str]:
    """The Node's edgeplug.io resources in ``status.allocatable`` (a device plugin's)."""
    body = as_dict(await client.get(Node, node))
    return {k: v for k, v in ((body.get("status") or {}).get("allocatable") or {}).items()
            if k.startswith("edgeplug.io/")}


async def _publisher(client: AsyncClient, ns: str, instance: str) -> str:
    """The first of a shared Instance's nodes (whose agent published the device's slice
    before the controller did)."""
    body = as_dict(await client.get(InstanceResource, instance, namespace=ns))
    return str(sorted(body["spec"]["nodes"])[0])


@pytest.fixture(scope="module")
def own_plane() -> Iterator[ControlPlane]:
    """A control plane of this module's own: its API server is restarted mid-churn, which
    would disturb the session's other tests."""
    with ControlPlane() as plane:
        install_peering_crds(plane)
        yield plane


@pytest.fixture
async def kube(own_plane: ControlPlane) -> AsyncIterator[AsyncClient]:
    client = AsyncClient(KubeConfig.from_file(str(own_plane.kubeconfig)))
    yield client
    await client.close()


def _pod(ns: str, name: str, resource: str, node: str) -> Pod:
    """An Akri-style pod: ``resource: 1`` in its limits, nothing else edgeplug-specific; held
    to ``node`` by its hostname label."""
    body = h.extended_resource_pod(name, resource)
    body["metadata"]["namespace"] = ns
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return cast(Pod, Pod.from_dict(body))


@dataclass
class Turn:
    """One round: the holder deleted, the waiting pod that got its slot, and the phase."""

    phase: str
    victim: str
    deleted: float
    taker: str = ""


@dataclass
class Churn:
    """Two holders, two waiters; each ``turn`` deletes the oldest holder, waits for a waiting
    pod to be given the slot and adds a new waiter on the deleted pod's node."""

    client: AsyncClient
    namespace: str
    nodes: list[str]
    resource: str
    recorder: ClaimRecorder
    live: list[tuple[str, str]] = field(default_factory=list)  # (pod, node), oldest first
    turns: list[Turn] = field(default_factory=list)
    made: int = 0

    async def add(self, node: str) -> str:
        name = f"p{self.made}"
        self.made += 1
        self.live.append((name, node))
        await self.client.create(_pod(self.namespace, name, self.resource, node))
        return name

    async def start(self) -> None:
        for i in range(CAPACITY + WAITERS):
            await self.add(self.nodes[i % len(self.nodes)])

        def settled() -> bool:
            held = [p for p, _ in self.live if self.recorder.bound(p)]
            waiting = [p for p, _ in self.live if self.recorder.waiting(p)]
            return len(held) == CAPACITY and len(waiting) == WAITERS

        await self.recorder.wait_for(settled, what="two pods bound and two waiting",
                                     within=SETUP_S)

    async def turn(self, phase: str) -> None:
        recorder = self.recorder
        victim, node = next((p, n) for p, n in self.live if recorder.bound(p))
        waiting = [p for p, _ in self.live if recorder.waiting(p)]
        assert len(waiting) == WAITERS, recorder.describe_pods()
        turn = Turn(phase, victim, time.monotonic())
        self.turns.append(turn)
        await delete_pod(self.client, self.namespace, victim)
        self.live.remove((victim, node))
        what = f"turn {len(self.turns)} ({phase}): a waiting pod bound once {victim} went"
        await recorder.wait_for(lambda: any(recorder.bound(p) for p in waiting),
                                what=what, within=HANDOFF_WITHIN_S)
        turn.taker = next(p for p in waiting if recorder.bound(p))
        new = await self.add(node)
        await recorder.wait_for(lambda: recorder.waiting(new),
                                what=f"{new} Pending Unschedulable",
                                within=UNSCHEDULABLE_WITHIN_S)
        assert len(recorder.holding) == CAPACITY, recorder.holders()

    async def turns_until(self, phase: str, done: Callable[[], bool], what: str) -> None:
        """Turns while ``done()`` is false (at least ``FAULT_TURNS``)."""
        for count in range(MAX_TURNS):
            if count >= FAULT_TURNS and done():
                return
            await self.turn(phase)
        raise AssertionError(f"{what} not after {MAX_TURNS} turns")

    def figures(self) -> dict[str, tuple[list[float], list[float]]]:
        """Phase → (slot freed → taken, pod deleted → taken), in seconds."""
        found: dict[str, tuple[list[float], list[float]]] = {}
        for turn in self.turns:
            freed = freed_at(self.recorder, turn.victim)
            taken = had_slot_at(self.recorder, turn.taker)
            assert freed is not None, f"{turn.victim}'s claim never freed"
            assert taken is not None, turn
            handoff, by_deletion = found.setdefault(turn.phase, ([], []))
            handoff.append(taken - freed)
            by_deletion.append(taken - turn.deleted)
        return found


def _logged_since(path: Path, offset: int, text: str) -> Callable[[], bool]:
    def check() -> bool:
        with path.open("rb") as log:
            log.seek(offset)
            return text.encode() in log.read()
    return check


async def test_a_shared_device_is_never_allocated_past_its_capacity_through_faults(
    load: str, own_plane: ControlPlane, kube: AsyncClient, tmp_path: Path,
) -> None:
    """Run quiet and with every core busy (``load``: tests/faults/contention.py)."""
    cp, client = own_plane, kube
    tag = uuid.uuid4().hex[:6]
    ns = f"dra-{tag}"
    cp.kubectl("create", "namespace", ns)
    await wait_service_account(client, ns)
    nodes = sorted(f"dra-{tag}-{i}" for i in range(3))
    cfg = f"share-{tag}"  # DeviceClasses are cluster-wide: one mapping per test
    resource = configuration_resource_name(cfg, None)
    instance = instance_name(cfg, "cam", shared=True, node="")
    pool = slices.shared_pool(ns, cfg, instance)
    plugin_dirs = {n: Path(tempfile.mkdtemp(prefix="ep-", dir="/tmp")) for n in nodes}
    agents = {n: _agent(cp, n, ns, tmp_path, plugin_dirs[n]) for n in nodes}
    controller = ControllerProcess(cp, namespaces=[ns], log_path=tmp_path / "controller.log",
                                   extra_args=(*FAST_ARGS, "--dra"))
    async with h.ready_nodes(client, nodes):
        try:
            for agent in agents.values():
                agent.start()
            controller.start()
            cp.kubectl("apply", "-n", ns, "-f", "-", stdin=json.dumps(
                debug_echo_configuration(cfg, descriptions=["cam"], shared=True,
                                         capacity=CAPACITY)))
            assert await eventually(lambda: _chosen(client, ns, cfg), deadline=SETUP_S,
                                    what="the controller's choice") == "dra"
            assert await eventually(lambda: _mapped(client, ns, cfg), deadline=SETUP_S,
                                    what="the Configuration's DeviceClass") == resource
            device = slices.device_name(instance)
            published = await eventually(lambda: _published(client, pool, device, nodes),
                                         deadline=SETUP_S, what=f"{pool} usable on all nodes")
            assert published["capacity"]["slots"]["value"] == str(CAPACITY)
            async with ClaimRecorder(client, ns, slices.device_name(instance),
                                     CAPACITY) as recorder:
                churn = Churn(client, ns, nodes, resource, recorder)
                await churn.start()
                await _faults(cp, client, ns, instance, churn, agents, controller, tmp_path)
                recorder.assert_clean()
                assert recorder.instance_events > 0, "the Instance watch saw nothing"
                assert recorder.most == CAPACITY
                for node in nodes:
                    assert not await _advertised(client, node), f"{node} advertises it"
                assert recorder.relists >= 3, "the API server restart broke not every watch"
                _report(churn, load)
            assert await _chosen(client, ns, cfg) == "dra"
            after = await eventually(lambda: _published(client, pool, device, nodes),
                                     deadline=SETUP_S, what=f"{pool} still usable on all")
            assert after["capacity"]["slots"]["value"] == str(CAPACITY)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{await h.describe(client, ns)}") from None
        finally:
            controller.stop()
            for name, agent in agents.items():
                agent.stop()
                print(f"--- agent {name} ---\n"
                      f"{(tmp_path / f'agent-{name}.log').read_text()[-1500:]}")
            print(f"--- controller ---\n{controller.log_tail(20)}")
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            for directory in plugin_dirs.values():
                shutil.rmtree(directory, ignore_errors=True)


async def _faults(cp: ControlPlane, client: AsyncClient, ns: str, instance: str, churn: Churn,
                  agents: dict[str, AgentSubprocess], controller: ControllerProcess,
                  tmp: Path) -> None:
    for _ in range(FAULT_TURNS):
        await churn.turn("steady")

    publisher = await _publisher(client, ns, instance)
    agents[publisher].kill()
    for _ in range(FAULT_TURNS):
        await churn.turn("publishing agent SIGKILLed")
    log = tmp / f"agent-{publisher}.log"
    offset = log.stat().st_size
    agents[publisher].start()
    await churn.turns_until("publishing agent restarting",
                            _logged_since(log, offset, "discovery running on node"),
                            "the restarted agent's discovery")
    process = agents[publisher].process
    assert process is not None
    assert process.poll() is None, "the restarted agent exited"

    controller.kill()
    for _ in range(FAULT_TURNS):
        await churn.turn("controller SIGKILLed")
    offset = controller.log_path.stat().st_size
    controller.start()
    await churn.turns_until("controller restarting",
                            _logged_since(controller.log_path, offset,
                                          "every watch has listed"),
                            "the restarted controller's watches")

    await asyncio.to_thread(cp.restart, "kube-apiserver")
    for _ in range(FAULT_TURNS):
        await churn.turn("after the API server's restart")


def _report(churn: Churn, load: str) -> None:
    every: list[float] = []
    for phase, (handoff, by_deletion) in churn.figures().items():
        every += handoff
        print(f"figure ({load}, {phase}): claim freed -> waiting pod's claim allocated and "
              f"pod bound: {summary(handoff)}; pod deleted -> waiting pod bound: "
              f"{summary(by_deletion)}")
    # A waiter passed over once (the other waiter took that slot) failed one more scheduling
    # attempt, so its backoff (1 s, doubled per attempt) has grown: its hand-offs show whether
    # the scheduler waits that backoff out after the claim event requeues the pod.
    passed_over, in_backoff = [], []
    for index, turn in enumerate(churn.turns):
        seen = churn.recorder.pods[turn.taker].seen
        taken = had_slot_at(churn.recorder, turn.taker)
        freed = freed_at(churn.recorder, turn.victim)
        assert taken is not None
        assert freed is not None
        if any(t.deleted > seen for t in churn.turns[:index]):
            passed_over.append(taken - freed)
        failed = churn.recorder.pods[turn.taker].unschedulable
        if failed is not None and freed - failed < INITIAL_BACKOFF_S:
            in_backoff.append(taken - freed)
    print(f"figure ({load}): hand-offs to a pod passed over before: {summary(passed_over)}; "
          f"to a pod whose failed attempt was under {INITIAL_BACKOFF_S} s before the free "
          f"(inside its first backoff): {summary(in_backoff)}")
    cross = sum(1 for t in churn.turns
                if churn.recorder.pods[t.victim].node != churn.recorder.pods[t.taker].node)
    print(f"figure ({load}, all {len(every)} turns, {cross} across nodes): hand-off "
          f"{summary(every)}; under 1 s: {sum(s < 1 for s in every)} of {len(every)}; "
          f"most allocations at once {churn.recorder.most}, claim events "
          f"{churn.recorder.events}, watch relists {churn.recorder.relists}")


async def _demand(client: AsyncClient, node: str) -> dict[str, int] | None:
    body = as_dict(await client.get(Node, node))
    text = (body["metadata"].get("annotations") or {}).get(PINNED_DEMAND_ANNOTATION)
    return None if text is None else dict(json.loads(text))


async def test_no_pinned_demand_is_written_for_a_resource_the_scheduler_allocates(
    own_plane: ControlPlane, kube: AsyncClient, tmp_path: Path,
) -> None:
    """The Node's pinned-demand annotation is the device-plugin protocol's (docs/slots.md,
    compatibility mode): it tells an agent what pods pinned to its node wait for, so that its
    device plugins advertise a slot there. A Configuration whose shared devices the scheduler
    allocates has no device plugin to tell; its pods' requests must not be written on Nodes
    (a Node patch per pod change, on the default path). One Configuration of each allocator
    (an in-process agent discovers their devices, so the scheduler's class maps its
    resource); a pod pinned to the node asks each one's resource, the scheduler's first: once
    the device-plugin one's demand is written, the controller has seen both pods."""
    cp, client = own_plane, kube
    tag = uuid.uuid4().hex[:6]
    ns, node = f"dem-{tag}", f"dem-{tag}-0"
    cp.kubectl("create", "namespace", ns)
    await wait_service_account(client, ns)
    by_scheduler, by_plugins = f"sched-{tag}", f"plug-{tag}"
    pinned = debug_echo_configuration(by_plugins, descriptions=["cam"], shared=True)
    pinned["spec"]["sharedDeviceAllocation"] = "devicePlugin"
    controller = ControllerProcess(cp, namespaces=[ns], log_path=tmp_path / "controller.log",
                                   extra_args=(*FAST_ARGS, "--dra"))
    async with h.ready_nodes(client, [node]), h.dra_agents(cp, [node], ns):
        try:
            controller.start()
            h.apply(cp, ns, debug_echo_configuration(by_scheduler, descriptions=["cam"],
                                                     shared=True), pinned)
            assert await eventually(lambda: _chosen(client, ns, by_scheduler),
                                    deadline=SETUP_S, what="the default's choice") == "dra"
            assert await eventually(lambda: _chosen(client, ns, by_plugins),
                                    deadline=SETUP_S, what="the pin") == "devicePlugin"
            assert await eventually(lambda: _mapped(client, ns, by_scheduler),
                                    deadline=SETUP_S, what="the class mapping its resource"
                                    ) == configuration_resource_name(by_scheduler, None)
            for name, cfg in (("to-scheduler", by_scheduler), ("to-plugins", by_plugins)):
                await client.create(_pod(ns, name, configuration_resource_name(cfg, None),
                                         node))
            plugins_resource = configuration_resource_name(by_plugins, None)

            async def written() -> dict[str, int] | None:
                demand = await _demand(client, node)
                return demand if demand and plugins_resource in demand else None

            demand = await eventually(written, deadline=SETUP_S,
                                      what="the device-plugin pod's demand on the Node")
            assert demand == {plugins_resource: 1}, (
                f"the Node carries demand for the scheduler's resource too: {demand}")
        finally:
            controller.stop()
            print(f"--- controller ---\n{controller.log_tail(10)}")
            cp.kubectl("delete", "namespace", ns, "--wait=false", check=False)
