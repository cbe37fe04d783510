"""Slots across nodes: which slots a node advertises, reserves, releases and may claim.

Why this exists: a shared Instance is served by the agent of every node in ``spec.nodes``, and
each kubelet allocates only from what its own agent advertises. If every agent advertised every
free slot, two kubelets could pick the same slot; the loser's ``Allocate`` must fail and its
kubelet fails the pod with ``UnexpectedAdmissionError`` (akri#722, akri#849). This module is the
pure decision logic (no I/O, unit-tested); ``agent.slots.ledger`` does the writes.

The design, and why it is safe:

- ``status.reservations`` maps a slot to the node that holds it in reserve. A node advertises a
  slot as Healthy only when the slot is reserved for it and free, or already held by it; every
  other slot is advertised Unhealthy (counted in capacity, never allocatable). So, in the steady
  state, two kubelets never even try the same slot: a pod that finds no slot stays Pending.
- Who reserves a free, unreserved slot (or one reserved for a node no longer in ``nodes``) is
  decided by one deterministic rule that every agent computes from the same object, so
  concurrent agents do not fight. Demand comes first: ``status.demand`` maps a node to how many
  slots its agent still needs for Pending pods pinned to it (``agent.slots.demand`` watches
  them). Free unreserved slots go, in index order, to demanding nodes in name order, each up to
  its demand; the rest follow the fair-share rule (slot ``i`` belongs to
  ``sorted(nodes)[i % len(nodes)]``). Without demand, that is the whole rule.
- A node gives back a free reservation it does not need (it keeps as many as its own pinned
  Pending pods want, and all of them while a pod bound to it has not started, since its kubelet
  may be admitting that pod) when another listed node has unmet demand, or, lacking demand,
  when the fair-share rule gives the slot to another node. It stops advertising the slot first,
  then releases under the Instance's lock, the lock ``Allocate`` takes. A node that reserves
  slots for its demand writes its reduced demand in the same conditioned write, so nobody acts
  on a demand that was already met.
- Claims are optimistic: a node writes ``deviceUsage[slot]`` only in a write conditioned on the
  ``resourceVersion`` of an object in which the slot is free and reserved for it (or unreserved,
  in which case it first reserves it, conditioned the same way). All writes to one object are
  serialised by ``resourceVersion``, so the state a claim was judged on is the state it changes;
  a 409 means "re-read and judge again". No node reserves a slot that is in use, and a holder
  never releases a slot it uses, so no slot is ever held twice. Reservations and demand only
  steer who tries; correctness rests on the conditioned claim alone. (A stale or wrong demand
  can only move an idle reservation; it cannot make a slot held twice.)

Allocate from a confirmed reservation (the fast path, ``agent.slots.backends``): an Instance
plugin's ``Allocate`` for slots that are free and reserved for this node, or held by it already,
is answered at once and recorded in ``deviceUsage`` right after (a conditioned claim, as above;
the first promise on an Instance is written at once, later ones in a burst gathered at most every
``agent.slots.recording.GATHER_SECONDS``).
Why this stays safe — no slot to two pods, ever:

- Nobody else changes such a slot. Another node's claim of it is refused (reserved elsewhere,
  or held elsewhere) by the very rule above, and its reservation moves only when this node
  releases it. So the state of this node's reserved and held slots changes only by this
  agent's own writes, all made through its ledger, which keeps the object each write returned
  until the watch has caught up: the agent knows that state exactly, without reading. The one
  exception is this node leaving ``spec.nodes`` (its device gone, or the node itself gone, when
  the controller frees all it held); the fast path requires the node listed and its device in
  the node's table, and falls back to the conditioned claim otherwise.
- This agent itself never gives the slot away before it is recorded: the slot is *promised*
  (in memory) in the same step that judges it, with no ``await`` between. A promised slot is
  refused to the configuration plugin's claims, never released, never freed as an orphan; a
  slot whose release is in flight is never promised (the claim then waits for the lock and is
  judged afresh).
- On this node, the kubelet itself never hands one device id (an Instance plugin's device id is
  the slot) to two live containers: it checkpoints what it allocated. The configuration plugin,
  whose virtual ids the agent maps onto slots, keeps the conditioned claim before answering
  (a mapping lost in a crash could not be recovered).
- An agent killed between answering and recording: the pod holds the slot (the kubelet's
  checkpoint, and its pod-resources ``List``), the API shows it free and reserved for this node,
  and nobody else may claim it (first point). A restarted agent asks pod-resources before a
  plugin first serves an Instance or moves its reservations (at its first pass, or whenever
  the Instance reaches it later), and records every slot a live pod holds that
  ``deviceUsage`` shows free; until then it answers nothing for that Instance. So the slot is
  recorded for the pod that has it, and never handed to another. Without a pod-resources
  socket the agent cannot do this, and the fast path is off (every claim is a conditioned
  write first).

Hand-outs — freeing never acts on evidence older than the claim it frees:

- The orphan freer (``agent.slots.freeing``) frees a held slot when a pod-resources ``List``
  no longer shows it held. A ``List`` says nothing of a pod whose ``Allocate`` came after it
  was asked (the kubelet lists a pod's devices only once its admission has recorded them). A
  ``deviceUsage`` value cannot tell such a pod from the one before it: the kubelet re-uses a
  configuration-level virtual id as soon as its pod leaves, and the agent maps it onto the
  slot the id still holds, so the old and the new claim are both ``C:<virtual id>:<node>``
  (an Instance plugin's held slot confirmed again is ``<node>`` both times).
- So every hand-out — a new claim, a promise, a held slot or held virtual id handed out
  again — moves the slot's hand-out count (``SlotLedger.handouts``, in memory), with no
  ``await`` between the decision to answer and the count moving. The freer notes each slot's
  count before it asks ``List``, and frees only if the count is the same when it writes: it
  compares under the Instance's lock, with no ``await`` before the write marks the slot
  ``freeing`` (from then on a hand-out of it waits for the lock and is judged afresh). A
  hand-out after the ``List`` was asked therefore always makes that sweep keep the slot; the
  next ``List`` shows the new pod (or, if it never shows it, the orphan grace applies).
- A slot no ``List`` has shown held since its latest hand-out (its pod lived less than a sweep
  interval, or it was recorded before this agent started) — one grace: its orphan clock starts
  at the first ``List`` asked after that hand-out (by count: asked at the count it is freed at)
  that misses it, and it is freed once every ``List`` has missed it for ``ORPHAN_GRACE_SECONDS``
  from then; a ``List`` showing it held stops the clock, a hand-out starts it again. Why a
  grace at all: a ``List`` asked after the hand-out can still miss a live pod, in the moment
  between ``Allocate`` answering (the count moves when the answer is decided) and the kubelet
  recording the pod's devices (it records them as soon as ``Allocate`` returns), so absence in
  such a ``List`` is evidence only once it has lasted longer than that moment can. Every
  ``List`` the clock rests on was asked after the latest hand-out, so no evidence older than
  the claim counts. (Before, the clock started only once the claim was a grace old: a pod seen
  by no ``List`` kept its slot two graces, 10 s, while another node's pod waited for it.)
- Per-pod evidence frees such a slot before the grace when another node awaits it
  (``agent.slots.freeing.unaccounted_pods``): the pod that holds it was bound here before its
  ``Allocate``, so a consistent read of the pods bound here, taken after a ``List`` that was
  asked after the slot's latest hand-out, shows that pod unless it has ended. If every pod
  that read shows not ended and requesting the slot's resource is listed by that ``List`` with
  all the devices of that resource it requests, and the slot is not among them, no live pod
  holds it: the holder, were it alive, would be such a pod, and the kubelet lists a pod's
  devices only once its admission has recorded them all (so a pod caught between ``Allocate``
  and that record is not fully listed, and keeps the slot). The hand-out count, unchanged
  from before the ``List`` to the free, rules out a later pod. A pod whose init containers
  request the resource never counts as listed (its app containers re-use their devices). A
  restarted kubelet lists no pod it has not re-admitted, so its answers free nothing this way
  either. It costs one pod list per sweep, only while a slot no ``List`` has shown held is
  awaited by another node.
- A restarted agent has no counts and no "seen live" memory: the same one grace applies from
  its first sweep, and a hand-out restarts it.
- A restarted kubelet: it serves pod-resources again before it has re-admitted the pods its
  runtime still runs (it keeps their devices from its checkpoint, without ``Allocate``), and
  until then its ``List`` leaves them out; absence in such an answer is no evidence. A kubelet
  that restarts serves pod-resources on a new socket file, so the freer reads the socket's
  identity (inode, ctime) before and after each ``List``: when it differs from the one that
  answered the ``List`` before, or changed during the call, the freer drops its "seen live"
  memory and orphan timers, as at an agent restart, and frees nothing on that answer. An
  answer during which it changed is not used at all: the old kubelet may have given it, and
  its listing of a pod, taken as the new kubelet's, made the new one's first answers (which
  leave the pod out) read as the pod's end, so the slot of a running pod was freed at once
  (issue 33: 4 runs of 100 of the kubelet-restart test beside two CPU hogs). A slot is then
  freed only once no ``List`` has shown it held for ``ORPHAN_GRACE_SECONDS`` and every pod
  bound here (not ended) that requests its resource is named by the ``List`` at all
  (``agent.slots.freeing.unlisted_pods``): a pod the kubelet has not re-admitted may be its
  holder, and re-admission, usually well under a second, can take longer than the grace on a
  loaded node. Where the pods bound here cannot be read (no ``pods list`` grant, the API
  away), the grace alone frees, as before. The trace this closes:
  kubelet restarted at .02, its first ``List`` at .09 "freed" every broker's slot, a
  configuration-level id was then mapped onto a slot a broker still held (one slot recorded
  for two live pods, so the ledger believed another slot free), and a held slot freed this way
  stayed free for good once nothing else was held (no sweep asks pod-resources then).

Giving a slot away — the scheduler's count drops before the kubelet's (issue 21, part 2):

- The trace the window came from (a loaded 2-core machine, issue 21): node-a's agent released
  ``race-500be8-0`` at .759 (it had stopped advertising it just before), node-b claimed it, and
  a pod the scheduler had bound to node-a on a node status that still counted the slot was
  refused by node-a's kubelet ("Allocate failed due to no healthy devices present"). The
  order of events was: kubelet A still reports the slot → agent A stops advertising it →
  scheduler binds a pod to A on the count it last read → kubelet A admits it: no healthy
  device. The kubelet reports a withdrawal in its node status up to its
  ``nodeStatusUpdateFrequency`` (10 s by default) later, and the agent's own watch of pods
  bound here lags the binding; neither could stop it.
- The order now (``agent.slots.handoff``): (1) the agent lowers its Node's
  ``status.allocatable`` of each resource that advertises the slot (the Instance's, and the
  Configuration's virtual count) to what it will advertise without it, while the kubelet still
  has the slot healthy; (2) it lists, consistently (a list without ``resourceVersion``), the
  pods bound to this node that have not started and request either resource; if there is one,
  it restores the count and keeps the slot (the pod's start wakes the next pass); (3) it stops
  advertising the slot; (4) it waits until the kubelet has taken that in (pod-resources
  ``GetAllocatableResources`` no longer lists the withdrawn ids); (5) it lowers the count again
  if the Node shows more, and lists the pods bound here once more: one bound meanwhile keeps
  the slot, which is advertised again and the count restored, so the kubelet admits it with
  the slot; (6) only then does it release the reservation.
- Why no pod the scheduler binds on the API's counts is refused, whatever the delays between
  the API server, the kubelet's node status and the agent's watches: a binding written before
  (1)'s write is in (2)'s list, so the slot is kept and the kubelet, which still has it
  healthy, admits that pod with it. A binding decided on counts read after (1) does not count
  the slot here. The kubelet can undo (1) only with a status it computed before it took in
  (3); after (4) it computes none, so such a write lands before (5) reads the Node (or, in
  flight across that read, is lowered again at once from the Node's watch,
  ``HandoffGate.keep_down``), and a pod bound on it is in (5)'s list while the reservation is
  still this node's: the slot is advertised to the kubelet again before the release (a pod
  its kubelet admits before that is refused: below, "What remains"). The
  other node reserves the slot only after (6), and its kubelet reports it only after that, so
  the scheduler never counts the slot on both nodes.
- Traced in tests/faults/test_unpinned_handoff.py before (4)-(5) existed (quiet 5 of 7 runs
  failed, loaded 2 of 10): lowered at .970, released at 21.031, the kubelet's own status write
  of the old count at .040 (computed before it took in the withdrawal), the pod bound at .065
  on it, refused at .107.
- A pass never advertises from an Instance copy older than this agent's own last slot write
  (``SlotLedger.latest``, where the watch has not delivered the write yet): the same scenario
  showed a pass, woken by the agent's own Node write right after the release, advertising the
  released slot again from the watch's older copy (reserved for this node), the kubelet
  reporting it, and a pod bound to it while the other node had already reserved the slot.
- What remains: the scheduler binds on its own cache of the Node, which follows the API
  server by a watch. A scheduling cycle that started on a cache older than (1) and whose
  binding is written after (2) is refused if its kubelet admits it after (3)
  (``test_slots_handoff_orders``' last test plays it). The same holds for a pod bound on a
  kubelet status that put the old count back between (1) and (4), admitted before (5)
  advertises the slot again. No agent can see a scheduler's cache or hold the kubelet's
  status writes; the window is the scheduler's watch delay and the kubelet's status write
  (milliseconds) where it used to be the kubelet's status period (seconds). The controller
  replaces a refused broker at once and reports a refused pod of yours (controller/admission.py).
- Without the ``nodes/status`` grant (an install older than this rule) the agent warns once
  and gives slots away as before.

Two resources, one slot — what the scheduler cannot see (a known limit, issue 21):

- A free slot is advertised twice on its node: by the Instance's own plugin and, as a virtual
  device, by the Configuration's. The scheduler counts ``edgeplug.io/<instance>`` and
  ``edgeplug.io/<configuration>`` apart (Node ``allocatable`` minus the requests of pods bound
  there), so when a pod on one takes the slot, the other's allocatable drops only when the
  node's allocatable of it is lowered: by this agent at its next pass (``keep_down``: the Node
  shows more than is advertised), well under a second, else by the kubelet's next node status
  (up to its ``nodeStatusUpdateFrequency``, 10 s by default). A pod bound in that window on the
  other resource is refused by its kubelet (``UnexpectedAdmissionError``, "requested number of
  devices unavailable"). The refusal is safe — no slot is ever held twice, the conditioned
  claims above see to that — but the pod is Failed. Recovery is the controller's
  (controller/admission.py): a rejected broker is replaced at once, and a user's rejected pod
  gets an ``AdmissionFailed`` Event naming the pod and the cause. Until the device-plugin API
  can tell the scheduler, the way to avoid it is one kind of request per Configuration (its
  Instances' resources, or its own), or DRA, where the scheduler allocates the device itself.

DRA claims — one device, two allocators (issue 25):

- With ``DRA=on`` the same device is also published in a ResourceSlice, and the kube-scheduler
  allocates it to ResourceClaims without asking any agent. The controller (``--dra``) counts
  the claims allocated each Instance's device into ``status.claims``
  (``controller.dra_usage``). The rule: of the Instance's free slots, the ``claims`` of highest
  index are left to the claims (``claims_withheld``; all free slots when claims outnumber
  them). Such a slot is available to no node: the Instance plugin advertises it Unhealthy, the
  configuration plugin does not count it among its healthy virtual devices, and a claim of it
  in ``deviceUsage`` is refused (``Verdict.HELD_BY_CLAIMS``). Every node computes the same set
  from the same object, so all kubelets together are offered at most
  ``capacity - used - claims`` slots, and a pod asking for ``edgeplug.io/<instance>`` or
  ``edgeplug.io/<configuration>`` while claims hold the device stays Pending. A slot already
  handed to a pod is never taken back: a held slot is not free, and a fast-path promise being
  recorded, or a live pod's slot adopted after a crash, is written even where claims counted
  since would withhold it (``SlotLedger.claim(held_by_pod=True)``).
- The other direction is ``agent.dra.slices``': the slots the device plugins hold are taken
  out of the consumable capacity DRA offers, and a device whose every slot they hold is
  tainted ``edgeplug.io/held``, so the scheduler allocates it to no new claim.
- What remains: the two allocators share no lock. The scheduler allocates on a slice that
  still counts a slot free, while a kubelet admits a device-plugin pod on a slot still
  advertised Healthy. This agent learns of a claim only once the controller has seen its
  allocation and written ``status.claims`` (a pass at most ``PASS_DELAY_S``, 0.5 s, after the
  change, then a patch and a watch event: about a second), and the slice learns of a pod's
  slot only once ``deviceUsage`` is written and the slice rewritten. Within that window a slot
  can go to a claim and to a pod at once. After it, a pod the scheduler still binds on the
  node's old allocatable (the kubelet reports it again within its
  ``nodeStatusUpdateFrequency``) is refused by its kubelet (the device is Unhealthy, or
  ``Allocate`` refuses it): a failed pod, never a shared slot. For a hard guarantee, serve a
  device one way only: DRA off, or its Configuration's pods through claims only
  (``brokerDeviceAccess: dra`` and no pod asking for its extended resources).
- A claim counts once however many units of ``slots`` it consumes: one that asks for more
  than the default one unit is withheld one slot only (docs/dra.md).

The hand-off under every order of what races it (tests/unit/test_slots_handoff_orders.py plays
the 24 orders of: pod bound, allocatable updated, reservation moved, watch event delivered):

- No order holds a slot twice: a reservation moves only while its slot is free, and a claim
  is judged on the Instance it changes.
- A pod pinned here is never refused, labelled or not. Labelled, from creation to start one
  stream holds it, unscheduled as this node's want (``reservation_plan`` keeps what ``wanted``
  asks for), bound as a ``hold`` (nothing given back), one watch event between
  (``agent.slots.demand``). Unlabelled, the controller's count on the Node (``crds.pinning``)
  holds it from creation until it starts, bound or not, and the agent subtracts the pinned
  pods its own bound stream holds: wanted until that stream delivers the binding, held from
  then on, whichever of the count and the stream comes first. (When the count dropped at the
  binding, it could reach the agent before its watch delivered the binding, and the pod was
  refused in 8 of the 24 orders.)
- A pod this node's agent learns of only at its binding (unpinned) is never refused either
  (it was in 16 of the 24 orders while the agent gave a slot away on its watch alone): bound
  before the lowering it is in the consistent list and keeps the slot, bound after it the
  scheduler does not count the slot here. It runs, or waits Pending; a slot given away goes to
  the node that wanted it, and no pod waits while a slot is free. Only a scheduler cache older
  than the lowering refuses it (above, "What remains").

The trace this closes (issue 21): ``Allocate answered devices=[['storm-v2']]`` at .433, and at
.436 ``freed a slot no live pod holds ... usage=C:storm-v2:storm-node`` on a ``List`` asked
before the ``Allocate``; the Instance plugin then gave that slot to a second pod.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.deviceplugin.feed import AdvertisedDevice
from crds.instance import Instance, SlotUsage, SlotUsageKind
from crds.naming import slot_id

#: Instances whose slot ids are kept computed, and distinct ``deviceUsage`` values kept parsed:
#: every reconcile pass and Allocate asks for them again, on the event loop.
SLOT_ID_CACHE = 64
USAGE_CACHE = 1024


@functools.lru_cache(maxsize=SLOT_ID_CACHE)
def _slot_ids(name: str, capacity: int) -> tuple[str, ...]:
    return tuple(slot_id(name, i) for i in range(capacity))


def slot_ids(instance: Instance) -> list[str]:
    return list(_slot_ids(instance.name, instance.spec.capacity))


@functools.lru_cache(maxsize=SLOT_ID_CACHE)
def _slot_id_set(name: str, capacity: int) -> frozenset[str]:
    return frozenset(_slot_ids(name, capacity))


def has_slot(instance: Instance, slot: str) -> bool:
    """Whether ``slot`` is one of the Instance's slot ids (no list built per question)."""
    return slot in _slot_id_set(instance.name, instance.spec.capacity)


