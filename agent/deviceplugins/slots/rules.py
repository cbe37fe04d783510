"""Slots across nodes: which slots a node advertises, reserves, releases and may claim.

Pure functions over Instances (no I/O, unit-tested); ``agent.deviceplugins.slots.ledger`` does the
writes. A node advertises a slot Healthy only when it is free, reserved for the node and not left to
ResourceClaims, or held by the node (``instance_devices``, ``configuration_devices``); free
unreserved slots go to nodes with demand first, then by fair share, and a node gives back free
reservations others need (``reservation_plan``); a claim is judged on the exact Instance it
changes (``judge_claim``); ``claims_withheld`` leaves ``status.claims`` free slots to DRA. Why
these keep every slot to one pod, and what they leave open: docs/slots.md (C2-C5, C16).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.deviceplugins.kubelet.feed import AdvertisedDevice
from crds.configuration import Allocator
from crds.instance import Instance, SlotUsage, SlotUsageKind
from crds.naming import slot_id

#: Instances whose slot ids are kept computed, and distinct ``deviceUsage`` values kept parsed:
#: every reconcile pass and Allocate asks for them again, on the event loop. A pass walks every
#: served Instance in the same order, so a cache smaller than a node's Instances misses on
#: every one of them (least recently used is always the next asked): sized for thousands.
SLOT_ID_CACHE = 4096
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
    ``free - claims`` slots are offered (docs/slots.md, C16).
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


def served_by_plugins(instance: Instance, node: str, *, present: bool,
                      allocator: Allocator | None, dra: bool) -> bool:
    """Whether a device plugin of ``node`` serves the Instance: it lists the node, the node
    finds the device (``present``), and its Configuration's ``allocator`` is the kubelets'
    (one allocator per device, local or shared: a device the scheduler allocates is served
    through DRA alone, docs/slots.md). Undecided (the controller has not said yet): an agent
    that can serve DRA (``dra``) waits rather than hand out slots it may have to take back;
    one that cannot serves the only way it can."""
    if node not in instance.spec.nodes or not present:
        return False
    if allocator is None:
        return not dra
    return allocator == Allocator.DEVICE_PLUGIN
