"""What the scheduler gave out of one shared DRA device, watched event by event, and the
hand-off figures read from it.

``ClaimRecorder`` follows the ResourceClaims and Pods of a namespace on the real API server
(list, then watch from the list's version; after any error, list again, and claims gone
meanwhile count as freed then). A namespace's watch delivers its changes in the API server's
order, so the claims held after each event are the claims held at that revision: on every
event it counts the allocation results naming the device (by driver and device name, in any
pool: one physical device published twice would be allocated twice) and flags

- more results naming the device than its capacity, or consumed ``slots`` above it;
- a result without ``consumedCapacity: {slots: "1"}`` (the device is shared only through its
  consumable capacity; without it a second claim could not share it, or would take it whole);
- a pod that failed (any ``Failed`` phase, or ``UnexpectedAdmissionError``);
- an Instance carrying any of the device-plugin protocol's slot state (a ``deviceUsage`` slot
  held, ``status.reservations``, ``status.demand``): with the scheduler as the one allocator
  no agent writes them.

It records when each claim stopped holding the device (deallocated or deleted: the slot is
free), when each pod's claim got the device, when each pod was bound and when the scheduler
first called it unschedulable, from which a test reads its hand-off times (a slot freed → the
pod that was waiting has its claim allocated and is bound: ``freed_at``, ``had_slot_at``).
Tests wait on it (``wait_for``): every event wakes the waiters, nothing polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from agent.kube.client import InstanceResource, as_dict
from crds import dra
from tests.harness.dra import ResourceClaimResource

log = logging.getLogger(__name__)

#: Pause before a failed list or watch is tried again.
WATCH_RETRY_S = 0.5
ADMISSION_ERROR = "UnexpectedAdmissionError"
ONE_SLOT = {dra.CAPACITY_SLOTS: "1"}


@dataclass
class PodTimes:
    """One pod's life as the watch saw it (``time.monotonic`` on arrival of each event)."""

    seen: float
    unschedulable: float | None = None
    bound: float | None = None
    node: str = ""
    allocated: float | None = None
    deleted: float | None = None