@functools.lru_cache(maxsize=USAGE_CACHE)
def _parse_usage(value: str) -> SlotUsage:
    try:
        return SlotUsage.parse(value)
    except ValueError:
        # A value we cannot read is somebody's: never treat it as free.
        return SlotUsage.by_node(value)


def preferred_node(index: int, nodes: Iterable[str]) -> str | None:
    """The node the fair-share rule gives slot ``index`` to (None when no node lists it)."""
    ordered = sorted(set(nodes))
    return ordered[index % len(ordered)] if ordered else None


def usage_of(instance: Instance, slot: str) -> SlotUsage:
    return _parse_usage(instance.spec.device_usage.get(slot, ""))


def reservation_of(instance: Instance, slot: str) -> str | None:
    """The node holding ``slot`` in reserve, ignoring reservations of nodes no longer listed."""
    holder = instance.reservations.get(slot) or None
    return holder if holder in instance.spec.nodes else None


def is_held_by(usage: SlotUsage, node: str) -> bool:
    return usage.kind is not SlotUsageKind.FREE and usage.node == node


def claims_withheld(instance: Instance) -> frozenset[str]:
    """Free slots the device plugins leave to ResourceClaims (``status.claims``): that many of
    the free slots, highest index first; every free slot when the claims outnumber them.

    Every node computes the same set from the same object, so across all nodes at most
    ``free - claims`` slots are offered (module docstring, "DRA claims").
    """
    if instance.claims <= 0:
        return frozenset()
    free = [slot for slot in slot_ids(instance) if usage_of(instance, slot).is_free]
    return frozenset(free[max(0, len(free) - instance.claims):])


