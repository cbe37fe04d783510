"""Freeing slots this node holds for pods that no longer exist, and recording unrecorded ones.

The kubelet never tells a device plugin that a pod has gone, so ``OrphanFreer.sweep`` asks
pod-resources ``List`` which device ids live pods hold and frees, through the slot's ledger, a
held slot no longer listed: at once if a ``List`` showed it held since its latest hand-out,
else once every ``List`` since that hand-out has missed it for ``settings.slots.orphan_grace_s``
(sooner on per-pod evidence, ``unaccounted_pods``, while another node waits for it). It never frees
a slot promised or handed out again since the ``List`` it judged on (the ledger's hand-out count),
nor on an answer from a kubelet that restarted (its socket's identity), nor, past the grace,
while a pod bound here that asks for the slot's resource is not listed at all
(``unlisted_pods``). The same ``List`` records slots live pods hold that ``deviceUsage`` shows
free (an agent killed between answering and recording). Holding and promising nothing, a sweep
asks nothing. Why each rule: docs/slots.md (C7-C10).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc

from agent.deviceplugins.kubelet.podresources import (
    PodDevices,
    PodResourcesClient,
    devices_by_resource,
)
from agent.deviceplugins.slots.ledger import SlotLedger
from agent.deviceplugins.slots.orphans import (
    HeldSlot,
    Verdict,
    free_on_bound_pods,
    held_slots,
    judge_slot,
    unaccounted_pods,
    unlisted_pods,
)
from agent.deviceplugins.slots.rules import SlotRef, is_held_by, listed_demand, slot_ids, usage_of
from agent.settings import current
from crds.instance import Instance, SlotUsage
from crds.naming import instance_resource_name

__all__ = [
    "OrphanFreer",
    "unaccounted_pods",
    "unlisted_pods",
]

log = logging.getLogger(__name__)


_Key = tuple[str, str, str, str]  # namespace, instance, slot, usage value
_V = TypeVar("_V")
#: The pods bound to this node that have not ended, read consistently (the API's JSON); None
#: when they could not be read this time.
BoundPods = Callable[[], Awaitable[list[dict[str, Any]] | None]]


class OrphanFreer:
    """Remembers since when each held slot has looked orphaned; frees it after the grace."""

    def __init__(
        self,
        *,
        client: PodResourcesClient,
        node: str,
        ledger: Callable[[str, str], SlotLedger],
        grace: float | None = None,
        on_listed: Callable[[bool], None] = lambda ok: None,
        clock: Callable[[], float] = time.monotonic,
        bound_pods: BoundPods | None = None,
    ) -> None:
        """``on_listed(ok)``: after each sweep that asked pod-resources, once its answer is
        acted on (``ok``), or when it failed. ``clock``: what the grace is measured on.
        ``bound_pods``: how to read the pods bound here (per-pod evidence, which frees a slot
        another node awaits before the grace); None: the grace alone."""
        self._client = client
        self._bound_pods = bound_pods
        self._clock = clock
        self._on_listed = on_listed
        self._node = node
        self._ledger = ledger
        self._grace = current().slots.orphan_grace_s if grace is None else grace
        #: Slot (with its usage) → when the first ``List`` asked since the slot's latest
        #: hand-out missed it, and the hand-out count that ``List`` was asked at.
        self._orphan_since: dict[_Key, tuple[float, int]] = {}
        #: Slot (with its usage) → the slot's hand-out count when a ``List`` that showed it
        #: held by a live pod was asked.
        self._seen_live: dict[_Key, int] = {}
        #: The kubelet (its pod-resources socket's identity) that answered the last ``List``
        #: the memories above rest on; None while they hold nothing.
        self._kubelet: tuple[int, int] | None = None
        #: At the last sweep another node waited for a slot of an Instance this node holds
        #: one of: the next sweep is due after ``settings.slots.sweep_awaited_s``.
        self.awaited = False
        #: Slots kept past their grace for pods the kubelet does not list (told once each).
        self._kept: set[_Key] = set()

    def claimed(self, refs: Iterable[SlotRef]) -> None:
        """``refs`` were just handed to a pod (claimed, promised, or a held slot or virtual id
        handed out again): their hand-out counts move, which restarts their orphan clocks."""
        for ref in refs:
            self._ledger(ref.namespace, ref.instance).handed_out([ref.slot])

    async def sweep(
        self,
        instances: Iterable[Instance],
        configuration_resources: Mapping[tuple[str, str], str],
        *,
        adopt: bool = False,
    ) -> bool:
        """One pass: record slots live pods hold unrecorded, free those orphaned long enough.

        Returns whether this node holds (or has promised) a slot: the caller sweeps again soon
        if so. Holding none, pod-resources is not asked at all, unless ``adopt`` (an
        Instance is about to be served for the first time since start, and a crash may have
        left one of its slots unrecorded), which also raises
        ``grpc.RpcError`` when pod-resources does not answer.
        """
        instances = list(instances)
        self.awaited = any(self._awaited(i) for i in instances)
        promised = any(self._ledger(i.namespace, i.name).promised for i in instances)
        if not adopt and not promised and not any(
            is_held_by(usage_of(i, slot), self._node)
            for i in instances
            for slot in i.spec.device_usage
        ):
            self._orphan_since.clear()
            self._seen_live.clear()
            self._kubelet = None
            return False
        # Hand-out counts before the List: a hand-out after this point may not show in it.
        handouts = {
            (i.namespace, i.name, slot): self._ledger(i.namespace, i.name).handouts_of(slot)
            for i in instances
            for slot in i.spec.device_usage
        }
        asked_of = self._client.server_identity()
        try:
            listed = await self._client.pods()
        except grpc.RpcError as error:
            self._on_listed(False)
            if adopt:
                raise
            log.warning("pod-resources List failed; not freeing slots this time: %s", error)
            return True
        in_use = devices_by_resource(listed)
        if not self._same_kubelet(asked_of, self._client.server_identity()):
            # The kubelet restarted during this List: which one answered is unknown, so this
            # answer tells nothing, not even that a slot is held. Taken as the new kubelet's,
            # the old one's listing of a pod would make the new one's first answers, which
            # leave out every pod not admitted again yet, read as that pod having ended.
            self._on_listed(True)
            return True
        await self._record_unrecorded(instances, in_use)
        held = held_slots(instances, self._node, configuration_resources)
        await self._judge(held, listed, in_use, handouts)
        seen = {self._key(h) for h in held}
        for key in set(self._orphan_since) - seen:
            del self._orphan_since[key]
        for key in set(self._seen_live) - seen:
            del self._seen_live[key]
        self._kept &= set(self._orphan_since)
        self._on_listed(True)
        return bool(seen) or promised

    @staticmethod
    def _key(held: HeldSlot) -> _Key:
        return (held.instance.namespace, held.instance.name, held.slot, held.value)

    async def _judge(self, held: list[HeldSlot], listed: Sequence[PodDevices],
                     in_use: Mapping[str, frozenset[str]],
                     handouts: Mapping[tuple[str, str, str], int]) -> None:
        """Each held slot judged on this ``List`` (``orphans.judge_slot``), its memories
        kept, and the slots found orphaned freed."""
        now = self._clock()
        #: The pods bound here, read once per sweep, after the List, when first needed.
        bound: list[dict[str, Any]] | None = None
        bound_read = False
        for slot in held:
            key = self._key(slot)
            if slot.slot in self._ledger(*key[:2]).promised:
                continue  # handed to a new pod, being recorded: not an orphan
            before = handouts.get(key[:3], 0)
            judged = judge_slot(
                live=slot.resource is not None
                and slot.device_id in in_use.get(slot.resource, frozenset()),
                handouts=before, seen_live=self._seen_live.get(key),
                clock=self._orphan_since.get(key), now=now, grace=self._grace,
                awaited=self.awaited and self._bound_pods is not None
                and slot.resource is not None)
            _remember(self._seen_live, key, judged.seen_live)
            _remember(self._orphan_since, key, judged.clock)
            free = judged.verdict is Verdict.FREE
            if judged.verdict in (Verdict.GRACE_OVER, Verdict.EVIDENCE):
                if self._bound_pods is None or slot.resource is None:
                    free = judged.verdict is Verdict.GRACE_OVER
                else:
                    if not bound_read:
                        bound, bound_read = await self._bound_pods(), True
                    free, waiting = free_on_bound_pods(judged.verdict, bound, listed,
                                                       slot.resource)
                    if waiting:
                        self._keep(key, waiting)
            if free:
                await self._free(slot.instance, slot.slot, slot.usage, before)
                self._orphan_since.pop(key, None)

    def _keep(self, key: _Key, waiting: list[str]) -> None:
        """``key``'s slot stays held past its grace: pods bound here that ask for its resource
        are not listed by the kubelet (a restarted one re-admits its pods only after it serves
        pod-resources again; the holder may be among them)."""
        if key not in self._kept:
            self._kept.add(key)
            log.info("kept a slot past the orphan grace: pods bound here that ask for its "
                     "resource are not listed by the kubelet (not admitted yet, or not again "
                     "since it restarted)", extra={"instance": key[1], "slot": key[2],
                                                   "pods": waiting})

    def _same_kubelet(self, asked_of: tuple[int, int] | None,
                      answered_by: tuple[int, int] | None) -> bool:
        """Forget every absence timer and "seen live" when the kubelet restarted since the
        last ``List`` or during this one (docs/slots.md, C10): its
        first answers leave out the pods it has not admitted again yet, so this ``List``
        frees nothing, and from now on a slot is freed only after the orphan grace. False when
        it restarted during this one: the answer may be either kubelet's, and is not used."""
        known, self._kubelet = self._kubelet, answered_by
        if asked_of == answered_by and known in (None, asked_of):
            return True
        if self._seen_live or self._orphan_since:
            log.info("the kubelet restarted: slots no pod-resources List shows held are freed "
                     "only after %.0f s", self._grace)
        self._seen_live.clear()
        self._orphan_since.clear()
        return asked_of == answered_by

    def _awaited(self, instance: Instance) -> bool:
        """This node holds a slot of ``instance`` and another listed node's pods wait for one."""
        return any(
            node != self._node for node in listed_demand(instance)
        ) and any(is_held_by(usage_of(instance, slot), self._node)
                  for slot in instance.spec.device_usage)

    async def _record_unrecorded(
        self, instances: list[Instance], in_use: Mapping[str, frozenset[str]]
    ) -> None:
        """Slots of Instance resources that live pods hold but ``deviceUsage`` shows free (an
        agent killed between answering ``Allocate`` and recording it) are recorded now."""
        mine = SlotUsage.by_node(self._node)
        for instance in instances:
            if self._node not in instance.spec.nodes:
                continue
            live = in_use.get(instance_resource_name(instance.name), frozenset()) & set(
                slot_ids(instance)
            )
            ledger = self._ledger(instance.namespace, instance.name)
            missing = {
                slot: mine
                for slot in sorted(live)
                if usage_of(instance, slot).is_free and slot not in ledger.promised
            }
            if not missing:
                continue
            try:
                async with ledger.lock:
                    await ledger.claim(missing, held_by_pod=True)
            except Exception as error:  # SlotUnavailable cannot happen while the rules hold
                log.error("recording slots %s that live pods hold failed: %s",
                          sorted(missing), error, extra={"instance": instance.name})
                continue
            self.claimed(SlotRef(instance.namespace, instance.name, s) for s in missing)
            log.info("recorded slots live pods hold (unrecorded at a crash)",
                     extra={"instance": instance.name, "slots": sorted(missing)})

    async def _free(self, instance: Instance, slot: str, usage: SlotUsage, handouts: int) -> None:
        """Free ``slot`` unless it was handed out again since its count was ``handouts``."""
        ledger = self._ledger(instance.namespace, instance.name)
        async with ledger.lock:
            if ledger.handouts_of(slot) != handouts or slot in ledger.promised:
                log.info("kept a slot handed out again since the pod-resources List",
                         extra={"instance": instance.name, "slot": slot})
                return
            await ledger.free({slot: usage})
        log.info(
            "freed a slot no live pod holds",
            extra={"instance": instance.name, "slot": slot, "usage": usage.format()},
        )


def _remember(memory: dict[_Key, _V], key: _Key, value: _V | None) -> None:
    if value is None:
        memory.pop(key, None)
    else:
        memory[key] = value
