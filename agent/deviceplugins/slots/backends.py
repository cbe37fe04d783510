"""The two kinds of device-plugin backends over slots: per Instance and per Configuration.

``agent.deviceplugins.kubelet`` asks a ``PluginBackend`` to allocate, prefer and prepare; these
answer with slots. An Instance plugin's device ids are slot ids; a Configuration plugin's are
virtual ids mapped onto a free slot of one of its Instances at ``Allocate`` and recorded as
``C:<virtual id>:<node>``. A slot reserved for this node is answered at once and recorded
after (the fast path); every other claim is a conditioned write through the Instance's
``SlotLedger`` first (``claiming``); the orderings of ``GetPreferredAllocation`` are
``preferences``'. Every refusal is a ``PluginError`` naming the slot or id. Why this is safe:
docs/slots.md (C6-C8, C14).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import grpc

from agent.deviceplugins.kubelet.backend import PluginError
from agent.deviceplugins.kubelet.feed import DeviceFeed
from agent.deviceplugins.slots.claiming import (
    FAILED,
    Counted,
    SlotWorld,
    claim,
    counted,
    prepare,
    promise,
    usable_device,
)
from agent.deviceplugins.slots.preferences import configuration_preference, instance_preference
from agent.deviceplugins.slots.rules import SlotRef, available_slots, held_virtual_ids, slot_ids
from agent.deviceplugins.volcano_allocation import Pin, PinRefused, VolcanoPins
from agent.discovery.container_devices import ContainerAllocation, container_allocation
from agent.discovery.node_devices import NodeDevice
from crds.instance import Instance, SlotUsage, SlotUsageKind
from discovery_handlers.contract import RankingHandler

log = logging.getLogger(__name__)

#: The ``kind`` label of the allocation metrics: an Instance's own resource, or the
#: Configuration's (virtual ids mapped onto any of its Instances).
KIND_INSTANCE = "instance"
KIND_CONFIGURATION = "configuration"


class InstanceBackend:
    """Backend of ``edgeplug.io/<instance>``: device ids are the Instance's slot ids."""

    def __init__(
        self, *, world: SlotWorld, namespace: str, instance: str, configuration: str
    ) -> None:
        self._world = world
        self._namespace = namespace
        self._instance = instance
        self._counted = Counted(namespace, configuration, KIND_INSTANCE)

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        return await counted(self._world, self._counted, self._allocate(requests))

    async def _allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        world, ns, name = self._world, self._namespace, self._instance
        device = usable_device(world, ns, name)
        instance = world.instance(ns, name)
        known = set(slot_ids(instance)) if instance else set()
        wanted = [slot for ids in requests for slot in ids]
        for slot in wanted:
            if slot not in known:
                raise PluginError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown device id {slot!r}: not a slot of Instance {ns}/{name}",
                )
        mine = SlotUsage.by_node(world.node)
        usages = dict.fromkeys(wanted, mine)
        if not promise(world, ns, name, usages):
            await claim(world, self._counted, ns, name, usages)
        return [container_allocation([device]) for _ in requests]

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        instance = self._world.instance(self._namespace, self._instance)
        held = set()
        if instance is not None:
            mine = SlotUsage.by_node(self._world.node).format()
            held = {s for s, u in instance.spec.device_usage.items() if u == mine}
        return instance_preference(available, must_include, size, held)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        await prepare([usable_device(self._world, self._namespace, self._instance)])