def claim_owner(claim: Mapping[str, Any]) -> str:
    """The pod a claim belongs to (the scheduler makes an extended resource's claim owned by
    its pod); "" for one of nobody's."""
    for ref in claim["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return str(ref.get("name", ""))
    return ""


def device_results(claim: Mapping[str, Any], device: str) -> list[Mapping[str, Any]]:
    """The claim's allocation results naming ``device`` of this driver."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [r for r in (allocation.get("devices") or {}).get("results") or []
            if r.get("driver") == dra.DRIVER and r.get("device") == device]


def _slots(result: Mapping[str, Any]) -> int:
    value = (result.get("consumedCapacity") or {}).get(dra.CAPACITY_SLOTS, "0")
    try:
        return int(value)
    except ValueError:
        return 1 << 30  # not a plain count: certainly not within any capacity


def _unschedulable(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class ClaimRecorder:
    """The claims holding ``device`` and the pods of ``namespace``, checked on every event."""

    client: AsyncClient
    namespace: str
    device: str
    capacity: int
    violations: list[str] = field(default_factory=list)
    #: claim name → (owner pod, results naming the device) while it holds the device.
    holding: dict[str, tuple[str, tuple[Mapping[str, Any], ...]]] = field(default_factory=dict)
    #: (when, claim, its pod): each time a claim stopped holding the device.
    frees: list[tuple[float, str, str]] = field(default_factory=list)
    pods: dict[str, PodTimes] = field(default_factory=dict)
    #: Most claims seen holding the device at once.
    most: int = 0
    events: int = 0
    relists: int = 0
    _claims: dict[str, dict[str, Any]] = field(default_factory=dict)
    _pod_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    _instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Instance events seen: proof that the Instance watch was live.
    instance_events: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _listed: int = 0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> ClaimRecorder:
        self._tasks = [
            asyncio.create_task(self._follow(ResourceClaimResource, self._on_claim,
                                             self._claims), name="claims"),
            asyncio.create_task(self._follow(Pod, self._on_pod, self._pod_bodies),
                                name="pods"),
            asyncio.create_task(self._follow(InstanceResource, self._on_instance,
                                             self._instances), name="instances"),
        ]
        await self.wait_for(lambda: self._listed >= len(self._tasks),
                            what="the watches listed", within=30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_for(self, predicate: Callable[[], bool], *, what: str,
                       within: float) -> None:
        """Return once ``predicate()`` holds after some event; fail naming ``what``."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(predicate), within)
            except TimeoutError:
                raise AssertionError(f"timed out after {within} s waiting for {what}; "
                                     f"holding {self.holders()}, pods "
                                     f"{self.describe_pods()}") from None

    def assert_clean(self) -> None:
        assert not self.violations, "invariants broken:\n" + "\n".join(self.violations)

    # -- what tests read ---------------------------------------------------------------------

    def holders(self) -> dict[str, str]:
        """Claim → its pod, for every claim holding the device now."""
        return {claim: pod for claim, (pod, _) in self.holding.items()}

    def bound(self, pod: str) -> bool:
        times = self.pods.get(pod)
        return times is not None and times.bound is not None and times.allocated is not None

    def waiting(self, pod: str) -> bool:
        """The scheduler has said the pod fits nowhere, and it is not bound."""
        times = self.pods.get(pod)
        return (times is not None and times.unschedulable is not None and times.bound is None
                and times.deleted is None)

    def describe_pods(self) -> str:
        return ", ".join(
            f"{name}(node={t.node or '-'} unsched={t.unschedulable is not None} "
            f"alloc={t.allocated is not None} deleted={t.deleted is not None})"
            for name, t in sorted(self.pods.items()))

    # -- watches -----------------------------------------------------------------------------

    async def _follow(self, resource: Any, on_event: Callable[[str, dict[str, Any]], None],
                      state: dict[str, dict[str, Any]]) -> None:
        while True:
            try:
                listing = self.client.list(resource, namespace=self.namespace)
                current = {}
                async for obj in listing:
                    body = as_dict(obj)
                    current[body["metadata"]["name"]] = body
                async with self._changed:
                    for name in set(state) - set(current):
                        on_event("DELETED", state[name])
                    for body in current.values():
                        on_event("MODIFIED", body)
                    self._listed += 1
                    self._changed.notify_all()
                async for kind, obj in self.client.watch(
                        resource, namespace=self.namespace,
                        resource_version=listing.resourceVersion):
                    async with self._changed:
                        on_event(kind, as_dict(obj))
                        self._changed.notify_all()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure: list and watch again
                self.relists += 1
                log.info("watch of %s: %r; listing again", resource.__name__, error)
            await asyncio.sleep(WATCH_RETRY_S)

    def _flag(self, message: str) -> None:
        if message not in self.violations:
            self.violations.append(message)
            log.error("invariant broken: %s", message)

    def _on_claim(self, kind: str, claim: dict[str, Any]) -> None:
        now = time.monotonic()
        self.events += 1
        name = claim["metadata"]["name"]
        if kind == "DELETED":
            self._claims.pop(name, None)
            results: list[Mapping[str, Any]] = []
        else:
            self._claims[name] = claim
            results = device_results(claim, self.device)
        owner = claim_owner(claim)
        if results:
            for result in results:
                if result.get("consumedCapacity") != ONE_SLOT:
                    self._flag(f"claim {name} ({owner}) holds {self.device} with "
                               f"consumedCapacity {result.get('consumedCapacity')}, not "
                               f"{ONE_SLOT}")
            if name not in self.holding and owner in self.pods:
                self.pods[owner].allocated = now
            self.holding[name] = (owner, tuple(results))
        elif name in self.holding:
            del self.holding[name]
            self.frees.append((now, name, owner))
        count = sum(len(r) for _, r in self.holding.values())
        slots = sum(_slots(r) for _, rs in self.holding.values() for r in rs)
        self.most = max(self.most, count)
        if count > self.capacity or slots > self.capacity:
            self._flag(f"{count} allocations ({slots} slots) of {self.device} at once, "
                       f"capacity {self.capacity}: {self.holders()}")

    def _on_instance(self, kind: str, instance: dict[str, Any]) -> None:
        self.instance_events += 1
        name = instance["metadata"]["name"]
        if kind == "DELETED":
            self._instances.pop(name, None)
            return
        self._instances[name] = instance
        found = slot_state(instance)
        if found:
            self._flag(f"Instance {name} carries device-plugin slot state: {found}")

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        times = self.pods.setdefault(name, PodTimes(seen=now))
        if kind == "DELETED":
            self._pod_bodies.pop(name, None)
            if times.deleted is None:
                times.deleted = now
            return
        self._pod_bodies[name] = pod
        if pod["metadata"].get("deletionTimestamp") and times.deleted is None:
            times.deleted = now
        node = pod["spec"].get("nodeName") or ""
        if node and times.bound is None:
            times.bound, times.node = now, node
        if times.unschedulable is None and not node and _unschedulable(pod):
            times.unschedulable = now
        if times.allocated is None and any(owner == name for owner, _ in
                                           self.holding.values()):
            times.allocated = now
        status = pod.get("status") or {}
        if status.get("phase") == "Failed" or status.get("reason") == ADMISSION_ERROR:
            self._flag(f"pod {name} failed: {status.get('reason')} {status.get('message')}")


def slot_state(instance: Mapping[str, Any]) -> dict[str, Any]:
    """The device-plugin protocol's slot state an Instance carries: held ``deviceUsage``
    slots, ``reservations`` and ``demand`` (empty: none)."""
    spec, status = instance.get("spec") or {}, instance.get("status") or {}
    found: dict[str, Any] = {}
    held = {k: v for k, v in (spec.get("deviceUsage") or {}).items() if v}
    if held:
        found["deviceUsage"] = held
    for key in ("reservations", "demand"):
        if status.get(key):
            found[key] = status[key]
    return found


def freed_at(recorder: ClaimRecorder, pod: str) -> float | None:
    """When the claim of ``pod`` stopped holding the device (None: it still holds it)."""
    return next((t for t, _, owner in recorder.frees if owner == pod), None)


def had_slot_at(recorder: ClaimRecorder, pod: str) -> float | None:
    """When ``pod`` had its slot: its claim allocated the device and itself bound."""
    times = recorder.pods.get(pod)
    if times is None or times.allocated is None or times.bound is None:
        return None
    return max(times.allocated, times.bound)


def summary(figures: list[float]) -> str:
    if not figures:
        return "none"
    return (f"n={len(figures)} median {statistics.median(figures):.3f} s, "
            f"max {max(figures):.3f} s")
