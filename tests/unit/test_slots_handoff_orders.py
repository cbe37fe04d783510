"""The reservation hand-off under every order of the four events that race it.

A shared Instance of two slots seen by node-a and node-b. Slot 0 is free and reserved for node-a;
slot 1 is held by a running pod on node-b, whose pinned pod ``waiting-b`` asks for a slot
(node-b's demand, published). So node-a's idle reservation is what node-b wants, while a pod
``p`` is about to be bound to node-a. Four events race, in each of their 24 orders:

- *pod bound*: the scheduler binds ``p`` to node-a, if node-a's allocatable as the API shows it
  has room (else ``p`` stays Pending for now);
- *allocatable updated*: the kubelets' node status reaches the API (what each advertises now);
- *reservation moved*: node-a's agent runs a pass, then node-b's (``instance_needs`` and
  ``move_for`` as ``agent.deviceplugins.slots.reservations`` calls them; a slot is given away
  through the gate of ``agent.deviceplugins.crossnode.handoff``: the Node's count lowered, then,
  unless a consistent read shows a pod bound here and not started, no longer advertised and
  released; a reserved one is advertised);
- *watch event delivered*: node-a's agent's pod watch delivers ``p`` as it is now.

Then everything left settles (watches delivered, the kubelets admit what was bound to them,
agents pass, node status, the scheduler), node-a's kubelet admitting ``p`` as late as possible,
after the four events: the worst case for ``p``. The scheduler reads the API's counts (in the
last test, its cache lags behind the lowering). Admission is the kubelet's device manager: a
free healthy device of its own, then ``Allocate``, whose claim is the conditioned one
(``judge_claim`` on the Instance as it is). Judged: no slot held by two live pods, ever; no pod
left bound and waiting, or pinned and waiting, while a slot is free; and which orders end with
``p`` refused by its kubelet (``UnexpectedAdmissionError``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.deviceplugins.crossnode.demand import BOUND, TARGETED, PendingPods, instance_needs
from agent.deviceplugins.slots.reservations import move_for
from agent.deviceplugins.slots.rules import (
    Verdict,
    instance_devices,
    judge_claim,
    slot_ids,
    usage_of,
)
from crds.instance import Instance, SlotUsage
from crds.naming import instance_resource_name
from crds.pinning import format_pinned_demand
from tests.harness.slot_instances import NAME, slot_instance

A, B = "node-a", "node-b"
S0, S1 = (f"{NAME}-{i}" for i in range(2))
RESOURCE = instance_resource_name(NAME)
EVENTS = ("pod bound", "allocatable updated", "reservation moved", "watch event delivered")
ORDERS = list(itertools.permutations(EVENTS))
#: Settling rounds; the scenario settles in two or three.
MAX_ROUNDS = 10


@dataclass
class _Pod:
    name: str
    pinned: str | None
    labelled: bool
    node: str | None = None
    phase: str = "Pending"
    slot: str | None = None
    refused: bool = False

    def obj(self) -> Pod:
        spec: dict[str, Any] = {
            "nodeName": self.node,
            "containers": [{"name": "m", "resources": {"limits": {RESOURCE: "1"}}}],
        }
        if self.pinned:
            spec["nodeSelector"] = {"kubernetes.io/hostname": self.pinned}
        return cast(Pod, Pod.from_dict({"metadata": {"uid": self.name}, "spec": spec,
                                        "status": {"phase": self.phase}}))


@dataclass
class _World:
    """The API's Instance and pods, each node's kubelet and agent, and the scheduler's view."""

    p: _Pod
    instance: Instance = field(default_factory=lambda: slot_instance(
        usage={S1: B}, reservations={S0: A, S1: B}, demand={B: 1}))
    allocatable: dict[str, int] = field(default_factory=dict)
    initial_allocatable: dict[str, int] = field(default_factory=dict)
    agents: dict[str, PendingPods] = field(default_factory=dict)
    pods: list[_Pod] = field(default_factory=list)
    #: Every (slot, pod) a kubelet's Allocate handed out, for the double-use check.
    handed: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        unused = cast(AsyncClient, None)
        self.agents = {n: PendingPods(client=unused, node=n) for n in (A, B)}
        running_b = _Pod("running-b", pinned=B, labelled=True, node=B, phase="Running", slot=S1)
        self.pods = [running_b, _Pod("waiting-b", pinned=B, labelled=True), self.p]
        self.handed.append((S1, running_b.name))
        self.annotate()
        self.deliver()
        self.update_allocatable()
        self.initial_allocatable = dict(self.allocatable)

    # -- the parts -----------------------------------------------------------------------

    def healthy(self, node: str) -> set[str]:
        """What the node's agent advertises as Healthy (its kubelet's healthy devices)."""
        return {d.id for d in instance_devices(self.instance, node, healthy=True) if d.healthy}

    def update_allocatable(self) -> None:
        self.allocatable = {n: len(self.healthy(n)) for n in (A, B)}

    def annotate(self) -> None:
        """The controller's count of Pending pods pinned to each node (bound or not), on its
        Node; it reaches the node's agent at once, sooner than the agent's own pod watch (the
        worst case: had the count dropped at the binding, the agent would know the pod in
        neither)."""
        for node, agent in self.agents.items():
            count = sum(1 for q in self.pods if q.pinned == node and q.phase == "Pending")
            agent.annotated(format_pinned_demand({RESOURCE: count}) if count else None)

    def deliver(self) -> None:
        """Every agent's pod watches deliver every pod as it is now."""
        for agent in self.agents.values():
            for pod in self.pods:
                if pod.labelled:
                    agent.update(pod.obj(), stream=TARGETED)
                agent.update(pod.obj(), stream=BOUND)

    def agent_pass(self, node: str) -> None:
        """``ReservationMover.move`` for this one Instance, writes applied."""
        agent = self.agents[node]
        key = ("ns", NAME)
        wanted, holding = instance_needs(
            {key: self.instance}, node, config_resources={("ns", "cam"): "edgeplug.io/cam"},
            wanted=agent.wanted(), starting=agent.starting())
        plan = move_for(self.instance, node, wanted=wanted[key], hold=key in holding)
        if plan is None:
            return
        if plan.release:
            # The give-away gate (agent.deviceplugins.crossnode.handoff): the Node's count lowered
            # first (the scheduler reads it at once), then a consistent read of the pods bound here.
            before = self.allocatable[node]
            self.allocatable[node] = len(self.healthy(node) - set(plan.release))
            if any(q.node == node and q.phase == "Pending" for q in self.pods):
                self.allocatable[node] = before  # kept: restored
                plan = replace(plan, release=())
        reservations = dict(self.instance.reservations)
        for slot in plan.release:
            assert usage_of(self.instance, slot).is_free, f"{node} released a used slot"
            reservations.pop(slot, None)
        reservations.update(dict.fromkeys(plan.reserve, node))
        demand = {n: d for n, d in {**self.instance.demand, node: plan.demand}.items() if d}
        self.instance = replace(self.instance, reservations=reservations, demand=demand)

    def schedule(self, pod: _Pod, view: dict[str, int] | None = None) -> None:
        """Bind ``pod`` where the API's allocatable has room (pinned: only there); ``view``:
        the scheduler's own older copy of it, when its cache lags."""
        if pod.node is not None or pod.phase != "Pending":
            return
        allocatable = self.allocatable if view is None else view
        for node in [pod.pinned] if pod.pinned else [A, B]:
            used = sum(1 for q in self.pods if q.node == node and q.phase in ("Pending", "Running"))
            if allocatable[node] - used >= 1:
                pod.node = node
                self.annotate()
                return

    def admit(self, pod: _Pod) -> None:
        """The kubelet of ``pod``'s node admits it: a free healthy device, then Allocate."""
        if pod.node is None or pod.phase != "Pending":
            return
        taken = {q.slot for q in self.pods if q.node == pod.node and q.phase == "Running"}
        free = sorted(self.healthy(pod.node) - taken)
        if free and judge_claim(self.instance, free[0], SlotUsage.by_node(pod.node)) in (
            Verdict.CLAIM, Verdict.RESERVE_AND_CLAIM):
            slot = free[0]
            usage = {**self.instance.spec.device_usage, slot: pod.node}
            self.instance = replace(
                self.instance, spec=replace(self.instance.spec, device_usage=usage),
                reservations={**self.instance.reservations, slot: pod.node})
            pod.slot, pod.phase = slot, "Running"
            self.handed.append((slot, pod.name))
        else:
            pod.phase, pod.refused = "Failed", True  # UnexpectedAdmissionError
        self.annotate()

    # -- the four events, then the rest ----------------------------------------------------

    def event(self, name: str, *, stale_scheduler: bool = False) -> None:
        if name == "pod bound":
            self.schedule(self.p, self.initial_allocatable if stale_scheduler else None)
        elif name == "allocatable updated":
            self.update_allocatable()
        elif name == "reservation moved":
            self.agent_pass(A)
            self.agent_pass(B)
        else:
            self.deliver()

    def settle(self) -> None:
        self.deliver()
        self.admit(self.p)  # as late as can be: after the four events
        for _ in range(MAX_ROUNDS):
            before = repr((self.instance, self.pods, self.allocatable))
            self.deliver()
            for pod in self.pods:
                self.admit(pod)
            self.agent_pass(A)
            self.agent_pass(B)
            self.update_allocatable()
            for pod in self.pods:
                self.schedule(pod)
            if repr((self.instance, self.pods, self.allocatable)) == before:
                return
        pytest.fail(f"did not settle in {MAX_ROUNDS} rounds: {self.instance}, {self.pods}")

    def check_holders(self) -> None:
        live = {q.name for q in self.pods if q.phase == "Running"}
        for slot in slot_ids(self.instance):
            holders = {pod for s, pod in self.handed if s == slot and pod in live}
            assert len(holders) <= 1, f"slot {slot} held by {sorted(holders)}"

    def check_settled(self) -> None:
        self.check_holders()
        free = [s for s in slot_ids(self.instance) if usage_of(self.instance, s).is_free]
        waiting = [q.name for q in self.pods if q.phase == "Pending"]
        assert not (free and waiting), f"{waiting} wait while {free} is free"