def available_to(instance: Instance, slot: str, node: str) -> bool:
    """Free, reserved for ``node`` and not left to claims: the slot ``node`` may hand out next."""
    return (
        usage_of(instance, slot).is_free
        and reservation_of(instance, slot) == node
        and slot not in claims_withheld(instance)
    )


def instance_devices(instance: Instance, node: str, *, healthy: bool) -> list[AdvertisedDevice]:
    """What the Instance's own plugin on ``node`` advertises: every slot, healthy when usable.

    A slot is usable through the Instance plugin when it is available to ``node`` or held by
    ``node`` through this plugin (a pod of ours has it). Slots held through the configuration
    plugin, reserved for or held by another node, or left to ResourceClaims, are Unhealthy.
    """
    devices = []
    for slot in slot_ids(instance):
        usage = usage_of(instance, slot)
        mine = usage.kind is SlotUsageKind.NODE and usage.node == node
        devices.append(
            AdvertisedDevice(slot, healthy=healthy and (mine or available_to(instance, slot, node)))
        )
    return devices


@dataclass(frozen=True)
class ReservationPlan:
    reserve: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    #: This node's unmet demand once ``reserve`` is written (what ``status.demand`` should say).
    demand: int = 0

    def __bool__(self) -> bool:
        return bool(self.reserve or self.release)


