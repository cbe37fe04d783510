"""Moving this node's slot reservations: what a pass reserves, releases and publishes as
demand, and this node's usage freed where an Instance no longer lists it.

The decisions are pure functions (``move_for``, ``without_release``, ``held_here``) over an
Instance and what pinned pods want (``agent.deviceplugins.slots.rules.reservation_plan``
underneath); ``ReservationMover`` only carries them out through each Instance's ``SlotLedger``. A
slot given away to another node goes through the compatibility mode's cross-node protocol first
(``agent.deviceplugins.crossnode.coordinator``, only loaded once a shared device is served here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from lightkube import ApiError, AsyncClient

from agent.deviceplugins.slots.instance_cache import InstanceCache, Key
from agent.deviceplugins.slots.ledger import InstanceGone, SlotLedger, TooManyConflicts
from agent.deviceplugins.slots.rules import ReservationPlan, is_held_by, reservation_plan, usage_of
from agent.kube import node_instances
from crds.instance import Instance, SlotUsage
from crds.naming import instance_resource_name


class CrossNodeMoves(Protocol):
    """What moving reservations asks of the cross-node protocol
    (``agent.deviceplugins.crossnode.coordinator.CrossNode``)."""

    retry: bool

    def needs(self, served: Mapping[Key, Instance], config_resources: Mapping[Key, str]
              ) -> tuple[dict[Key, int], set[Key]]: ...

    async def give_away(self, key: Key, slots: set[str]) -> bool: ...

    async def keep_down(self) -> None: ...

log = logging.getLogger(__name__)

#: A pass lets waiting calls (Allocate) run after this many Instances.
PASS_YIELD_EVERY = 16
#: New Instances' reservations written at once before their plugins start (as many as the
#: discovery side keeps Instance writes in flight).
RESERVE_IN_FLIGHT = 8

#: Slots pinned pods want of each Instance, and the Instances a starting pod may need.
Needs = tuple[dict[Key, int], set[Key]]


def move_for(instance: Instance, node: str, *, wanted: int, hold: bool,
             reserve_only: bool = False) -> ReservationPlan | None:
    """What this node writes on ``instance`` now; None: nothing (no slot to reserve or
    release, and ``status.demand`` already says the demand). ``reserve_only``: only
    reservations, with the published demand kept (before the Instance's plugin starts)."""
    plan = reservation_plan(instance, node, wanted=wanted, hold=hold)
    published = instance.demand.get(node, 0)
    if reserve_only:
        if not plan.reserve:
            return None
        plan = replace(plan, release=(), demand=published)
    if not plan and published == plan.demand:
        return None
    return plan


def without_release(plan: ReservationPlan, instance: Instance, node: str
                    ) -> ReservationPlan | None:
    """``plan`` once its releases are refused (the slots are still advertised); None if
    nothing is left to write."""
    kept = replace(plan, release=())
    if not kept and instance.demand.get(node, 0) == kept.demand:
        return None
    return kept


def held_here(instance: Instance, node: str) -> dict[str, SlotUsage]:
    """The slots of ``instance`` that ``node`` holds, with their usage."""
    return {slot: usage_of(instance, slot) for slot in instance.spec.device_usage
            if is_held_by(usage_of(instance, slot), node)}


class ReservationMover:
    """Carries out the reservation decisions of a pass; sets ``retry`` when one failed."""

    def __init__(self, *, client: AsyncClient, node: str, cache: InstanceCache,
                 ledger: Callable[[str, str], SlotLedger],
                 cross: Callable[[], CrossNodeMoves | None], wake: Callable[[], None]) -> None:
        self._client = client
        self.node = node
        self._cache = cache
        self._ledger = ledger
        self._cross = cross
        self._wake = wake
        #: A move failed in part: the loop tries again soon.
        self.retry = False

    def needs(self, served: Mapping[Key, Instance], config_resources: Mapping[Key, str]) -> Needs:
        """Slots pinned pods want of each Instance, and Instances a starting pod may need.
        Without the cross-node protocol (local devices only) no pod's demand is followed: the
        one listed node reserves every free slot and never gives one away."""
        cross = self._cross()
        if cross is None:
            return {}, set()
        return cross.needs(served, config_resources)

    async def reserve_before_serving(self, served: dict[Key, Instance], new: list[Key],
                                     needs: Needs) -> None:
        """Reservations for the ``new`` Instances (no plugin serves them yet), written before
        their plugins start, so that a new device's first ``ListAndWatch`` already offers the
        slots reserved for this node. Only reservations: nothing is advertised yet that a
        release would have to take back. ``served`` takes the copies written."""
        # Each Instance's write is its own (its ledger's lock, conditioned on its copy): up to
        # RESERVE_IN_FLIGHT of them at once, as the discovery side writes the Instances.
        # What pinned pods want is split over all of a Configuration's Instances: judged on
        # the whole pass (``needs``), not on each lane's share of it.
        await asyncio.gather(*(
            self.move({key: served[key] for key in new[lane::RESERVE_IN_FLIGHT]},
                      reserve_only=True, needs=needs)
            for lane in range(min(RESERVE_IN_FLIGHT, len(new)))
        ))
        for key in new:
            if (current := self._cache.get(key)) is not None:
                served[key] = self._ledger(*key).latest or current

    async def move(self, served: Mapping[Key, Instance], *, needs: Needs,
                   reserve_only: bool = False) -> None:
        wanted, holding = needs
        for count, key in enumerate(served, start=1):
            if count % PASS_YIELD_EVERY == 0:
                await asyncio.sleep(0)
            # The newest copy known, not the pass's: the watch (or a write of ours) may have
            # brought a newer one since the pass began, and the write is conditioned on it.
            if (watched := self._cache.get(key)) is None:
                continue  # deleted while the pass yielded: nothing left to move
            ledger = self._ledger(*key)
            instance = ledger.latest or watched
            plan = move_for(instance, self.node, wanted=wanted.get(key, 0),
                            hold=key in holding, reserve_only=reserve_only)
            if plan is None:
                continue
            if plan.release and not await self._give_away_or_retry(key, set(plan.release)):
                plan = without_release(plan, instance, self.node)
                if plan is None:
                    continue
            try:
                async with ledger.lock:
                    if plan.release:
                        await ledger.release(list(plan.release), known=ledger.current(instance))
                    if plan.reserve:
                        # The demand these reservations meet goes in the same write.
                        await ledger.reserve(list(plan.reserve), demand=plan.demand,
                                             known=ledger.current(instance))
                    elif instance.demand.get(self.node, 0) != plan.demand:
                        await ledger.publish_demand(plan.demand)
            except (ApiError, TooManyConflicts, InstanceGone) as error:
                self.retry = True
                log.warning("moving reservations of %s/%s failed: %s", *key, error)
            else:
                if not reserve_only:
                    # This pass's plugins advertised from the copy before the move: the next
                    # pass advertises from the write itself (InstanceCache.pass_starts)
                    # without waiting for its watch event, whose echo then wakes nothing.
                    self._wake()

    async def _give_away_or_retry(self, key: Key, slots: set[str]) -> bool:
        """Stop advertising ``slots`` so that their reservations can be released, once the
        cross-node protocol's gate clears them; False (still advertised) if it does not."""
        cross = self._cross()
        if cross is None:
            return False  # only a shared device moves slots between nodes
        try:
            if await cross.give_away(key, slots):
                return True
            self.retry = self.retry or cross.retry
        except ApiError as error:
            self.retry = True
            log.warning("giving slots %s of %s/%s away failed: %s", sorted(slots), *key, error)
        return False

    async def keep_node_count_down(self) -> None:
        """The Node's counts no higher than what this node advertises healthy (compatibility
        mode only: ``agent.deviceplugins.crossnode.coordinator.CrossNode.keep_down``)."""
        cross = self._cross()
        if cross is None:
            return
        try:
            await cross.keep_down()
        except ApiError as error:
            self.retry = True
            log.warning("lowering the Node's device counts failed: %s", error)

    async def withdraw_from_unlisted(self) -> None:
        """Free this node's usage on Instances that no longer list it; once none is left,
        the Instance concerns this node no more: its label goes and it is forgotten."""
        for key, instance in list(self._cache.items()):
            if self.node in instance.spec.nodes:
                continue
            if mine := held_here(instance, self.node):
                ledger = self._ledger(*key)
                async with ledger.lock:
                    await ledger.free(mine)
                continue
            if not self._cache.is_unlabelled(key):
                meta = {"name": key[1], "namespace": key[0],
                        "resourceVersion": instance.resource_version}
                try:
                    # Refused as stale (409): it changed since, and its event comes.
                    await node_instances.drop_label(self._client, self.node, {"metadata": meta})
                except ApiError as error:
                    self.retry = True
                    log.warning("dropping this node's label from %s/%s failed: %s", *key, error)
                    continue
            self._cache.forget(key)


def unserved(served: Mapping[Key, Instance], serves_resource: Callable[[str], bool]) -> list[Key]:
    """The Instances of ``served`` whose plugin does not run yet."""
    return [key for key, instance in served.items()
            if not serves_resource(instance_resource_name(instance.name))]
