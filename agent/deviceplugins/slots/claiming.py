"""The claim path both device-plugin backends share: a slot promised at once, or claimed.

A slot reserved for this node is answered at once and recorded after (``promise``, the fast
path); every other claim is a conditioned write through the Instance's ``SlotLedger``
(``claim``). ``counted`` counts and times an allocation; ``prepare`` runs the handler's
``prepare``. Every refusal is a ``PluginError`` naming the slot or id. Why this is safe:
docs/slots.md (C6-C8, C14).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from agent.deviceplugins.kubelet.backend import PluginError
from agent.deviceplugins.slots.ledger import (
    InstanceGone,
    SlotLedger,
    SlotUnavailable,
    TooManyConflicts,
)
from agent.deviceplugins.slots.rules import SlotRef, Verdict, judge_claim
from agent.discovery.container_devices import ContainerAllocation
from agent.discovery.node_devices import NodeDevice
from agent.metrics import AgentMetrics
from crds.instance import Instance, SlotUsage
from discovery_handlers.contract import PreparingHandler

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

    @property
    def answers_before_recording(self) -> bool:
        """Whether the fast path may run: pod-resources is there to reconcile after a crash,
        and it has been asked once since this agent started."""
        ...

    def record_later(self, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> None:
        """Record ``wanted`` (already in the ledger's ``promised``) right after answering."""
        ...


@dataclass(frozen=True)
class Counted:
    """What a backend's allocations and slot conflicts are counted under (bounded labels)."""

    namespace: str
    configuration: str
    kind: str

    def labels(self, world: SlotWorld) -> tuple[str, str, str, str]:
        return (self.namespace, self.configuration, world.node, self.kind)


def usable_device(world: SlotWorld, namespace: str, instance: str) -> NodeDevice:
    device = world.device(namespace, instance)
    if device is None:
        raise PluginError(FAILED, f"Instance {namespace}/{instance} is not served on this node")
    if not device.healthy:
        raise PluginError(
            FAILED,
            f"Instance {namespace}/{instance} is unhealthy on this node: {device.health.reason}",
        )
    return device


async def claim(
    world: SlotWorld, counted: Counted, namespace: str, instance: str,
    wanted: dict[str, SlotUsage],
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
        world.metrics.slot_conflicts.labels(*counted.labels(world)).inc()
        raise PluginError(FAILED, f"cannot claim {error}") from error
    except TooManyConflicts as error:
        world.metrics.slot_conflicts.labels(*counted.labels(world)).inc()
        raise PluginError(grpc.StatusCode.UNAVAILABLE, str(error)) from error
    except InstanceGone as error:
        raise PluginError(FAILED, str(error)) from error
    world.slots_changed(SlotRef(namespace, instance, slot) for slot in wanted)


def promise(world: SlotWorld, namespace: str, instance: str, wanted: dict[str, SlotUsage]) -> bool:
    """The fast path: promise ``wanted`` at once when every slot is ours to give, and have it
    recorded right after; False leaves the claim to the conditioned write.

    Ours to give: in the newest state this agent knows, this node is listed and each slot is
    free and reserved for it, or already carries ``wanted``'s usage, or is promised with it;
    and no release of its reservation, and no free of it, is in flight. docs/slots.md (C6, C7)
    says why nobody else can change such a slot, and what happens if the agent dies before
    recording. No ``await`` between judging and promising: nothing else runs in between.
    """
    if not world.answers_before_recording:
        return False
    ledger = world.ledger(namespace, instance)
    view = ledger.current(world.instance(namespace, instance))
    if view is None or world.node not in view.spec.nodes:
        return False
    to_record: dict[str, SlotUsage] = {}
    for slot, usage in wanted.items():
        if slot in ledger.releasing or slot in ledger.freeing:
            return False
        promised = ledger.promised.get(slot)
        if promised is not None:
            if promised != usage:
                return False
            continue
        if judge_claim(view, slot, usage) not in (Verdict.CLAIM, Verdict.HELD_ALREADY):
            return False
        # Held already is promised too: the recording confirms it on a fresh read (in the
        # background), in case someone outside freed it meanwhile.
        to_record[slot] = usage
    if to_record:
        ledger.promised.update(to_record)
        world.record_later(namespace, instance, to_record)
    # A new pod holds these now: the orphan sweep gives it time to show in pod-resources.
    world.slots_changed(SlotRef(namespace, instance, slot) for slot in wanted)
    return True


async def counted(
    world: SlotWorld, counted: Counted, allocation: Awaitable[list[ContainerAllocation]]
) -> list[ContainerAllocation]:
    """Await an allocation, counting it by outcome in the allocations metric and timing it."""
    started = time.perf_counter()
    try:
        answers = await allocation
    except PluginError:
        world.metrics.allocations.labels(*counted.labels(world), "refused").inc()
        world.metrics.allocate_duration.labels("refused").observe(time.perf_counter() - started)
        raise
    world.metrics.allocations.labels(*counted.labels(world), "ok").inc()
    world.metrics.allocate_duration.labels("ok").observe(time.perf_counter() - started)
    return answers


async def prepare(devices: Sequence[NodeDevice]) -> None:
    """The handler's ``prepare`` for a container's devices; a failure names the Instances."""
    first = devices[0] if devices else None
    if first is None or not isinstance(first.handler, PreparingHandler):
        return
    names = ", ".join(f"{d.namespace}/{d.instance}" for d in devices)
    try:
        await first.handler.prepare(first.details, [d.device for d in devices])
    except Exception as error:
        raise PluginError(
            grpc.StatusCode.INTERNAL, f"preparing Instance {names} failed: {error}"
        ) from error