def listed_demand(instance: Instance) -> dict[str, int]:
    """``status.demand`` of the listed nodes that need slots."""
    return {n: d for n, d in instance.demand.items() if d > 0 and n in instance.spec.nodes}


def unmet_need(instance: Instance, node: str, wanted: int) -> int:
    """Slots ``node`` lacks for ``wanted`` pinned pending requests, beyond those available to it."""
    have = sum(1 for slot in slot_ids(instance) if available_to(instance, slot, node))
    return max(0, wanted - have)


def _assign_unreserved(
    instance: Instance, demand: Mapping[str, int]
) -> tuple[dict[str, str], dict[str, int]]:
    """Free unreserved slot → the node that should reserve it; and each node's demand left."""
    nodes = instance.spec.nodes
    left = dict(demand)
    claimants = iter(sorted(n for n, d in left.items() if d > 0))
    current = next(claimants, None)
    assigned: dict[str, str] = {}
    for index, slot in enumerate(slot_ids(instance)):
        if not usage_of(instance, slot).is_free or reservation_of(instance, slot) is not None:
            continue
        while current is not None and left[current] <= 0:
            current = next(claimants, None)
        if current is not None:
            assigned[slot] = current
            left[current] -= 1
        elif (owner := preferred_node(index, nodes)) is not None:
            assigned[slot] = owner
    return assigned, left


