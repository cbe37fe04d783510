"""The two kinds of device-plugin backends over slots: per Instance and per Configuration.

Why this exists: the generic lifecycle (``agent.deviceplugin``) asks a ``PluginBackend`` to
allocate, prefer and prepare; here those questions are answered with slots. An Instance plugin's
device ids are slot ids; a Configuration plugin's are virtual ids that are mapped onto a free
slot of one of the Configuration's Instances at ``Allocate`` time and recorded as
``C:<virtual id>:<node>``. Both claim through the Instance's ``SlotLedger`` under its lock, and
both turn every refusal into a ``PluginError`` whose message names the slot or id.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Iterable, Sequence
from typing import Protocol

import grpc

from agent.deviceplugin.backend import ContainerAllocation, PluginError
from agent.deviceplugin.feed import DeviceFeed
from agent.metrics import AgentMetrics
from agent.node_devices import NodeDevice
from agent.slots.ledger import InstanceGone, SlotLedger, SlotUnavailable, TooManyConflicts
from agent.slots.rules import SlotRef, available_slots, broker_envs, held_virtual_ids, slot_ids
from crds.instance import Instance, SlotUsage
from discovery_handlers.contract import DeviceSpec, Mount

log = logging.getLogger(__name__)

FAILED = grpc.StatusCode.FAILED_PRECONDITION


class SlotWorld(Protocol):
    """What backends need of the service that runs them."""

    node: str
    metrics: AgentMetrics

    def ledger(self, namespace: str, instance: str) -> SlotLedger: ...

    def instance(self, namespace: str, instance: str) -> Instance | None: ...

    def remember(self, instance: Instance) -> None: ...

    def device(self, namespace: str, instance: str) -> NodeDevice | None: ...

    def configuration_instances(self, namespace: str, configuration: str) -> list[Instance]: ...

    def slots_changed(self, refs: Iterable[SlotRef]) -> None: ...


def _allocation(devices: Sequence[tuple[str, NodeDevice]]) -> ContainerAllocation:
    envs: dict[str, str] = {}
    mounts: list[Mount] = []
    specs: list[DeviceSpec] = []
    cdi: list[str] = []
    for instance_name, device in devices:
        envs.update(broker_envs(instance_name, device.properties))
        mounts.extend(m for m in device.mounts if m not in mounts)
        specs.extend(s for s in device.device_specs if s not in specs)
        if device.cdi_name and device.cdi_name not in cdi:
            cdi.append(device.cdi_name)
    return ContainerAllocation(
        envs=envs, mounts=tuple(mounts), device_specs=tuple(specs), cdi_devices=tuple(cdi)
    )


def _usable_device(world: SlotWorld, namespace: str, instance: str) -> NodeDevice:
    device = world.device(namespace, instance)
    if device is None:
        raise PluginError(FAILED, f"Instance {namespace}/{instance} is not served on this node")
    if not device.healthy:
        raise PluginError(FAILED, f"Instance {namespace}/{instance} is unhealthy on this node")
    return device


async def _claim(
    world: SlotWorld, resource: str, namespace: str, instance: str, wanted: dict[str, SlotUsage]
) -> None:
    """Claim ``wanted`` on one Instance under its lock; refusals become ``PluginError``."""
    ledger = world.ledger(namespace, instance)
    try:
        async with ledger.lock:
            claimed = await ledger.claim(wanted, known=world.instance(namespace, instance))
            # The next Allocate judges on this copy rather than on one the watch has not
            # caught up with yet (which would cost a 409 and a re-read).
            world.remember(claimed)
    except SlotUnavailable as error:
        world.metrics.slot_conflicts.labels(resource=resource).inc()
        raise PluginError(FAILED, f"cannot claim {error}") from error
    except TooManyConflicts as error:
        world.metrics.slot_conflicts.labels(resource=resource).inc()
        raise PluginError(grpc.StatusCode.UNAVAILABLE, str(error)) from error
    except InstanceGone as error:
        raise PluginError(FAILED, str(error)) from error
    world.slots_changed(SlotRef(namespace, instance, slot) for slot in wanted)


async def _counted(
    world: SlotWorld, resource: str, allocation: Awaitable[list[ContainerAllocation]]
) -> list[ContainerAllocation]:
    """Await an allocation, counting it by outcome in the allocations metric."""
    try:
        answers = await allocation
    except PluginError:
        world.metrics.allocations.labels(resource=resource, outcome="refused").inc()
        raise
    world.metrics.allocations.labels(resource=resource, outcome="ok").inc()
    return answers


class InstanceBackend:
    """Backend of ``edgeplug.io/<instance>``: device ids are the Instance's slot ids."""

    def __init__(self, *, world: SlotWorld, namespace: str, instance: str, resource: str) -> None:
        self._world = world
        self._namespace = namespace
        self._instance = instance
        self._resource = resource

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        return await _counted(self._world, self._resource, self._allocate(requests))

    async def _allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerAllocation]:
        world, ns, name = self._world, self._namespace, self._instance
        device = _usable_device(world, ns, name)
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
        await _claim(world, self._resource, ns, name, dict.fromkeys(wanted, mine))
        return [_allocation([(name, device)]) for _ in requests]

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        instance = self._world.instance(self._namespace, self._instance)
        held = set()
        if instance is not None:
            mine = SlotUsage.by_node(self._world.node).format()
            held = {s for s, u in instance.spec.device_usage.items() if u == mine}
        ordered = [*must_include]
        ordered += [s for s in available if s in held and s not in ordered]
        ordered += [s for s in available if s not in ordered]
        return ordered[: max(size, len(must_include))]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        device = _usable_device(self._world, self._namespace, self._instance)
        await _prepare(device, self._instance)