class ConfigurationBackend:
    """Backend of the configuration-level resource: virtual ids mapped onto slots on Allocate."""

    def __init__(
        self,
        *,
        world: SlotWorld,
        namespace: str,
        configuration: str,
        feed: DeviceFeed,
        pins: VolcanoPins | None = None,
    ) -> None:
        """``pins``: where a scheduler's own choice of devices for the pod being admitted is
        read (Volcano's, for Ascend chips); the kubelet's ids are then placed on those."""
        self._pins = pins
        self._world = world
        self._namespace = namespace
        self._configuration = configuration
        self._counted = Counted(namespace, configuration, KIND_CONFIGURATION)
        self._feed = feed
        # Virtual id → the Instance a handler's ranking chose for it (GetPreferredAllocation,
        # or Allocate itself); ``_place`` claims there first. Only a preference: any free slot
        # still serves when the chosen one was taken meanwhile.
        self._intent: dict[str, str] = {}

    def _instances(self) -> list[Instance]:
        return self._world.configuration_instances(self._namespace, self._configuration)

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        return await counted(self._world, self._counted, self._allocate(requests))

    async def _allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        known = self._feed.ids()
        for vid in (v for ids in requests for v in ids):
            if vid not in known:
                raise PluginError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown device id {vid!r}: not a virtual device of Configuration "
                    f"{self._namespace}/{self._configuration}",
                )
        claimed: list[tuple[SlotRef, SlotUsage]] = []
        answers = []
        pinned: list[Pin] = []
        try:
            for ids in requests:
                pin = await self._pin(len(ids))
                if pin is not None:
                    answers.append(container_allocation(await self._place_pinned(
                        ids, pin, claimed)))
                    pinned.append(pin)
                    continue
                held = held_virtual_ids(self._instances(), self._world.node)
                if any(v not in held and v not in self._intent for v in ids):
                    self._plan(ids, must_include=())  # no GetPreferredAllocation came first
                devices = []
                for vid in ids:
                    ref = await self._place(vid, {r.instance for r, _ in claimed})
                    claimed.append((ref, SlotUsage.by_configuration(vid, self._world.node)))
                    devices.append(usable_device(self._world, ref.namespace, ref.instance))
                answers.append(container_allocation(devices))
        except PluginError:
            await self._roll_back(claimed)
            raise
        for pin in pinned:
            assert self._pins is not None
            self._pins.served(pin)
        return answers

    async def _pin(self, size: int) -> Pin | None:
        if self._pins is None:
            return None
        try:
            return await self._pins(size)
        except PinRefused as error:
            raise PluginError(FAILED, str(error)) from error
        except Exception as error:  # a refusal, the API server away: no choice to honour
            raise PluginError(grpc.StatusCode.UNAVAILABLE, "cannot list this node's pods for "
                              f"a scheduler's choice of devices: {error}") from error

    async def _place_pinned(self, vids: Sequence[str], pin: Pin,
                            claimed: list[tuple[SlotRef, SlotUsage]]) -> list[NodeDevice]:
        """Claim a slot of each Instance ``pin`` names for the matching virtual id."""
        world = self._world
        held = held_virtual_ids(self._instances(), world.node)
        devices = []
        for vid, name in zip(vids, pin.instances, strict=True):
            chip = pin.names.get(name, name)
            device = world.device(self._namespace, name)
            if device is None or not device.healthy:
                why = device.health.reason if device else "not served on this node"
                raise PluginError(FAILED, f"{pin.owner}: {chip} is unhealthy: {why}")
            usage = SlotUsage.by_configuration(vid, world.node)
            stale = held.get(vid)
            if stale is not None and stale.instance != name:
                await self._roll_back([(stale, usage)])  # the id's earlier pod is gone
            instance = world.instance(self._namespace, name)
            free = [r.slot for r in available_slots([instance] if instance else [], world.node)]
            slot = stale.slot if stale is not None and stale.instance == name else (
                free[0] if free else None)
            if slot is None:
                raise PluginError(FAILED, f"{pin.owner}: {chip} is not free on this node "
                                          "(another pod holds it)")
            if not promise(world, self._namespace, name, {slot: usage}):
                await claim(world, self._counted, self._namespace, name, {slot: usage})
            claimed.append((SlotRef(self._namespace, name, slot), usage))
            devices.append(device)
        return devices

    async def _place(self, vid: str, taken_instances: set[str]) -> SlotRef:
        """The slot ``vid`` holds already, or a newly claimed one (distinct Instances first)."""
        world = self._world
        usage = SlotUsage.by_configuration(vid, world.node)
        ref = held_virtual_ids(self._instances(), world.node).get(vid)
        if ref is not None:
            # The kubelet re-uses the ids of pods that left: a held id asked for again is a
            # new hand-out with the very same usage value. It is promised or claimed again
            # like any other (the hand-out count moves), so an orphan freer holding evidence
            # from before it cannot free it (docs/slots.md, C8).
            if promise(world, ref.namespace, ref.instance, {ref.slot: usage}):
                return ref
            try:
                await claim(world, self._counted, ref.namespace, ref.instance,
                             {ref.slot: usage})
                return ref
            except PluginError:
                pass  # freed meanwhile, and no longer ours: place the id anew
        usable = [
            i
            for i in self._instances()
            if (d := world.device(i.namespace, i.name)) is not None and d.healthy
        ]
        candidates = available_slots(usable, world.node)
        intended = self._intent.pop(vid, None)
        # Stable sorts: the ranked Instance first, then distinct Instances before shared ones.
        candidates.sort(key=lambda r: (r.instance != intended, r.instance in taken_instances))
        last: PluginError | None = None
        for ref in candidates:
            try:
                await claim(world, self._counted, ref.namespace, ref.instance, {ref.slot: usage})
                return ref
            except PluginError as error:
                last = error
        detail = f": last attempt: {last}" if last else ""
        raise PluginError(FAILED, f"no free slot on this node for virtual device {vid!r}{detail}")

    async def _roll_back(self, claimed: list[tuple[SlotRef, SlotUsage]]) -> None:
        for ref, usage in claimed:
            ledger = self._world.ledger(ref.namespace, ref.instance)
            try:
                async with ledger.lock:
                    await ledger.free({ref.slot: usage})
            except Exception:
                log.exception("rolling back a partial allocation failed", extra={"slot": ref.slot})

    def _ranker(self) -> NodeDevice | None:
        """A device of this Configuration whose handler ranks (its handler and details)."""
        for instance in self._instances():
            device = self._world.device(instance.namespace, instance.name)
            if device is not None and isinstance(device.handler, RankingHandler):
                return device
        return None

    def _plan(self, vids: Sequence[str], *, must_include: Sequence[str]) -> list[str] | None:
        """Let the handler choose Instances for the unmapped ``vids`` (recorded as intents).

        Returns ``vids`` reordered so the ones on ranked Instances come first, or None when the
        handler does not rank. Held virtual ids count as ``must_include`` devices.
        """
        ranker = self._ranker()
        if ranker is None or not isinstance(ranker.handler, RankingHandler):
            return None
        world = self._world
        held = held_virtual_ids(self._instances(), world.node)
        records = {
            i.name: d
            for i in self._instances()
            if (d := world.device(i.namespace, i.name)) is not None and d.healthy
        }
        free = {r.instance for r in available_slots(
            [i for i in self._instances() if i.name in records], world.node
        )}
        must = [records[held[v].instance] for v in must_include if v in held
                and held[v].instance in records]
        must += [records[held[v].instance] for v in vids if v in held
                 and held[v].instance in records and records[held[v].instance] not in must]
        available = [records[name] for name in sorted(free)]
        by_id = {d.device.id: d for d in [*available, *must]}
        ranked = ranker.handler.rank(
            ranker.details, [d.device for d in available], [d.device for d in must],
            len(vids) + len([v for v in must_include if v not in vids]),
        )
        chosen = [by_id[d.id].instance for d in ranked if d.id in by_id]
        spare = [name for name in chosen if name not in {m.instance for m in must}]
        ordered = [v for v in vids if v in held]
        for vid in vids:
            if vid in held:
                continue
            if spare:
                self._intent[vid] = spare.pop(0)
            ordered.append(vid)
        return ordered

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        held = held_virtual_ids(self._instances(), self._world.node)
        wanted = max(size, len(must_include))
        # With a ranking handler, held ids on chosen Instances come first and the rest of the
        # request is planned onto the Instances it chose.
        unmapped = [v for v in available if v not in held and v not in must_include]
        planned = self._plan(unmapped[: wanted - len(must_include)], must_include=must_include)
        if planned is not None:
            return [*must_include, *planned][:wanted]
        return configuration_preference(available, must_include, size, held)

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        # A slot the fast path promised shows in the Instance only once recorded, which may
        # come after the kubelet's PreStartContainer: promised ones count as held here.
        world = self._world
        instances = self._instances()
        held = held_virtual_ids(instances, world.node)
        for instance in instances:
            for slot, usage in world.ledger(instance.namespace, instance.name).promised.items():
                if usage.kind is SlotUsageKind.CONFIGURATION and usage.node == world.node:
                    held.setdefault(usage.virtual_id,
                                    SlotRef(instance.namespace, instance.name, slot))
        devices = []
        for vid in device_ids:
            ref = held.get(vid)
            if ref is None:
                raise PluginError(FAILED, f"virtual device {vid!r} holds no slot on this node")
            devices.append(usable_device(self._world, ref.namespace, ref.instance))
        await prepare(devices)
