"""Which held slot the orphan freer frees: pure decisions over one pod-resources ``List``.

``held_slots`` names the slots this node holds and the device id a live pod would be listed
with; ``judge_slot`` decides for one of them from the ``List``, its hand-out count and what
earlier ``List`` calls showed (``agent.deviceplugins.slots.freeing`` keeps those memories and does
the I/O); ``free_on_bound_pods`` settles the two verdicts that also need the pods bound here.
Why each rule: docs/slots.md (C7-C10).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.deviceplugins.kubelet.podresources import PodDevices
from agent.deviceplugins.slots.rules import usage_of
from crds.instance import Instance, SlotUsage, SlotUsageKind
from crds.naming import instance_resource_name
from crds.pinning import extended_requests


class Verdict(enum.Enum):
    LIVE = "a listed pod holds it"
    FREE = "its pod ended since a List showed it held: free now"
    WAIT = "missed by every List since its hand-out, within the grace"
    GRACE_OVER = "missed past the grace: free unless a pod bound here is not listed"
    EVIDENCE = "another node waits: free if every pod bound here is listed with its devices"


#: When the first ``List`` since a slot's latest hand-out missed it, and that hand-out count.
OrphanClock = tuple[float, int]


@dataclass(frozen=True)
class HeldSlot:
    """A slot this node holds, and how pod-resources would list a live pod holding it."""

    instance: Instance
    slot: str
    value: str  # its deviceUsage entry
    usage: SlotUsage
    resource: str | None  # None: a virtual id of a Configuration whose resource is unknown
    device_id: str


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    #: The hand-out count the slot was last seen held at (None: not since its hand-out).
    seen_live: int | None
    #: Its orphan clock (None: stopped).
    clock: OrphanClock | None


def held_slots(instances: Iterable[Instance], node: str,
               configuration_resources: Mapping[tuple[str, str], str]) -> list[HeldSlot]:
    """Every slot ``node`` holds: an Instance resource's by its slot id, a Configuration
    resource's by its virtual id."""
    found = []
    for instance in instances:
        for slot, value in instance.spec.device_usage.items():
            usage = usage_of(instance, slot)
            if usage.is_free or usage.node != node:
                continue
            if usage.kind is SlotUsageKind.NODE:
                resource: str | None = instance_resource_name(instance.name)
                device_id = slot
            else:
                resource = configuration_resources.get(
                    (instance.namespace, instance.spec.configuration_name))
                device_id = usage.virtual_id
            found.append(HeldSlot(instance, slot, value, usage, resource, device_id))
    return found


def judge_slot(*, live: bool, handouts: int, seen_live: int | None, clock: OrphanClock | None,
               now: float, grace: float, awaited: bool) -> Judgement:
    """One held slot against one ``List``: ``live`` (a listed pod holds it), ``handouts`` (its
    hand-out count before the ``List``), ``seen_live`` and ``clock`` (what earlier ``List``
    calls left), ``awaited`` (another node's pods wait for a slot this node holds)."""
    if live:
        return Judgement(Verdict.LIVE, seen_live=handouts, clock=None)
    if seen_live is not None and seen_live == handouts:
        # Its pod ended, and the slot was not handed to a new pod since the List that showed
        # it held (a new pod may not be listed yet): free now, unless a hand-out comes before
        # the write (the freer checks the count again under the ledger's lock).
        return Judgement(Verdict.FREE, seen_live=None, clock=None)
    # Never seen held since its latest hand-out: the orphan clock starts at the first List
    # asked after that hand-out that misses it (C9), and a later hand-out starts it again.
    since, counted_at = clock if clock is not None else (now, handouts)
    if counted_at != handouts:
        since = now
    running = (since, handouts)
    if now - since >= grace:
        return Judgement(Verdict.GRACE_OVER, seen_live=seen_live, clock=running)
    if awaited:
        return Judgement(Verdict.EVIDENCE, seen_live=seen_live, clock=running)
    return Judgement(Verdict.WAIT, seen_live=seen_live, clock=running)


def unaccounted_pods(
    bound: Iterable[Mapping[str, Any]], listed: Sequence[PodDevices], resource: str
) -> list[str]:
    """Of the pods ``bound`` here (not ended) that request ``resource``, those pod-resources'
    ``listed`` answer does not show holding every device they request of it (``name`` of
    each): the kubelet may not have recorded its Allocate yet, so one of them may hold a slot
    that answer leaves out. A pod whose init containers request ``resource`` always counts
    (its app containers re-use their devices, so counts do not add up)."""
    held = {(pod.namespace, pod.name): {i for r, ids in pod.devices if r == resource for i in ids}
            for pod in listed}
    unaccounted = []
    for pod in bound:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        wants = extended_requests(spec).get(resource, 0)
        by_init = extended_requests({"containers": spec.get("initContainers") or []})
        ref = (meta.get("namespace", ""), meta.get("name", ""))
        if wants and (by_init.get(resource) or len(held.get(ref, ())) < wants):
            unaccounted.append(f"{ref[0]}/{ref[1]}")
    return unaccounted


def unlisted_pods(
    bound: Iterable[Mapping[str, Any]], listed: Sequence[PodDevices], resource: str
) -> list[str]:
    """Of the pods ``bound`` here (not ended) that request ``resource`` in any container, those
    pod-resources' ``listed`` answer does not name at all (``namespace/name`` of each): the
    kubelet has not admitted them, yet or again after its restart, and one of them may hold a
    slot that answer leaves out."""
    named = {(pod.namespace, pod.name) for pod in listed}
    unlisted = []
    for pod in bound:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        ref = (meta.get("namespace", ""), meta.get("name", ""))
        if extended_requests(spec).get(resource, 0) and ref not in named:
            unlisted.append(f"{ref[0]}/{ref[1]}")
    return unlisted


def free_on_bound_pods(verdict: Verdict, bound: Sequence[Mapping[str, Any]] | None,
                       listed: Sequence[PodDevices], resource: str
                       ) -> tuple[bool, list[str]]:
    """For ``GRACE_OVER`` and ``EVIDENCE``, given the pods bound here (None: not readable):
    whether to free the slot, and the unlisted pods that keep one past its grace."""
    if verdict is Verdict.GRACE_OVER:
        if bound is not None and (waiting := unlisted_pods(bound, listed, resource)):
            return False, waiting
        return True, []
    # Per-pod evidence (C9): every pod bound here that asks for the resource is listed with
    # all its devices of it, and the slot is not among them, so no live pod holds it.
    return bound is not None and not unaccounted_pods(bound, listed, resource), []