def reservation_plan(
    instance: Instance, node: str, *, wanted: int = 0, hold: bool = False
) -> ReservationPlan:
    """Slots ``node`` should reserve now, and free reservations it should give back.

    ``wanted``: slots of this Instance that Pending pods pinned to ``node`` (not yet scheduled)
    ask for. ``hold``: a pod bound to ``node`` that may need this Instance has not started, so
    no free reservation of ``node`` is given back (its kubelet may be admitting it right now).
    ``node``'s own demand is taken from ``wanted`` (fresh), other nodes' from ``status.demand``.
    """
    if node not in instance.spec.nodes:
        return ReservationPlan()
    slots = slot_ids(instance)
    need = unmet_need(instance, node, wanted)
    demand = {n: d for n, d in listed_demand(instance).items() if n != node}
    if need:
        demand[node] = need
    assigned, left = _assign_unreserved(instance, demand)
    reserve = [
        slot
        for slot in slots
        if (is_held_by(usage_of(instance, slot), node) and reservation_of(instance, slot) != node)
        or assigned.get(slot) == node
    ]
    release: list[str] = []
    if not hold:
        nodes = instance.spec.nodes
        owner = {slot: preferred_node(index, nodes) for index, slot in enumerate(slots)}
        spare = [slot for slot in slots if available_to(instance, slot, node)]
        # Keep what the pinned pods want, fair-share slots first; offer the rest, others' first.
        spare.sort(key=lambda slot: owner[slot] != node)
        others_need = sum(d for n, d in left.items() if n != node and d > 0)
        for slot in reversed(spare[wanted:]):
            if others_need > 0:
                release.append(slot)
                others_need -= 1
            elif owner[slot] != node:
                release.append(slot)
        release.sort(key=slots.index)
    return ReservationPlan(
        reserve=tuple(reserve), release=tuple(release), demand=max(0, left.get(node, 0))
    )