async def _prepare(device: NodeDevice, instance: str) -> None:
    if device.prepare is None:
        return
    try:
        await device.prepare()
    except Exception as error:
        raise PluginError(
            grpc.StatusCode.INTERNAL, f"preparing Instance {instance} failed: {error}"
        ) from error


class ConfigurationBackend:
    """Backend of the configuration-level resource: virtual ids mapped onto slots on Allocate."""

    def __init__(
        self,
        *,
        world: SlotWorld,
        namespace: str,
        configuration: str,
        resource: str,
        feed: DeviceFeed,
    ) -> None:
        self._world = world
        self._namespace = namespace
        self._configuration = configuration
        self._resource = resource
        self._feed = feed

    def _instances(self) -> list[Instance]:
        return self._world.configuration_instances(self._namespace, self._configuration)

    async def allocate(self, requests: Sequence[Sequence[str]]) -> Sequence[ContainerAllocation]:
        return await _counted(self._world, self._resource, self._allocate(requests))

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
        try:
            for ids in requests:
                devices = []
                for vid in ids:
                    ref = await self._place(vid, {r.instance for r, _ in claimed})
                    claimed.append((ref, SlotUsage.by_configuration(vid, self._world.node)))
                    devices.append(
                        (ref.instance, _usable_device(self._world, ref.namespace, ref.instance))
                    )
                answers.append(_allocation(devices))
        except PluginError:
            await self._roll_back(claimed)
            raise
        return answers

    async def _place(self, vid: str, taken_instances: set[str]) -> SlotRef:
        """The slot ``vid`` holds already, or a newly claimed one (distinct Instances first)."""
        world = self._world
        held = held_virtual_ids(self._instances(), world.node)
        if vid in held:
            return held[vid]
        usable = [
            i
            for i in self._instances()
            if (d := world.device(i.namespace, i.name)) is not None and d.healthy
        ]
        candidates = available_slots(usable, world.node)
        candidates.sort(key=lambda r: r.instance in taken_instances)  # stable: distinct first
        usage = SlotUsage.by_configuration(vid, world.node)
        last: PluginError | None = None
        for ref in candidates:
            try:
                await _claim(world, self._resource, ref.namespace, ref.instance, {ref.slot: usage})
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

    async def preferred_allocation(
        self, *, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> Sequence[str]:
        held = held_virtual_ids(self._instances(), self._world.node)
        ordered = [*must_include]
        seen = {held[v].instance for v in ordered if v in held}
        # Held ids first, on distinct Instances first; then ids still unmapped.
        held_here = [v for v in available if v in held and v not in ordered]
        held_here.sort(key=lambda v: held[v].instance in seen)
        ordered += held_here
        ordered += [v for v in available if v not in ordered]
        return ordered[: max(size, len(must_include))]

    async def pre_start(self, device_ids: Sequence[str]) -> None:
        held = held_virtual_ids(self._instances(), self._world.node)
        for vid in device_ids:
            ref = held.get(vid)
            if ref is None:
                raise PluginError(FAILED, f"virtual device {vid!r} holds no slot on this node")
            device = _usable_device(self._world, ref.namespace, ref.instance)
            await _prepare(device, ref.instance)