def _run(order: tuple[str, ...], p: _Pod, *, stale_scheduler: bool = False) -> _World:
    world = _World(p=p)
    for name in order:
        world.event(name, stale_scheduler=stale_scheduler)
        world.check_holders()
    world.settle()
    world.check_settled()
    return world


@pytest.mark.parametrize("labelled", [True, False], ids=["labelled", "unlabelled"])
def test_a_pod_pinned_here_is_never_refused_in_any_order(labelled: bool) -> None:
    """Labelled, the labelled stream holds the pod from creation to start: unscheduled it is
    node-a's want, bound it holds node-a's reservations, one event between. Unlabelled, the
    controller's count holds it until it starts, less what node-a's bound stream already
    holds: wanted until the agent sees it bound, held from then on
    (``agent.deviceplugins.crossnode.demand``)."""
    for order in ORDERS:
        world = _run(order, _Pod("p", pinned=A, labelled=labelled))
        assert not world.p.refused, f"p refused after {order}"
        assert world.p.slot == S0, f"p did not get slot 0 after {order}: {world.pods}"


def _before(order: tuple[str, ...], *names: str) -> bool:
    """Whether these events came in this order."""
    return all(order.index(x) < order.index(y) for x, y in itertools.pairwise(names))


def test_an_unpinned_pod_is_never_refused_in_any_order() -> None:
    """A pod node-a's agent cannot hold for before its binding (unpinned: no node's want).
    Before the give-away gate it was refused in 16 of the 24 orders: whenever node-a gave the
    slot away without its watch having delivered ``p``'s binding, and the scheduler bound
    ``p`` on a count that still had the slot. Now node-a lowers the scheduler's count before
    it stops advertising the slot, and reads (consistently) the pods bound to it: bound
    before the lowering, ``p`` is in that read and node-a keeps the slot for it; bound after,
    the scheduler no longer counts the slot on node-a. So ``p`` runs on slot 0, or waits
    Pending without failing, and a slot node-a gave away went to ``waiting-b``."""
    for order in ORDERS:
        world = _run(order, _Pod("p", pinned=None, labelled=False))
        assert not world.p.refused, f"p refused after {order}: {world.pods}"
        if world.p.slot != S0:
            assert world.p.phase == "Pending", f"{order}: {world.pods}"
            assert world.pods[1].slot == S0, f"{order}: {world.pods}"


def test_a_scheduler_acting_on_a_count_older_than_the_lowering_is_the_limit() -> None:
    """What no agent can see (``agent.deviceplugins.slots.rules``, "Giving a slot away"): a
    scheduler that binds ``p`` on its cache of node-a's count from before the lowering, after
    node-a's read of the pods bound to it. Here the scheduler's cache never catches up before its
    binding: ``p`` is refused exactly when the binding comes after the give-away (12 of 24 orders),
    recovered by the controller (controller/state/admission.py); never a slot held twice."""
    refused = set()
    for order in ORDERS:
        world = _run(order, _Pod("p", pinned=None, labelled=False), stale_scheduler=True)
        if world.p.refused:
            refused.add(order)
            assert world.pods[1].slot == S0, f"{order}: {world.pods}"
    assert refused == {o for o in ORDERS if _before(o, "reservation moved", "pod bound")}
    assert len(refused) == 12