def split_wanted(
    instances: Sequence[Instance],
    node: str,
    *,
    by_instance: Mapping[str, int],
    by_configuration: int,
) -> dict[str, int]:
    """How many slots ``node`` wants of each Instance of one Configuration.

    ``by_instance`` counts requests of each Instance's own resource; ``by_configuration`` those
    of the Configuration's resource, which any of them can serve: first from slots already
    available to ``node`` and not wanted otherwise, then from slots that could move here (free,
    not yet ours), Instances in name order so every pass gives the same answer.
    """
    ordered = sorted(instances, key=lambda i: i.name)
    wanted = {i.name: by_instance.get(i.name, 0) for i in ordered}
    left = by_configuration
    for instance in ordered:
        have = sum(1 for s in slot_ids(instance) if available_to(instance, s, node))
        take = min(left, max(0, have - wanted[instance.name]))
        wanted[instance.name] += take
        left -= take
    for instance in ordered:
        withheld = claims_withheld(instance)
        movable = sum(
            1
            for s in slot_ids(instance)
            if usage_of(instance, s).is_free
            and s not in withheld
            and not available_to(instance, s, node)
        )
        take = min(left, max(0, movable - unmet_need(instance, node, wanted[instance.name])))
        wanted[instance.name] += take
        left -= take
    return wanted


class Verdict(enum.Enum):
    HELD_ALREADY = "held already"  # the slot already carries exactly this usage
    CLAIM = "claim"  # free and reserved for us
    RESERVE_AND_CLAIM = "reserve and claim"  # free and unreserved
    HELD_ELSEWHERE = "held elsewhere"
    RESERVED_ELSEWHERE = "reserved elsewhere"
    HELD_BY_CLAIMS = "held by ResourceClaims"  # free, but left to claims (claims_withheld)
    UNKNOWN = "unknown"

    @property
    def refused(self) -> bool:
        """Whether the claim must not be written."""
        return self not in (Verdict.HELD_ALREADY, Verdict.CLAIM, Verdict.RESERVE_AND_CLAIM)


def judge_claim(instance: Instance, slot: str, want: SlotUsage) -> Verdict:
    """May ``want.node`` put ``want`` on ``slot`` of this exact version of the Instance?"""
    if not has_slot(instance, slot):
        return Verdict.UNKNOWN
    usage = usage_of(instance, slot)
    if usage == want:
        return Verdict.HELD_ALREADY
    if not usage.is_free:
        return Verdict.HELD_ELSEWHERE
    holder = reservation_of(instance, slot)
    if holder not in (None, want.node):
        return Verdict.RESERVED_ELSEWHERE
    if slot in claims_withheld(instance):
        return Verdict.HELD_BY_CLAIMS
    return Verdict.CLAIM if holder == want.node else Verdict.RESERVE_AND_CLAIM


def instance_hash(instance_name: str) -> str:
    """The digest suffix of an Instance name (``<configuration>-<digest>``), upper case."""
    return instance_name.rpartition("-")[2].upper()


def broker_envs(instance_name: str, properties: Mapping[str, str]) -> dict[str, str]:
    """Every property as ``KEY`` and ``KEY_<HASH>`` (two devices of a kind don't collide)."""
    suffix = instance_hash(instance_name)
    envs: dict[str, str] = {}
    for key, value in properties.items():
        envs[key] = value
        envs[f"{key}_{suffix}"] = value
    return envs


# --- the configuration-level plugin's virtual devices ---------------------------------------


def virtual_id(configuration: str, index: int) -> str:
    return f"{configuration}-v{index}"


@dataclass(frozen=True)
class SlotRef:
    namespace: str
    instance: str
    slot: str


def held_virtual_ids(instances: Iterable[Instance], node: str) -> dict[str, SlotRef]:
    """Virtual id → the slot it holds, for configuration-level usage by ``node``."""
    held: dict[str, SlotRef] = {}
    for instance in instances:
        for slot in slot_ids(instance):
            usage = usage_of(instance, slot)
            if usage.kind is SlotUsageKind.CONFIGURATION and usage.node == node:
                held[usage.virtual_id] = SlotRef(instance.namespace, instance.name, slot)
    return held


def available_slots(instances: Iterable[Instance], node: str) -> list[SlotRef]:
    """Slots available to ``node`` across the Instances, round-robin over Instances so that
    taking them in order spreads a multi-device request over distinct Instances."""
    per_instance = [
        [SlotRef(i.namespace, i.name, s) for s in slot_ids(i) if available_to(i, s, node)]
        for i in sorted(instances, key=lambda i: i.name)
    ]
    ordered: list[SlotRef] = []
    for depth in range(max((len(p) for p in per_instance), default=0)):
        ordered.extend(p[depth] for p in per_instance if depth < len(p))
    return ordered


def configuration_devices(
    configuration: str, instances: Sequence[Instance], node: str, *, healthy: Iterable[str] = ()
) -> list[AdvertisedDevice]:
    """Virtual devices: as many as the Instances have slots; healthy are those ``node`` holds
    plus one per slot available to it (lowest free ids first, so ids stay stable).

    ``healthy`` names Instances whose NodeDevice is healthy; slots of other Instances count as
    unavailable.
    """
    healthy_instances = set(healthy)
    usable = [i for i in instances if i.name in healthy_instances]
    held = held_virtual_ids(instances, node)
    total = sum(i.spec.capacity for i in instances)
    ids = [virtual_id(configuration, k) for k in range(total)]
    extra = len(available_slots(usable, node))
    good = set(held)
    for vid in ids:
        if extra <= 0:
            break
        if vid not in good:
            good.add(vid)
            extra -= 1
    ids.extend(sorted(set(held) - set(ids)))  # held beyond a shrunken capacity: still ours
    return [AdvertisedDevice(vid, healthy=vid in good) for vid in ids]


def slot_counts(
    served: Mapping[tuple[str, str], Instance], node: str
) -> dict[tuple[str, str], tuple[int, int]]:
    """Per Configuration (namespace, name) of the served Instances: (slots, slots ``node``
    holds), for the ``edgeplug_slots_capacity`` and ``edgeplug_slots_used`` gauges."""
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    for (namespace, _name), instance in served.items():
        key = (namespace, instance.spec.configuration_name)
        held = sum(1 for slot in slot_ids(instance) if is_held_by(usage_of(instance, slot), node))
        capacity, used = counts.get(key, (0, 0))
        counts[key] = (capacity + instance.spec.capacity, used + held)
    return counts
